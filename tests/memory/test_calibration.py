"""The planner against real measurements: every `toolchain bench memory --json` report stored in
data/bench_memory/ (commands in docs/planner.md, "Calibration"; the data format in data/README.md) is
re-predicted from its config.

- analytic rows (mesp, mebp, autograd): estimate_peak + HOST_OVERHEAD_MB[mode] within 15% of the measured peak
  (the acceptance bar of issue 7); MeSP's own growth during the step (peak - resident before it) within
  5% of the analytic tensors (LoRA state excluded, it is resident before the step).
- executorch rows: the measured program's memory plan (data/.../<report>.manifest.json, the manifest.json
  of the program `--program` named) through `program_peak`, HOST figure (the Python bindings share one
  arena between a program's methods; `bench memory` runs every layer), within 15% of the measured peak.
- the overhead constants are what the reports measured, not tuned: HOST_OVERHEAD_MB[mode] is the median
  of that mode's residue (resident before the step - LoRA state), EXECUTORCH_OVERHEAD_MB the largest
  (measured peak - host figure without overhead) of the executorch rows.
- held out (data/bench_memory_held_out/, same format): measured after the constants were fixed, only
  predicted, analytic and executorch rows alike.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from toolchain.memory.estimate import StepShape, estimate_peak
from toolchain.memory.fit import EXECUTORCH_OVERHEAD_MB, HOST_OVERHEAD_MB, program_peak
from toolchain.models import PRESETS
from toolchain.schemas import read_json

DATA = Path(__file__).parent / "data"
ANALYTIC_MODES = ("mesp", "mebp", "autograd")


def _rows(folder: str) -> list[tuple[Path, dict, dict]]:
    reports = sorted(p for p in (DATA / folder).glob("*.json") if not p.name.endswith(".manifest.json"))
    return [(p, doc["config"], row) for p in reports for doc in [read_json(p, "bench_memory")] for row in doc["results"]]


ROWS = _rows("bench_memory")
ANALYTIC = [r for r in ROWS if r[2]["mode"] in ANALYTIC_MODES]
PROGRAM = [r for r in ROWS if r[2]["mode"] == "executorch"]
HELD_OUT_ROWS = _rows("bench_memory_held_out")


def _id(row) -> str:
    path, config, result = row
    return f"{path.stem}-{result['mode']}"


def _shape(config: dict, mode: str) -> StepShape:
    # bench memory: SGD, each MeSP layer updated right after its backward and its gradients dropped
    return StepShape(PRESETS[config["model"]], config["seq_len"], config["rank"], targets=tuple(config["targets"]),
                     method=mode, loss_chunk=config["loss_chunk"], vocab_chunk=config["vocab_chunk"],
                     mlp_chunk=config["mlp_chunk"], grads="layer")


def _program_dir(report: Path, tmp_path: Path) -> Path:
    """A directory holding the measured program's manifest (stored beside the report)."""
    manifest = report.with_name(report.stem + ".manifest.json")
    assert manifest.is_file(), f"store the measured program's manifest.json as {manifest.name}"
    out = tmp_path / report.stem
    out.mkdir(exist_ok=True)
    (out / "manifest.json").write_text(manifest.read_text())
    return out


def _host_figure(report: Path, tmp_path: Path, overhead_mb: float) -> float:
    """`bench memory` runs the program on the host's Python bindings (one shared arena), every layer selected."""
    pdir = _program_dir(report, tmp_path)
    layers = json.loads((pdir / "manifest.json").read_text())["model"]["arch"]["layers"]
    return program_peak(pdir, lcsb_k=layers, overhead_mb=overhead_mb).host_peak_mb


def _predict(row, tmp_path: Path) -> float:
    path, config, result = row
    if result["mode"] == "executorch":
        return _host_figure(path, tmp_path, EXECUTORCH_OVERHEAD_MB)
    return estimate_peak(_shape(config, result["mode"]), overhead_mb=HOST_OVERHEAD_MB[result["mode"]]).peak_mb


def test_three_configs_were_measured_for_mesp_and_mebp():
    for mode in ("mesp", "mebp"):
        configs = {(c["model"], c["seq_len"], c["rank"]) for _, c, r in ANALYTIC if r["mode"] == mode}
        assert len(configs) >= 3, (mode, configs)
    assert PROGRAM, "no executorch report"


@pytest.mark.parametrize("row", ANALYTIC, ids=_id)
def test_analytic_prediction_is_within_15_percent(row, tmp_path):
    assert _predict(row, tmp_path) == pytest.approx(row[2]["peak_mb"], rel=0.15)


# Known gap, not a counting error: at T = 128 one head's [T, T] scores are 64 KiB, under the phone-like
# allocator's 128 KiB mmap threshold, so they come from a heap whose touched pages stay counted; the
# step then grows 6.6% more than its tensors (2.4% with MALLOC_MMAP_THRESHOLD_=4096). Strict: it fails
# loudly once the allocator slack is modelled or the step allocates differently.
_SMALL_BLOCK_SLACK = {"qwen2.5-0.5b-seq128-r8-mesp"}
# Known gap, not explained yet: since the block backward recomputes n1 after the MLP and frees attention's
# tensors before the q/k/v tail (2026-12-01), the counted tensors at the peak fell by 2.2 MB at T = 256, r16
# (exact against the live tensors in test_memory_estimate.py), but the measured process peak only by 0.6 MB
# (71.7 -> 71.1): the step grows 34.1 MB against 32.3 counted (+5.7%). Likely allocator retention of the
# MLP phase's pages; the full prediction (with the overhead) stays within 15%. Strict, as above.
_RETAINED_AFTER_MLP = {"qwen2.5-0.5b-seq256-r16-mesp"}


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.xfail(
    _id(r) in _SMALL_BLOCK_SLACK | _RETAINED_AFTER_MLP, strict=True, reason="allocator slack (see above)"))
    for r in ANALYTIC if r[2]["mode"] == "mesp"], ids=_id)
def test_mesp_step_growth_matches_the_counted_tensors(row):
    _, config, result = row
    est = estimate_peak(_shape(config, "mesp"))
    tensors = est.peak_mb - est.parts_mb["lora_params"]
    assert tensors == pytest.approx(result["peak_mb"] - result["resident_before_step_mb"], rel=0.05)


@pytest.mark.parametrize("row", PROGRAM, ids=_id)
def test_program_prediction_is_within_15_percent(row, tmp_path):
    assert _predict(row, tmp_path) == pytest.approx(row[2]["peak_mb"], rel=0.15)


def test_overhead_constants_are_the_measured_ones(tmp_path):
    residue: dict[str, list[float]] = {}
    for _, c, r in ANALYTIC:
        lora = estimate_peak(_shape(c, r["mode"])).parts_mb["lora_params"]
        residue.setdefault(r["mode"], []).append(r["resident_before_step_mb"] - lora)
    assert HOST_OVERHEAD_MB == {mode: round(statistics.median(v), 1) for mode, v in residue.items()}
    runtime = [result["peak_mb"] - _host_figure(path, tmp_path, 0.0) for path, _, result in PROGRAM]
    assert EXECUTORCH_OVERHEAD_MB == round(max(runtime), 1)


@pytest.mark.parametrize("row", ROWS + HELD_OUT_ROWS, ids=_id)
def test_reports_are_what_bench_memory_wrote(row):
    path, config, result = row
    assert config["allocator"] == "phone-like" and config["optimizer"] == "SGD", path.name
    assert max(result["peak_mb_runs"]) == result["peak_mb"], path.name
    assert not result.get("unreliable") and result["file_drift_mb"] == 0.0, path.name
    if result["mode"] == "executorch":
        manifest = json.loads(path.with_name(path.stem + ".manifest.json").read_text())
        assert manifest["schema_version"] == 3 and manifest["seq_len"] == config["seq_len"], path.name


# Held out: measured after the constants were fixed (docs/planner.md); not used to compute them, only predicted.
@pytest.mark.parametrize("row", HELD_OUT_ROWS, ids=_id)
def test_held_out_prediction_is_within_15_percent(row, tmp_path):
    assert _predict(row, tmp_path) == pytest.approx(row[2]["peak_mb"], rel=0.15)
