"""Reports from a recorded run (data/tiny_host_run.jsonl, see make_fixture.py) and from the Android
example run: PNG plots, summary.json, the HTML page, and what the memory plot draws."""

from __future__ import annotations

import json

import matplotlib.image
import pytest
from telemetry_samples import FIXTURE_RUN, FIXTURE_RUN_ID, baseline_run, run_start_event, step_event

from toolchain.errors import BadInput, SchemaError
from toolchain.memory.estimate import BYTES_PER_MB
from toolchain.schemas import SCHEMA_DIR, read_json
from toolchain.telemetry.events import read_jsonl
from toolchain.telemetry.figures import loss_figure, memory_figure, memory_notes, moving_average
from toolchain.telemetry.report import write_report
from toolchain.telemetry.summary import summarize

ANDROID_RUN = SCHEMA_DIR / "examples" / "telemetry_run_android.json"


def test_report_of_the_recorded_run(tmp_path):
    events = read_jsonl(FIXTURE_RUN)
    files = write_report(FIXTURE_RUN_ID, events, tmp_path / "report")
    for png in files.plots:
        image = matplotlib.image.imread(png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[0] > 200 and image.shape[1] > 400
        assert image[..., :3].std() > 0.01                     # not a blank canvas
    summary = read_json(files.summary, "run_summary")
    steps = [e for e in events if e["type"] == "step"]
    peak = max(e[k] for e in events if e["type"] == "memory" for k in ("anon_bytes", "peak_bytes"))
    assert summary["steps"] == len(steps) == 24 and summary["events"] == len(events)
    assert summary["status"] == "completed" and summary["final_loss"] == steps[-1]["loss"]
    assert summary["peak_anon_bytes"] == peak and summary["within_budget"] is (peak <= 1 << 30)
    assert summary["reference_mb"] == {}                        # no published numbers for `tiny`
    page = files.html.read_text()
    for name in ("memory.png", "loss.png", "step_time.png", FIXTURE_RUN_ID, "lcsb_k", "host (2-core x86_64)"):
        assert name in page


def _levels(ax) -> dict[str, float]:
    return {line.get_label().rsplit(" ", 2)[0]: line.get_ydata()[0] for line in ax.get_lines()
            if line.get_label().endswith(" MB")}


def test_memory_plot_fits_the_axis_to_the_data_and_states_the_budget_in_words():
    """The Android example: the budget (2,492 MB) is 6x the largest sample: not drawn (it would flatten the
    curves) but stated under the plot; the paper's MeSP/MeBP levels are within reach and drawn."""
    events = sorted(json.loads(ANDROID_RUN.read_text()), key=lambda e: e["seq"])
    fig = memory_figure(events)
    ax = fig.axes[0]
    levels = _levels(ax)
    assert "budget" not in levels
    assert levels["MeSP (paper)"] == 136.2 and levels["MeBP (paper)"] == 360.8   # qwen2.5-0.5b, seq 256
    lo, hi = ax.get_ylim()
    samples = [e[k] / BYTES_PER_MB for e in events if e["type"] == "memory"
               for k in ("anon_bytes", "peak_bytes", "rss_bytes") if k in e]
    assert lo <= min(samples) and max(samples) <= hi < 1.2 * max(samples)
    budget = events[0]["budget_bytes"] / BYTES_PER_MB
    words = memory_notes(events)
    assert any(w.startswith(f"budget {budget:,.0f} MB, 26.2x the anon peak") for w in words)
    assert fig.texts and "budget 2,492 MB" in fig.texts[0].get_text()
    anon = next(line for line in ax.get_lines() if line.get_label() == "android_proc_status anon")
    assert list(anon.get_ydata()) == [71303168 / BYTES_PER_MB]
    assert "low-memory signal" in [line.get_label() for line in ax.get_lines()]
    assert len(fig.axes) == 1                               # no baseline sample: no program panel


def test_a_budget_within_reach_of_the_data_is_drawn():
    events = sorted(json.loads(ANDROID_RUN.read_text()), key=lambda e: e["seq"])
    events[0] = {**events[0], "budget_bytes": 600 * (1 << 20)}
    assert _levels(memory_figure(events).axes[0])["budget"] == 600.0
    assert not any(w.startswith("budget") for w in memory_notes(events))


def test_planner_compared_like_for_like_above_the_loaded_runtime_baseline(tmp_path):
    events = baseline_run()
    files = write_report("host-baseline-run", events, tmp_path / "rep")
    summary = read_json(files.summary, "run_summary")
    mb = 1 << 20
    peak = max(e["peak_bytes"] for e in events if e["type"] == "memory" and "peak_bytes" in e)
    assert summary["baseline_bytes"] == 281 * mb and summary["peak_program_bytes"] == peak - 281 * mb
    assert summary["planner_estimate_bytes"] == round(6.1 * mb)
    assert summary["planner_error"] == pytest.approx((6.1 * mb - (peak - 281 * mb)) / (peak - 281 * mb), abs=1e-4)
    assert -0.25 < summary["planner_error"] < -0.15
    evals = [e for e in events if e["type"] == "eval"]
    assert summary["eval"] == [{"step": e["step"], "loss": e["loss"]} for e in evals]
    fig = memory_figure(events)
    top, program = fig.axes
    assert "budget" not in _levels(top)                    # 24,105 MB: stated in words
    assert "planner estimate" not in _levels(top)          # not on the absolute axis: a different quantity
    assert _levels(program)["planner estimate"] == pytest.approx(6.1)
    assert _levels(program)["measured peak"] == pytest.approx((peak - 281 * mb) / mb)
    assert "(-" in program.get_title() and "%)" in program.get_title()
    page = files.html.read_text()
    assert "planner error" in page and "Held-out loss" in page


def test_without_a_baseline_the_planner_estimate_is_not_compared():
    events = [e for e in baseline_run() if e.get("baseline") is not True]
    summary = summarize("r", events)
    assert summary["baseline_bytes"] is None and summary["peak_program_bytes"] is None
    assert summary["planner_estimate_bytes"] == round(6.1 * (1 << 20)) and summary["planner_error"] is None
    assert any("not compared, the run logged no baseline sample" in w for w in memory_notes(events))
    assert len(memory_figure(events).axes) == 1


def test_loss_plot_faint_points_moving_average_and_held_out():
    events = baseline_run()
    ax = loss_figure(events).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    raw = lines["training loss (one row per step)"]
    assert raw.get_alpha() < 0.5 and raw.get_linestyle() == "None"
    average = next(line for label, line in lines.items() if label.startswith("moving average"))
    losses = [e["loss"] for e in events if e["type"] == "step"]
    assert list(average.get_ydata()) == pytest.approx(moving_average(losses, 2))
    held = lines["held-out loss (eval)"]
    assert list(held.get_xdata()) == [e["step"] for e in events if e["type"] == "eval"]
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]


def test_summary_ignores_vmhwm_as_anon_peak():
    events = json.loads(ANDROID_RUN.read_text())
    summary = summarize(events[0]["run_id"], sorted(events, key=lambda e: e["seq"]))
    # android_proc_status's peak_bytes is VmHWM (file pages included): the anon peak is dumpsys's Private Dirty
    assert summary["peak_anon_bytes"] == 99614720 and summary["peak_probe"] == "android_dumpsys"
    assert summary["status"] == "failed" and summary["final_loss"] is None and summary["errors"] == 1
    assert summary["low_memory_signals"] == 1


def test_a_run_without_memory_samples_or_run_end_still_reports(tmp_path):
    events = [run_start_event("r"), step_event(1, "r", loss=None), step_event(2, "r")]
    files = write_report("r", events, tmp_path / "out")
    summary = read_json(files.summary, "run_summary")
    assert summary["status"] == "incomplete" and summary["peak_anon_bytes"] is None
    assert summary["within_budget"] is None and summary["final_loss"] == 2.5


def test_no_events_is_an_error_and_writes_nothing(tmp_path):
    with pytest.raises(BadInput, match="no events"):
        write_report("r", [], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_summary_never_holds_a_non_finite_number(tmp_path):
    """Finite inputs whose mean or span overflows (1e308 + 1e308) give null, not Infinity (not JSON)."""
    events = [run_start_event("r"), step_event(1, "r", step_time_s=1e308, tokens_per_s=1e308, timestamp=1e308),
              step_event(2, "r", step_time_s=1e308, tokens_per_s=1e308, timestamp=0.0)]
    files = write_report("r", events, tmp_path / "out")
    text = files.summary.read_text()
    assert "Infinity" not in text and "NaN" not in text
    summary = read_json(files.summary, "run_summary")
    assert summary["mean_step_time_s"] in (None, 1e308)


def test_an_existing_report_directory_is_not_replaced_without_force(tmp_path):
    from toolchain.errors import OutputExists

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("x")
    with pytest.raises(OutputExists, match="not empty"):
        write_report("r", [run_start_event("r"), step_event(1, "r")], tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


def test_an_app_error_with_runtime_log_lines_shows_them(tmp_path):
    error = {"schema_version": 1, "type": "error", "run_id": "r", "seq": 1, "timestamp": 2.0, "message": "failed",
             "fatal": True, "code": "runtime_error", "step": 0, "log": ["E method.cpp:1304] Error setting input 3"]}
    try:
        files = write_report("r", [run_start_event("r"), error], tmp_path / "out")
    except SchemaError:
        pytest.skip("the schema has no `log` on error events")
    page = files.html.read_text()
    assert "runtime_error failed" in page and "log: E method.cpp:1304] Error setting input 3" in page
