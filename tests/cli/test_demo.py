"""`toolchain demo`: exports the tiny preset (contract v3: the layer-generic methods, exported once
whatever the layer count, so this takes seconds) and trains it on the ExecuTorch runtime with LCSB."""

from __future__ import annotations

import math

from click.testing import CliRunner

from toolchain.cli import cli


def test_demo_exports_and_trains(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(cli, ["demo", "--steps", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("step")]
    assert len(lines) == 4
    assert [ln.split()[3] for ln in lines] == ["0,1,2,3", "4,5,6,7"] * 2  # LCSB: the layers alternate
    losses = [float(ln.split()[5]) for ln in lines]
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(264)) < 1.0  # random init: about uniform over the byte vocabulary
    assert "peak anonymous memory" in result.stdout
    assert (out / "manifest.json").is_file() and (tmp_path / "demo.telemetry.jsonl").is_file()


def test_demo_rejects_zero_steps():
    result = CliRunner().invoke(cli, ["demo", "--steps", "0"])
    assert result.exit_code == 2 and "Error" in result.stderr
