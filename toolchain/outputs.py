"""Where a command writes: never over its own inputs, and one run per output at a time.

- `check_no_overlap`: an output equal to an input, inside an input directory, or containing an input
  (a directory output that would be created or replaced around it) is refused, `--force` included
  (`train --program p --adapter-out p --force` used to replace the program by an adapter). Paths are
  compared after resolving symlinks and `..`, so `./p/../p` or a link to `p` are `p`. The CLI runs it on
  every command's path options before the command body (`toolchain/cli/__init__.py`).
- `output_target`: the one rule for an output path that is a symbolic link, for every output option (`--out`,
  `--json`, `--adapter-out`, `--telemetry-out`, `--db`, ...): the link is written through and kept. A link to a
  regular file (or directory) has its target replaced atomically, as a plain path would be; a link to nothing
  yet creates its target; `--telemetry-out` appends to the target. Refused, before any work: a link loop, a
  link to a FIFO, socket or device (`toolchain.atomic.check_regular_output`; a character device is taken by
  `--telemetry-out`), and a link to an open file descriptor (`/dev/stdout`, `/dev/fd/N`, `/proc/<pid>/fd/N`),
  which an atomic replace would never reach (the descriptor keeps the old file); `--telemetry-out`, which
  appends, takes that one too.
- `run_lock`: an exclusive `fcntl.flock` on `<output>.lock`, held for a run's lifetime; a second run
  on the same output is refused at once (it does not wait). The lock file is removed by its holder on the
  way out; a killed holder leaves it, unlocked, and the next run takes it over (the kernel drops the lock
  of a dead process, so a stale file never blocks anyone).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from toolchain.errors import BadInput, OutputExists

__all__ = ["OutputOverlap", "OutputLocked", "check_no_overlap", "run_lock", "lock_path", "output_target"]


class OutputOverlap(OutputExists):
    """An output would replace, or be written inside, one of the command's own inputs."""


class OutputLocked(BadInput):
    """Another run holds the lock of this output."""


_DESCRIPTOR_DIRS = ("/proc/", "/dev/fd/")
_DESCRIPTOR_LINKS = ("/dev/stdout", "/dev/stderr", "/dev/stdin")
_MAX_LINKS = 40          # the kernel's own limit on links followed in one lookup (ELOOP beyond it)


def output_target(path: Path, *, option: str = "output", streams: bool = False) -> Path:
    """Where an output at `path` is written (see the module docstring): `path` itself (absolute) when it is not a
    symbolic link, else the link's final target (absolute), the link itself left as it is.

    Raises:
        OutputExists: a link loop, or (unless `streams`) a link to an open file descriptor.
    """
    cur = Path(os.path.abspath(path))
    for _ in range(_MAX_LINKS):
        if not cur.is_symlink():
            return cur
        target = os.readlink(cur)
        nxt = Path(os.path.normpath(os.path.join(cur.parent, target)))
        if not streams and (str(nxt).startswith(_DESCRIPTOR_DIRS) or str(nxt) in _DESCRIPTOR_LINKS):
            raise OutputExists(f"{option} {path} is a symbolic link to an open file descriptor ({nxt}); an output "
                               f"is replaced atomically, which would never reach it: give a file path")
        # a link inside a linked directory: resolve the directories, keep the last component
        cur = Path(os.path.realpath(nxt.parent)) / nxt.name
    raise OutputExists(f"{option} {path} is a symbolic link loop (it never reaches a file); fix or remove the link")


def _real(path: Path) -> Path:
    return Path(os.path.realpath(os.path.abspath(path)))


def _relation(out: Path, inp: Path) -> str | None:
    if out == inp:
        return "is"
    if out.is_relative_to(inp):
        return "is inside"
    if inp.is_relative_to(out):
        return "contains"
    return None


def check_no_overlap(outputs: Iterable[tuple[str, Path]], inputs: Iterable[tuple[str, Path]]) -> None:
    """Refuse an output that is, is inside, or contains an input or another output.

    Args:
        outputs: (option, path) of what the command writes (including derived files, e.g. a checkpoint).
        inputs: (option, path) of what it reads.

    Raises:
        OutputOverlap: the first overlap, naming both options; --force does not lift it.
    """
    outs = [(opt, Path(p), _real(p)) for opt, p in outputs if p is not None]
    ins = [(opt, Path(p), _real(p)) for opt, p in inputs if p is not None]
    for i, (o_opt, o_path, o_real) in enumerate(outs):
        others = ins + [x for j, x in enumerate(outs) if j != i]
        for i_opt, i_path, i_real in others:
            if i_opt == o_opt and i_real == o_real:
                continue                     # one option that is both read and written (--db)
            rel = _relation(o_real, i_real)
            if rel is not None:
                what = "is the same path as" if rel == "is" else rel
                raise OutputOverlap(f"{o_opt} {o_path} {what} {i_opt} {i_path}; an output may never replace or "
                                    f"be written into an input (--force included): choose another {o_opt}")


def lock_path(output: Path) -> Path:
    """The lock file of a run writing `output` (a sibling: `<output>.lock`)."""
    return Path(str(output).rstrip("/") + ".lock")


@contextlib.contextmanager
def run_lock(output: Path, *, option: str = "--adapter-out", lock_file: Path | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of `output` (in `lock_file`, default `lock_path(output)`) until the block exits.

    Raises:
        OutputLocked: another live process holds it (the message gives its pid when known).
    """
    import fcntl

    path = Path(lock_file) if lock_file is not None else lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise OutputLocked(f"{option} {output} is in use by another run"
                               f"{f' (pid {holder})' if holder.isdigit() else ''} (lock {path}); wait for it to "
                               f"finish or choose another {option}") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)                         # the previous holder removed the file between our open and lock
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)                  # while still locked: nobody can hold this inode after us
        os.close(fd)
