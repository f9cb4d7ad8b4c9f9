"""Faults the hostile table cannot express as one command (issue 27): a mapped file that shrinks under a
running process (the handler itself, and the step-boundary stop), file-size limits on the commands that
write several files, broken stdout, runs killed mid-write, two runs on one output, a .pte of another
program. Each runs the real thing (child processes, real signals and rlimits)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYTHON = sys.executable


def _toolchain(args: list[str], cwd: Path, *, fsize: int | None = None, shell_suffix: str | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m toolchain ARGS` in `cwd`, under RLIMIT_FSIZE when given (or with `shell_suffix` in bash)."""
    def limits() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = {**os.environ, "COLUMNS": "200"}
    env.pop("TOOLCHAIN_VERBOSE", None)
    if shell_suffix is not None:
        cmd = " ".join([PYTHON, "-m", "toolchain", *args]) + " " + shell_suffix
        return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return subprocess.run([PYTHON, "-m", "toolchain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=limits)


def _one_error(proc: subprocess.CompletedProcess, expect: str) -> None:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and expect in errors[0], proc.stderr


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ------------------------------------------------------------------------------- mapped weights file

def test_a_bus_error_on_a_mapped_file_is_one_error_line(tmp_path: Path) -> None:
    """The SIGBUS handler itself, deterministically: map, truncate, read (in torch's native code)."""
    script = textwrap.dedent("""
        import os, numpy as np, torch
        from toolchain.runtime import mapped_guard
        open("w.bin", "wb").write(b"\\1" * (1 << 20))
        t = torch.from_numpy(np.memmap("w.bin", dtype=np.uint8, mode="r").view(np.float32))
        mapped_guard.install("w.bin"); mapped_guard.set_note("the checkpoint of step 3 is at ck")
        open("lock", "w").close(); mapped_guard.remove_on_fault("lock")
        os.truncate("w.bin", 4096)
        print(float(t.sum()))
    """)
    proc = subprocess.run([PYTHON, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    _one_error(proc, "w.bin was truncated or replaced while memory-mapped")
    assert "the checkpoint of step 3 is at ck" in proc.stderr and not (tmp_path / "lock").exists()
    assert proc.stdout == ""


def test_a_changed_weights_file_stops_at_the_step_boundary_with_a_checkpoint(tiny_program: Path, tmp_path: Path):
    from toolchain.text.dataset import load_examples
    from toolchain.errors import BadInput
    from toolchain.program import ProgramDir
    from toolchain.runtime.program_runtime import open_runtime
    from toolchain.training import ProgramTrainer, TrainRun
    from toolchain.training.checkpoint import load_checkpoint

    prog = tmp_path / "prog"
    shutil.copytree(tiny_program, prog)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [256, *b"row %d of bytes" % i]}) + "\n" for i in range(3)))
    pdir = ProgramDir(prog)
    ck = tmp_path / "ck.safetensors"
    trainer = ProgramTrainer(pdir, open_runtime(pdir), load_examples(data, pdir.arch),
                             TrainRun(steps=10, lr=1e-3, checkpoint=ck, checkpoint_every=100))

    def touch_after_two(entry) -> None:
        if entry.step == 2:        # rewritten in place: same size, newer mtime (a shrink would SIGBUS instead)
            st = os.stat(pdir.weights_file)
            os.utime(pdir.weights_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    with pytest.raises(BadInput, match=r"stopped before step 3: .*weights.safetensors was modified.*checkpoint of "
                                       r"step 2"):
        trainer.run(on_step=touch_after_two)
    assert load_checkpoint(ck).step == 2


# ------------------------------------------------------------------------------- file-size limit (EFBIG)

@pytest.mark.parametrize("command", ["data", "train"])   # tokenize: a row of cases.py
def test_a_file_size_limit_is_one_error_and_leaves_nothing(command: str, tiny_program: Path, tmp_path: Path):
    text = tmp_path / "big.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 3000)     # 132 KB
    args = {"data": ["data", "--program", str(tiny_program), "--text", "big.txt", "--out", "rows.jsonl"],
            "train": ["train", "--model", "tiny", "--init", "random", "--steps", "1", "--data", "rows.jsonl",
                      "--adapter-out", "ad"]}[command]
    if command == "train":
        (tmp_path / "rows.jsonl").write_text(json.dumps({"input_ids": [256, *b"hello world"]}) + "\n")
    before = _files(tmp_path)
    proc = _toolchain(args, tmp_path, fsize=64 * 1024)
    _one_error(proc, "File too large")
    assert _files(tmp_path) == before, "output or temporary left behind"


def test_export_under_a_file_size_limit_leaves_nothing(tmp_path: Path) -> None:
    proc = _toolchain(["export", "--model", "tiny", "--init", "random", "--seq-len", "8", "--out", "o"], tmp_path,
                      fsize=64 * 1024)
    _one_error(proc, "File too large")
    assert _files(tmp_path) == []


# ------------------------------------------------------------------------------- stdout closed or broken

def test_broken_stdout_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("hello world " * 50_000)                   # ~2.4 MB of ids on stdout
    proc = _toolchain(["tokenize", "--tokenizer", "byte", "t.txt"], tmp_path,
                      shell_suffix="| head -c 10 >/dev/null; exit ${PIPESTATUS[0]}")
    _one_error(proc, "broken pipe")


# ------------------------------------------------------------------------------- leftovers of killed runs

def test_temporaries_of_a_killed_run_are_removed_by_the_next_run(tmp_path: Path) -> None:
    """A writer killed with SIGKILL (no handler runs) leaves its temporary; the next write of that output
    removes it, and leaves the temporaries of live processes alone."""
    script = textwrap.dedent("""
        import sys, time
        from toolchain.atomic import atomic_dir
        with atomic_dir(sys.argv[1]) as tmp:
            (tmp / "part").write_text("half")
            print("ready", flush=True)
            time.sleep(600)
    """)
    child = subprocess.Popen([PYTHON, "-c", script, "o"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    live = subprocess.Popen([PYTHON, "-c", script, "o"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert live.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = [p for p in os.listdir(tmp_path) if p.startswith(f".o.{child.pid}.")]
    assert left, "the killed writer left no temporary to clean"

    from toolchain.atomic import atomic_dir

    with atomic_dir(tmp_path / "o") as tmp:
        (tmp / "done").write_text("whole")
    names = sorted(os.listdir(tmp_path))
    live.kill()
    live.wait()
    assert not [n for n in names if n.startswith(f".o.{child.pid}.")]
    assert [n for n in names if n.startswith(f".o.{live.pid}.")], "a live writer's temporary was removed"


def test_a_second_train_on_the_same_adapter_out_is_refused_at_once(tmp_path: Path) -> None:
    from toolchain.errors import BadInput
    from toolchain.outputs import run_lock

    with run_lock(tmp_path / "ad", lock_file=tmp_path / "ad.lock") as held:
        assert held.read_text().strip() == str(os.getpid())
        with pytest.raises(BadInput, match="in use by another run"), run_lock(tmp_path / "ad",
                                                                                lock_file=tmp_path / "ad.lock"):
            pass
        assert held.exists()
    assert not (tmp_path / "ad.lock").exists()
    with run_lock(tmp_path / "ad", lock_file=tmp_path / "ad.lock"):   # free again
        pass


# ------------------------------------------------------------------------------- a .pte of another program

def test_a_pte_whose_methods_differ_from_the_manifest_is_refused(tiny_program: Path) -> None:
    """`check_signatures` on the real runtime's metadata, with methods swapped as in a .pte of another
    program (same method names, other signatures)."""
    from toolchain.errors import BadInput
    from toolchain.program import ProgramDir
    from toolchain.runtime.program_runtime import check_signatures, open_runtime, role_methods

    pdir = ProgramDir(tiny_program)
    runtime = open_runtime(pdir, "executorch", use="eval")
    methods = role_methods(pdir, "eval")
    check_signatures(pdir, runtime.program, methods)          # its own .pte: accepted

    class Other:
        def metadata(self, name: str):
            return runtime.program.metadata(methods[(methods.index(name) + 1) % len(methods)])

    with pytest.raises(BadInput, match="is not this program's"):
        check_signatures(pdir, Other(), methods)


def test_overlap_is_judged_on_resolved_paths(tmp_path: Path) -> None:
    from toolchain.outputs import OutputOverlap, check_no_overlap

    (tmp_path / "prog").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "prog")
    for out, words in ((tmp_path / "link", "is the same path as"), (tmp_path / "link" / "x", "is inside"),
                       (tmp_path / "prog" / ".." / "prog", "is the same path as"), (tmp_path, "contains")):
        with pytest.raises(OutputOverlap, match=words):
            check_no_overlap([("--out", out)], [("--program", tmp_path / "prog")])
    with pytest.raises(OutputOverlap, match="--held-out-out"):
        check_no_overlap([("--out", tmp_path / "a"), ("--held-out-out", tmp_path / "a")], [])
    check_no_overlap([("--out", tmp_path / "progress")], [("--program", tmp_path / "prog")])   # a prefix is not inside
