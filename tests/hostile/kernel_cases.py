"""The native kernel cache and the bus-error handler as hostile rows (issue 45, item 5).

Two kinds of row, each run against a private cache ($TOOLCHAIN_KERNEL_CACHE = a temporary directory) seeded
with a copy of this host's good build and its sha256 record:

- `rebuilt`: the damaged entry (truncated, another library, a directory, FIFO or link loop at its path, a
  missing or wrong record) must be cleared and rebuilt: `kernel_library()` returns a regular file whose bytes
  are the good build's and whose record is their sha256, nothing is left beside them (no `.stale-*`, no
  `.build-*`), and no file outside the cache changes. The compiler is replaced by a copy of the good build
  (`_compile` patched): the clearing and recording are what is tried here; the compile itself is
  tests/native/test_kernels.py's.
- `error`: what cannot be rebuilt away (a record damaged to match the damaged library, a library lacking an
  entry point, an entry whose directory lies outside the cache) or a bus error while running: a child process
  (loading registers kernels, once per process) must end with exit 2 and one `Error:` line containing `expect`
  (the cache path and how to clear it, or the file that faulted), no traceback.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

LIB = "libtoolchain_kernels.so"


@dataclass(frozen=True)
class KCase:
    id: str
    what: str                                   # the hostile cache state or fault, in words
    damage: Callable[[KWork], None]             # breaks the seeded cache (or the files the child maps)
    expect: str                                 # "rebuilt", or a substring of the one Error line
    child: str = "load"                         # error rows: the child's script (CHILDREN)


class KWork:
    """A private cache holding a copy of the good build, and a user's directory outside it."""

    def __init__(self, root: Path, good: Path):
        self.root, self.good = root, good
        self.cache = root / "cache"
        self.entry = self.cache / good.parent.name
        self.lib = self.entry / LIB
        self.record = self.entry / (LIB + ".sha256")
        self.user = root / "user"
        self.user.mkdir()
        (self.user / "mine.txt").write_text("the user's file\n")
        self.entry.mkdir(parents=True)
        shutil.copy2(good, self.lib)
        self.record.write_text(sha(good) + "\n")

    def replace_lib(self, content: bytes, *, forge: bool = False) -> None:
        self.lib.write_bytes(content)
        if forge:
            self.record.write_text(hashlib.sha256(content).hexdigest() + "\n")

    def clear_lib(self) -> None:
        self.lib.unlink()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _other_library() -> bytes:
    import _ctypes
    return Path(_ctypes.__file__).read_bytes()


def _another_other_library() -> bytes:
    import _socket
    return Path(_socket.__file__).read_bytes()


def _protocol_only_library(w: KWork) -> bytes:
    """A library with the loader's protocol symbol but none of the table's entry points."""
    src = w.root / "p.c"
    src.write_text('const char *toolchain_kernel_path_error(void) { return 0; }\n')
    subprocess.run([os.environ.get("CC") or "cc", "-shared", "-fPIC", str(src), "-o", str(w.root / "p.so")],
                   check=True, capture_output=True, timeout=120)
    data = (w.root / "p.so").read_bytes()
    (w.root / "p.so").unlink()
    src.unlink()
    return data


def _dir_at_lib(w: KWork, *, full: bool) -> None:
    w.clear_lib()
    w.lib.mkdir()
    if full:
        (w.lib / "sub").mkdir()
        (w.lib / "sub" / "x.so").write_bytes(b"not a library")
        (w.lib / "outside").symlink_to(w.user)          # removing the entry must not follow this link


def _fifo_at_lib(w: KWork) -> None:
    w.clear_lib()
    os.mkfifo(w.lib)


def _socket_at_lib(w: KWork) -> None:
    w.clear_lib()
    s, cwd = socket.socket(socket.AF_UNIX), os.getcwd()
    try:
        os.chdir(w.entry)                      # a relative name: the absolute path is longer than sun_path
        s.bind(LIB)
    finally:
        os.chdir(cwd)
        s.close()


def _loop_at_lib(w: KWork) -> None:
    w.clear_lib()
    w.lib.symlink_to(w.lib.name)


def _link_to_user_file(w: KWork) -> None:
    """A symbolic link from the cache to a user's copy of the good build: the link goes, the user's file stays."""
    shutil.copy2(w.good, w.user / "my.so")
    w.clear_lib()
    w.lib.symlink_to(w.user / "my.so")


def _entry_outside_cache(w: KWork) -> None:
    """The entry's directory is a link to a user's directory holding a truncated library: refused, untouched."""
    shutil.copytree(w.entry, w.user / "entry")
    (w.user / "entry" / LIB).write_bytes(w.good.read_bytes()[:4096])
    shutil.rmtree(w.entry)
    w.entry.symlink_to(w.user / "entry")


def kcases() -> list[KCase]:
    c = KCase
    half = lambda w: w.good.read_bytes()[: w.good.stat().st_size // 2]   # noqa: E731
    return [
        # ---- rebuilt: the entry is not the recorded build
        c("kcache-truncated-half", "the cached library cut in half (reported as a weights.safetensors bus error)",
          lambda w: w.replace_lib(half(w)), "rebuilt"),
        c("kcache-truncated-empty", "the cached library truncated to 0 bytes",
          lambda w: w.replace_lib(b""), "rebuilt"),
        c("kcache-other-library", "another library (_ctypes.so) in its place (AttributeError traceback)",
          lambda w: w.replace_lib(_other_library()), "rebuilt"),
        c("kcache-other-library-2", "another library (_socket.so) in its place",
          lambda w: w.replace_lib(_another_other_library()), "rebuilt"),
        c("kcache-dir-empty", "an empty directory where the library should be (refused valid input)",
          lambda w: _dir_at_lib(w, full=False), "rebuilt"),
        c("kcache-dir-full", "a directory holding files and a link to the user's directory where the library should be",
          lambda w: _dir_at_lib(w, full=True), "rebuilt"),
        c("kcache-fifo", "a FIFO where the library should be", _fifo_at_lib, "rebuilt"),
        c("kcache-socket", "a socket where the library should be", _socket_at_lib, "rebuilt"),
        c("kcache-link-loop", "a symbolic link loop where the library should be", _loop_at_lib, "rebuilt"),
        c("kcache-link-to-user-file", "a symbolic link to a user's file where the library should be (the link goes, "
          "the file stays)", _link_to_user_file, "rebuilt"),
        c("kcache-record-missing", "the library without its sha256 record (a build from before records)",
          lambda w: w.record.unlink(), "rebuilt"),
        c("kcache-record-mismatch", "a record holding another hash (one byte of the library changed)",
          lambda w: w.replace_lib(w.good.read_bytes()[:-1] + bytes([w.good.read_bytes()[-1] ^ 1])), "rebuilt"),
        c("kcache-record-garbage", "a record that is not a hash (binary bytes)",
          lambda w: w.record.write_bytes(b"\xff\xfe" * 40), "rebuilt"),
        c("kcache-record-dir", "a directory where the record should be",
          lambda w: (w.record.unlink(), w.record.mkdir()), "rebuilt"),
        c("kcache-entry-dir-is-file", "a file where the entry's directory should be",
          lambda w: (shutil.rmtree(w.entry), w.entry.write_bytes(b"x")), "rebuilt"),
        c("kcache-entry-dir-loop", "a symbolic link loop where the entry's directory should be",
          lambda w: (shutil.rmtree(w.entry), w.entry.symlink_to(w.entry.name)), "rebuilt"),
        # ---- error: what a rebuild cannot clear, one line naming the cache path and how to clear it
        c("kcache-entry-outside-cache", "the entry's directory a link to a user's directory holding a truncated "
          "library (never touched)", _entry_outside_cache, "not touching it", child="load"),
        c("kcache-entry-link-to-empty-user-dir", "the entry's directory a link to a user's empty directory (never "
          "written into)", lambda w: (shutil.rmtree(w.entry), (w.user / "empty").mkdir(),
                                      w.entry.symlink_to(w.user / "empty")), "not touching it", child="load"),
        c("kcache-truncated-forged-record", "the library truncated to 4 KiB and its record forged to match "
          "(dlopen fails or faults)", lambda w: w.replace_lib(w.good.read_bytes()[:4096], forge=True),
          "rm -r", child="load"),
        c("kcache-truncated-mid-forged-record", "the library cut in half and its record forged to match",
          lambda w: w.replace_lib(half(w), forge=True), "rm -r", child="load"),
        c("kcache-other-library-forged-record", "another library in its place, record forged (AttributeError)",
          lambda w: w.replace_lib(_other_library(), forge=True), "is not this toolchain's", child="load"),
        c("kcache-missing-entry-point", "a library with the loader's protocol but no entry point of the table, "
          "record forged", lambda w: w.replace_lib(_protocol_only_library(w), forge=True), "has no entry point",
          child="load"),
        # ---- bus errors: the line names the file that faulted
        c("sigbus-kernel-library", "the loaded kernel library truncated by another process, then called "
          "(was named weights.safetensors)", lambda w: None, "the kernel library", child="sigbus-kernel"),
        c("sigbus-kernel-library-weights-guarded", "the same under a training run's guard (its weights and "
          "checkpoint note installed)", lambda w: None, "the kernel library", child="sigbus-kernel-note"),
        c("sigbus-weights", "the guarded weights file truncated while mapped, with the kernel library loaded",
          lambda w: None, "w.safetensors was truncated", child="sigbus-weights"),
        c("sigbus-other-file", "another mapped file (not the guarded one) truncated while mapped",
          lambda w: None, "other.bin was truncated", child="sigbus-other"),
    ]


_PRELUDE = """
import os, sys
import numpy as np
from toolchain.errors import ToolchainError
from toolchain.runtime import mapped_guard
open("w.safetensors", "wb").write(b"\\1" * (1 << 20))
open("other.bin", "wb").write(b"\\1" * (1 << 20))
weights = np.memmap("w.safetensors", dtype=np.uint8, mode="r")
other = np.memmap("other.bin", dtype=np.uint8, mode="r")
mapped_guard.install("w.safetensors")
from toolchain.mesp.kernels import load_native_kernels
from toolchain.native import build
try:
    lib = load_native_kernels()
except ToolchainError as e:
    print(f"Error: {e}", file=sys.stderr)
    sys.exit(2)
"""
CHILDREN = {
    "load": "print('loaded')\n",
    "sigbus-kernel": "os.truncate(build._LOADED_PATH, 4096)\nprint(build.kernel_path())\n",
    "sigbus-kernel-note": "mapped_guard.set_note('the checkpoint of step 3 is at ck')\n"
                          "os.truncate(build._LOADED_PATH, 4096)\n"
                          "print(build.kernel_path())\n",
    "sigbus-weights": "os.truncate('w.safetensors', 4096)\nprint(int(weights[-1]))\n",
    "sigbus-other": "os.truncate('other.bin', 4096)\nprint(int(other[-1]))\n",
}


class KOutcome(NamedTuple):
    ok: bool
    summary: str          # what happened, one line (docs/reliability.md)
    detail: str           # why not, when not ok


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): "link" if p.is_symlink() else "dir" if p.is_dir() else
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


def run_kcase(case: KCase, good: Path, root: Path, monkeypatch) -> KOutcome:
    """Seed a cache under `root`, damage it, run the case; whether it ended as required."""
    from toolchain.native import build

    w = KWork(root, good)
    case.damage(w)
    user_before = _snapshot(w.user)
    if case.expect == "rebuilt":
        monkeypatch.setenv("TOOLCHAIN_KERNEL_CACHE", str(w.cache))
        monkeypatch.setattr(build, "_compile", lambda cmd, cxx: shutil.copyfile(good, cmd[cmd.index("-o") + 1]))
        try:
            got = build.kernel_library()
        except Exception as e:   # noqa: BLE001 - reported as the row's failure
            return KOutcome(False, f"{type(e).__name__}: {e}", "raised")
        finally:
            monkeypatch.undo()
        problems = []
        if got != w.lib or w.lib.is_symlink() or not w.lib.is_file() or sha(w.lib) != sha(good):
            problems.append("the library is not the good build")
        if not w.record.is_file() or w.record.read_text().strip() != sha(good):
            problems.append("the record is not its sha256")
        left = sorted(p.name for p in w.entry.iterdir() if p.name not in (LIB, LIB + ".sha256"))
        if left:
            problems.append(f"left beside it: {left}")
        if _snapshot(w.user) != user_before:
            problems.append("the user's files changed")
        return KOutcome(not problems, "rebuilt: the good build and its record, nothing left", "; ".join(problems))
    env = {**os.environ, "TOOLCHAIN_KERNEL_CACHE": str(w.cache), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env.pop("TOOLCHAIN_KERNEL_PATH", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), env["PYTHONPATH"]) if p)
    work = root / "run"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_PRELUDE) + CHILDREN[case.child]], cwd=work,
                          capture_output=True, text=True, timeout=300, env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    problems = []
    if proc.returncode != 2:
        problems.append(f"exit {proc.returncode}")
    if "Traceback" in proc.stderr:
        problems.append("traceback")
    if len(errors) != 1 or case.expect not in errors[0]:
        problems.append(f"stderr: {proc.stderr.strip()[-600:]}")
    elif case.child == "load" and (str(w.cache) not in errors[0] or "rm -r" not in errors[0]):
        problems.append("the line does not name the cache path and how to clear it")
    if case.child == "sigbus-kernel-note" and "the checkpoint of step 3 is at ck" not in proc.stderr:
        problems.append("the note is missing")
    if _snapshot(w.user) != user_before:
        problems.append("the user's files changed")
    line = errors[0] if errors else "(none)"
    return KOutcome(not problems, f"exit {proc.returncode}: {line.replace(str(root), '…')}", "; ".join(problems))


def good_build() -> Path:
    """This host's build, from the default cache (built now if needed), loaded by no one here."""
    from toolchain.native import build

    return build.kernel_library()


KCASES = kcases()
