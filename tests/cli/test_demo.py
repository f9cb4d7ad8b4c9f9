"""`toolchain demo`: runs end to end on the tiny preset."""

from __future__ import annotations

import math

from click.testing import CliRunner

from toolchain.cli import cli


def test_demo_three_steps():
    result = CliRunner().invoke(cli, ["demo", "--steps", "3"])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("step")]
    assert len(lines) == 3
    losses = [float(ln.split()[-1]) for ln in lines]
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(264)) < 1.0  # random init: about uniform over the byte vocabulary


def test_demo_rejects_zero_steps():
    result = CliRunner().invoke(cli, ["demo", "--steps", "0"])
    assert result.exit_code == 2 and "Error" in result.stderr
