"""Run one hostile case and report what happened (used by the test and by render_table.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import NamedTuple

from cases import Case, Work
from click.testing import CliRunner

from toolchain.cli import cli


class Outcome(NamedTuple):
    code: int
    errors: list[str]          # the stderr lines starting with "Error:"
    traceback: bool
    left: list[str]            # new paths in the work directory
    lost: list[str]            # pre-existing paths gone
    changed: list[str]         # pre-existing files whose content changed (beyond case.may_change)
    stderr: str


def export_tiny_program(out: Path) -> Path:
    """The tiny preset exported once (ExecuTorch, T=32, int4): the program the cases corrupt."""
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.models import get_preset, random_weights
    from toolchain.program.spec import QuantSpec

    arch, cfg = get_preset("tiny"), LoraConfig(rank=4, alpha=8)
    spec = ExportSpec(source="tiny", init="random", seed=0, seq_len=32, quant=QuantSpec("int4", 64),
                      tokenizer_kind="byte", pad_token_id=258)
    export_program(arch, random_weights(arch, seed=0), cfg, init_lora(arch, cfg, seed=0), spec, out)
    return out


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under `root` with a digest of its content."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "special" for p in sorted(root.rglob("*"))}   # FIFOs, sockets: never read


def _invoke(case: Case, w: Work, argv: list[str], monkeypatch) -> tuple[int, str, str]:
    if case.subprocess:
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("TOOLCHAIN_VERBOSE", None)
        proc = subprocess.run([sys.executable, "-m", "toolchain", *argv], cwd=w.path, capture_output=True, text=True,
                              timeout=300, env=env, preexec_fn=case.preexec)
        return proc.returncode, proc.stdout, proc.stderr
    if case.patch is not None:
        case.patch(monkeypatch)
    result = CliRunner().invoke(cli, argv, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(result.exception))
        return 1, result.stdout, result.stderr + "\nTraceback (in process)\n" + tb
    return result.exit_code, result.stdout, result.stderr


def run_case(case: Case, program: Path, work: Path, monkeypatch) -> Outcome:
    """Build the case's inputs in `work` (also the current directory), run it, compare `work` before/after."""
    w = Work(work, program)
    monkeypatch.chdir(work)
    try:
        argv = case.setup(w)
        before = snapshot(work)
        code, out, err = _invoke(case, w, argv, monkeypatch)
    finally:
        monkeypatch.undo()
        if hasattr(w, "keep"):
            w.keep.close()
    for suffix in ("-wal", "-shm"):               # SQLite's side files of a database it opened
        (work / f"t.sqlite3{suffix}").unlink(missing_ok=True)
    after = snapshot(work)
    if case.check is not None:
        case.check(w)
    return Outcome(code, [line for line in err.splitlines() if line.startswith("Error:")],
                   "Traceback" in err + out, sorted(set(after) - set(before) - set(case.may_leave)),
                   sorted(set(before) - set(after)),
                   [p for p in before if p in after and before[p] != after[p] and p not in case.may_change], err)
