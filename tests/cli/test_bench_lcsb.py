"""`toolchain bench lcsb` on the tiny preset: the report's keys, that both arms saw the same data from
the same start, and bad input -> exit 2 without a file. (The default configuration's numbers are in
docs/lcsb.md; this test does not time anything.)"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.schemas import validation_errors

ARGS = ["bench", "lcsb", "--model", "tiny", "--steps", "10", "--seq-len", "64", "--k", "2", "--lr", "1e-2",
        "--pretrain-steps", "4"]


def test_bench_lcsb_writes_a_report_with_speedup_and_loss_gap(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, [*ARGS, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert validation_errors("bench_lcsb", report) == []
    assert report["speedup"] > 0 and isinstance(report["loss_gap"], float)
    full, lcsb = report["losses_full"], report["losses_lcsb"]
    assert len(full) == len(lcsb) == 10
    assert full[0] == lcsb[0] == report["initial_loss"]  # same start, same first example
    assert full[1:] != lcsb[1:]                           # ... then the arms differ
    tail = report["tail_steps"]
    gap = sum((b - a) / a for a, b in zip(full[-tail:], lcsb[-tail:])) / tail
    assert report["loss_gap"] == pytest.approx(gap)
    cfg = report["config"]
    assert (cfg["model"], cfg["steps"], cfg["seq_len"], cfg["k"], cfg["lr"]) == ("tiny", 10, 64, 2, 1e-2)
    # the default policy, anchored: the top k - 1 layers every step plus one of the others in turn
    assert cfg["plan"]["policy"] == "anchored" and cfg["plan"]["phases"] == [[i, 7] for i in range(7)]
    assert cfg["pretrain"]["steps"] == 4 and cfg["pretrain_steps"] == 4
    cos = report["surrogate_cosine"]
    assert len(cos) == 8 and cos[6:] == pytest.approx([1.0, 1.0], abs=1e-9)  # nothing above them skipped
    assert cos[0] < 0.999                                                     # a surrogate, not the gradient
    assert "speedup" in result.stdout and "loss_gap" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "qwen9"], "unknown bench model"),
    (["--model", "tiny", "--k", "9"], "outside 1..8"),
    (["--steps", "5"], "--steps"),
    (["--model", "tiny", "--pretrain-steps", "-1"], "--pretrain-steps"),
    (["--model", "tiny", "--warmup", "-1"], "--warmup"),
])
def test_bench_lcsb_bad_input_exits_2_without_a_file(tmp_path, args, message):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", "lcsb", *args, "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and message in result.stderr, result.stderr
    assert not out.exists()


def test_bench_lcsb_warmup_runs_the_lcsb_arm_with_full_backprop_first(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, [*ARGS, "--warmup", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert validation_errors("bench_lcsb", report) == []
    cfg = report["config"]
    assert cfg["plan_warmup"] == 3 and cfg["plan"]["warmup"] == 3
    full, lcsb = report["losses_full"], report["losses_lcsb"]
    assert full[:4] == lcsb[:4]   # three identical full-backprop updates: the loss of step 3 is still equal
    assert full[4:] != lcsb[4:]
    assert "--warmup" in CliRunner().invoke(cli, ["bench", "lcsb", "--help"]).output
