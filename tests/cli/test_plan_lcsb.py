"""`toolchain plan lcsb`: writes a schema-valid plan; bad input -> `Error:`, exit 2, no file."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.lcsb import make_plan, read_plan
from toolchain.schemas import validation_errors


@pytest.mark.parametrize("args, expected", [
    (["--layers", "24", "--k", "6"], make_plan(24, 6, "cyclic")),
    (["--layers", "10", "--k", "4", "--policy", "strided"], make_plan(10, 4, "strided")),
    (["--layers", "24", "--k", "4", "--policy", "last"], make_plan(24, 4, "last")),
    (["--layers", "8", "--k", "2", "--policy", "random", "--seed", "5", "--period", "9"],
     make_plan(8, 2, "random", seed=5, period=9)),
    (["--layers", "8", "--policy", "full"], make_plan(8, None, "full")),
])
def test_plan_lcsb_writes_the_plan(tmp_path, args, expected):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "lcsb", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert validation_errors("step_plan", json.loads(out.read_text())) == []
    assert read_plan(out) == expected
    assert str(out) in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--layers", "8", "--k", "9"], "outside 1..8"),
    (["--layers", "8"], "needs k"),
    (["--layers", "8", "--k", "2", "--seed", "3"], "only apply to the random policy"),
    (["--layers", "0", "--k", "1"], "--layers"),
    (["--layers", "8", "--k", "2", "--policy", "lisa"], "--policy"),
])
def test_plan_lcsb_bad_input_exits_2_without_a_file(tmp_path, args, message):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "lcsb", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Error" in result.stderr and message in result.stderr, result.stderr
    assert not out.exists()


def test_plan_lcsb_warmup(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "lcsb", "--layers", "10", "--k", "4", "--policy", "anchored",
                                      "--warmup", "30", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["warmup"] == 30
    assert read_plan(out) == make_plan(10, 4, "anchored", warmup=30)
    assert "warm-up: steps 0..29" in result.stdout
    help_text = CliRunner().invoke(cli, ["plan", "lcsb", "--help"]).output
    assert "--warmup" in help_text and "every layer" in help_text


def test_plan_lcsb_negative_warmup_is_one_error(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "lcsb", "--layers", "10", "--k", "4", "--warmup", "-1", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and [line for line in result.stderr.splitlines() if line.startswith("Error")] != []
    assert "--warmup" in result.stderr and not out.exists()
