"""Third-party noise: a command prints its answer (or its one error line) first. torch/torchao warnings
and ExecuTorch's native cpuinfo lines are hidden unless `toolchain --verbose` / TOOLCHAIN_VERBOSE=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROWS = "".join(json.dumps({"input_ids": [256, *b"quiet please"]}) + "\n" for _ in range(2))


def _train(tiny_program, tmp_path, *flags):
    (tmp_path / "d.jsonl").write_text(ROWS)
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLCHAIN_VERBOSE", "TORCH_LOGS", "PYTHONWARNINGS")}
    return subprocess.run([sys.executable, "-m", "toolchain", *flags, "train", "--program", str(tiny_program),
                           "--data", "d.jsonl", "--steps", "1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)


def test_a_command_prints_nothing_but_its_own_lines(tiny_program, tmp_path):
    proc = _train(tiny_program, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", repr(proc.stderr)        # not even a newline (rich's bar is off the terminal)
    assert proc.stdout.startswith("step ")


@pytest.mark.slow
def test_verbose_shows_the_native_lines(tiny_program, tmp_path):
    proc = _train(tiny_program, tmp_path, "--verbose")
    assert proc.returncode == 0, proc.stderr
    assert "cpuinfo" in proc.stderr
