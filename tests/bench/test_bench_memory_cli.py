"""`toolchain bench memory` end to end on the tiny preset (real worker processes; nothing is timed
here): the JSON report follows its schema, the exact modes' gradients agree, the weights were
memory-mapped (not counted), and bad input exits 2 without writing a report."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.schemas import validation_errors

BASE = ["bench", "memory", "--model", "tiny", "--init", "random", "--seq-len", "32"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "report.json"
    result = CliRunner().invoke(cli, [*BASE, "--modes", "mebp,mesp,mezo", "--cache-dir", str(tmp / "cache"),
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


def test_report_follows_the_schema_and_names_what_it_counted(report):
    _, doc = report
    assert validation_errors("bench_memory", doc) == []
    assert [r["mode"] for r in doc["results"]] == ["mebp", "mesp", "mezo"]
    assert "memory-mapped" in doc["counted"] and "VmHWM - RssFile - RssShmem" in doc["counted"]
    assert (doc["config"]["seq_len"], doc["config"]["rank"], doc["config"]["lr"]) == (32, 8, 1e-4)


def test_exact_modes_agree_and_mezo_has_no_exact_gradient(report):
    _, doc = report
    rows = {r["mode"]: r for r in doc["results"]}
    assert doc["reference_mode"] == "mebp"
    assert rows["mebp"]["grad_max_rel_diff"] == 0.0
    assert 0 < rows["mesp"]["grad_max_rel_diff"] < 1e-4      # float32, different summation order
    assert rows["mezo"]["grad_max_rel_diff"] is None
    assert rows["mesp"]["loss"] == pytest.approx(rows["mebp"]["loss"], rel=1e-4)


def test_weights_are_mapped_not_counted(report):
    _, doc = report
    for r in doc["results"]:
        assert r["mapped_file_mb"] > 0 and r["file_drift_mb"] == 0
        assert 0 < r["peak_mb"] < 64            # tiny's whole step; its weights alone are 1 MB, the runtime ~200 MB
        assert r["resident_before_step_mb"] <= r["peak_mb"]
        assert set(r["breakdown"]) >= {"lora_params_mb", "grads_mb", "checkpoints_mb", "largest_transient_mb"}


def test_each_mode_reports_its_counted_flops_and_utilisation(report):
    from test_flops import forward_flops, mesp_step_flops
    from toolchain.models import PRESETS

    _, doc = report
    rows = {r["mode"]: r for r in doc["results"]}
    a, targets = PRESETS["tiny"], tuple(doc["config"]["targets"])
    # tiny, seq 32, r8 on all seven projections: the closed forms derived by hand (test_flops.py)
    assert rows["mesp"]["step_gflop"] == round(mesp_step_flops(a, targets, 8, 32, selected=a.layers) / 1e9, 4)
    assert rows["mezo"]["step_gflop"] == round(2 * forward_flops(a, targets, 8, 32) / 1e9, 4)
    for r in doc["results"]:
        assert r["flops_counted_from"] == r["mode"]
        assert r["gflop_per_s"] == pytest.approx(r["step_gflop"] / r["step_s"], rel=1e-2, abs=0.01)
        assert 0 < r["matmul_gflop_per_s"] <= r["matmul_peak_gflop_per_s"]
        assert r["utilisation"] == pytest.approx(r["gflop_per_s"] / r["matmul_gflop_per_s"], rel=1e-2, abs=1e-4)
        assert r["utilisation_cpu"] == pytest.approx(r["gflop_per_cpu_s"] / r["matmul_gflop_per_s"], rel=1e-2, abs=1e-4)
    assert "FlopCounterMode" in doc["counted"]


def _plan_fit(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["plan", "fit", "--device", "android-8gb", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_planner_estimate_beside_the_measured_peak(report):
    """Each mode the planner models carries `toolchain plan fit`'s answer for the same step (SGD, every layer,
    the bench's chunk sizes) beside its measured peak; MeZO, which the planner does not model, carries none."""
    result, doc = report
    rows = {r["mode"]: r for r in doc["results"]}
    for mode in ("mebp", "mesp"):
        fit = _plan_fit("--model", "tiny", "--seq-len", "32", "--method", mode)
        assert rows[mode]["planner_estimate_mb"] == round(fit["predicted_peak_mb"], 2)
        assert rows[mode]["planner_source"] == "analytic"
    assert "planner_estimate_mb" not in rows["mezo"] and "planner_source" not in rows["mezo"]
    header = result.stdout.splitlines()[1]
    assert "plan MB" in header and "plan err" in header
    mesp_line = next(ln for ln in result.stdout.splitlines() if ln.startswith("mesp "))
    err = rows["mesp"]["planner_estimate_mb"] / rows["mesp"]["peak_mb"] - 1
    assert f"{rows['mesp']['planner_estimate_mb']:.1f}" in mesp_line and f"{err:+.1%}" in mesp_line


def test_table_is_printed(report):
    result, _ = report
    lines = result.stdout.splitlines()
    assert lines[1].split()[:3] == ["mode", "peak", "MB"]
    assert [line.split()[0] for line in lines[3:6]] == ["mebp", "mesp", "mezo"]


@pytest.mark.parametrize("args, message", [
    (["--modes", "mebp,sgd"], "unknown mode(s) sgd"),
    (["--modes", "mesp,mesp"], "lists a mode twice"),
    (["--modes", "mesp,executorch"], "needs --program"),
    (["--seq-len", "4096"], "exceeds tiny's 512 positions"),
    (["--targets", "qq_proj"], "unknown LoRA target"),
])
def test_bad_input_exits_2_without_a_report(tmp_path, args, message):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, [*BASE, *args, "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process from /proc, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def test_a_stopped_bench_leaves_no_worker_and_no_scratch(tmp_path):
    """SIGTERM to `bench memory` while a worker runs: the bench exits 143, its worker follows it
    (PR_SET_PDEATHSIG, Linux), and its scratch directory is deleted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG and /proc are Linux-only")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", *BASE, "--modes", "mebp,mesp", "--repeat", "50",
                             "--cache-dir", str(tmp_path / "cache")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def workers() -> list[int]:
        pids = (int(p) for p in os.listdir("/proc") if p.isdigit())
        return [pid for pid in pids if (st := _stat(pid)) is not None and st[1] == proc.pid]

    def alive(pid: int) -> bool:
        st = _stat(pid)
        return st is not None and st[0] != "Z"

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (workers() and any(scratch.iterdir())):
        time.sleep(0.05)
    children = workers()
    assert children and proc.poll() is None, "no worker was seen running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in children), "a worker outlived the bench"
    assert list(scratch.iterdir()) == []


@pytest.fixture(scope="module")
def tiny_int4_program(tmp_path_factory):
    out = tmp_path_factory.mktemp("prog") / "tiny-int4"
    result = CliRunner().invoke(cli, ["export", "--model", "tiny", "--init", "random", "--seq-len", "32",
                                      "--quant", "int4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_program_runs_beside_eager_on_the_same_int4_weights(tiny_int4_program, tmp_path):
    """The headline comparison: the exported program on ExecuTorch beside eager MeSP on the program's own
    int4 weights (taken from the program: no --quant needed), from the same adapter: equal losses."""
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, [*BASE, "--modes", "mesp,executorch,executorch_groups", "--program",
                                      str(tiny_int4_program), "--layers-per-checkpoint", "3",
                                      "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert validation_errors("bench_memory", doc) == []
    rows = {r["mode"]: r for r in doc["results"]}
    assert doc["config"]["quant"] == "int4"
    assert rows["executorch"]["loss"] == pytest.approx(rows["mesp"]["loss"], rel=1e-5)
    assert rows["executorch"]["peak_mb"] > 0 and rows["executorch"]["step_s"] > 0
    # the program's loop with checkpoint groups: the same steps bit for bit
    assert rows["executorch_groups"]["loss"] == rows["executorch"]["loss"]
    assert rows["executorch_groups"]["layers_per_checkpoint"] == 3 and "breakdown" not in rows["executorch_groups"]
    # a program's FLOPs are counted on the eager step it exports (int4 dequantization is not a matmul)
    from test_flops import mesp_step_flops
    from toolchain.models import PRESETS

    a = PRESETS["tiny"]
    assert rows["executorch"]["flops_counted_from"] == "mesp"
    assert rows["executorch_groups"]["flops_counted_from"] == "mesp_groups"
    assert (rows["executorch"]["step_gflop"] == rows["mesp"]["step_gflop"]
            == round(mesp_step_flops(a, tuple(doc["config"]["targets"]), 8, 32, selected=a.layers) / 1e9, 4))
    assert rows["executorch_groups"]["step_gflop"] > rows["executorch"]["step_gflop"]
    # the planner's host figure of the program (one arena shared by the bindings), every layer backpropagated
    fit = _plan_fit("--program", str(tiny_int4_program))
    assert rows["executorch"]["planner_estimate_mb"] == round(fit["host_peak_mb"], 2)
    fit3 = _plan_fit("--program", str(tiny_int4_program), "--layers-per-checkpoint", "3")
    assert rows["executorch_groups"]["planner_estimate_mb"] == round(fit3["host_peak_mb"], 2)
    assert fit3["host_peak_mb"] < fit["host_peak_mb"]
    assert rows["executorch"]["planner_source"] == "program" and rows["mesp"]["planner_source"] == "analytic"


def test_an_int8_program_runs_beside_the_fp32_one_in_the_same_run(tiny_int4_program, tmp_path):
    """`--program P32 --program P8`: every program mode once per program, rows told apart by `program` and
    `compute`; the int8 program trains on the same weights and adapter (its loss within the int8 rounding)."""
    from toolchain.native import KernelUnavailable, load_kernels

    try:
        load_kernels()
    except KernelUnavailable as e:
        pytest.skip(f"native kernels unavailable here: {e}")
    p8 = tmp_path / "tiny-int8"
    result = CliRunner().invoke(cli, ["export", "--model", "tiny", "--init", "random", "--seq-len", "32",
                                      "--quant", "int4", "--compute", "int8", "--no-generate", "--out", str(p8)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, [*BASE, "--modes", "mesp,executorch", "--program", str(tiny_int4_program),
                                      "--program", str(p8), "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert validation_errors("bench_memory", doc) == []
    rows = [(r["mode"], r.get("compute"), r.get("program")) for r in doc["results"]]
    assert rows == [("mesp", None, None), ("executorch", "fp32", str(tiny_int4_program)), ("executorch", "int8", str(p8))]
    mesp, p32_row, p8_row = doc["results"]
    assert p32_row["loss"] == pytest.approx(mesp["loss"], rel=1e-5)
    assert p8_row["loss"] == pytest.approx(mesp["loss"], rel=1e-2) and p8_row["loss"] != p32_row["loss"]
    assert p8_row["step_s"] > 0 and p8_row["peak_mb"] > 0 and p8_row["step_gflop"] == p32_row["step_gflop"]
    assert "executorch[int8]" in result.output and "executorch[fp32]" in result.output
    # --compute int8's default MLP chunk (512) differs from the first program's (256): allowed for a further program
    assert p32_row["mlp_chunk"] == doc["config"]["mlp_chunk"] == 256 and p8_row["mlp_chunk"] == 512


@pytest.mark.parametrize("args, message", [
    (["--seq-len", "48"], "seq_len 32 (bench: 48)"),
    (["--quant", "int8"], "quant int4 (bench: int8)"),
    (["--rank", "4"], "rank 8 (bench: 4)"),
])
def test_a_program_of_another_workload_is_refused(tiny_int4_program, tmp_path, args, message):
    out = tmp_path / "r.json"
    base = [a for a in BASE if a not in ("--seq-len", "32")] if "--seq-len" in args else BASE
    result = CliRunner().invoke(cli, [*base, "--modes", "mesp,executorch", "--program", str(tiny_int4_program), *args,
                                      "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()


def test_mesp_groups_runs_beside_mesp_with_the_same_gradients_and_fewer_checkpoints(tmp_path):
    out = tmp_path / "groups.json"
    result = CliRunner().invoke(cli, [*BASE, "--modes", "mesp,mesp_groups", "--layers-per-checkpoint", "2",
                                      "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert validation_errors("bench_memory", doc) == []
    rows = {r["mode"]: r for r in doc["results"]}
    assert doc["reference_mode"] == "mesp" and rows["mesp_groups"]["grad_max_rel_diff"] == 0.0
    assert rows["mesp_groups"]["loss"] == rows["mesp"]["loss"]
    assert rows["mesp_groups"]["layers_per_checkpoint"] == 2 and "layers_per_checkpoint" not in rows["mesp"]
    assert rows["mesp_groups"]["breakdown"]["checkpoints_mb"] < rows["mesp"]["breakdown"]["checkpoints_mb"]
    # groups [0, 1], [2, 3], [4, 5], [6, 7] of tiny's 8 layers: the backward reruns one block forward per group
    from test_flops import forward_flops, mesp_step_flops
    from toolchain.models import PRESETS

    a, targets = PRESETS["tiny"], tuple(doc["config"]["targets"])
    layer_forward = (forward_flops(a, targets, 8, 32) - 2 * 32 * a.hidden * a.vocab) // a.layers
    step = mesp_step_flops(a, targets, 8, 32, selected=a.layers)
    assert rows["mesp_groups"]["step_gflop"] == round((step + 4 * layer_forward) / 1e9, 4)
