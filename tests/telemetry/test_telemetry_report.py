"""Reports from a recorded run (data/tiny_host_run.jsonl, see make_fixture.py) and from the Android
example run: PNG plots, summary.json, the HTML page, and what the memory plot draws."""

from __future__ import annotations

import json

import matplotlib.image
import pytest
from telemetry_samples import FIXTURE_RUN, FIXTURE_RUN_ID, run_start_event, step_event

from toolchain.errors import BadInput
from toolchain.memory.estimate import BYTES_PER_MB
from toolchain.schemas import SCHEMA_DIR, read_json
from toolchain.telemetry.events import read_jsonl
from toolchain.telemetry.report import memory_figure, summarize, write_report

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


def test_memory_plot_draws_budget_paper_levels_and_samples():
    events = json.loads(ANDROID_RUN.read_text())
    fig = memory_figure(sorted(events, key=lambda e: e["seq"]))
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    levels = {label.rsplit(" ", 2)[0]: line.get_ydata()[0] for label, line in zip(labels, fig.axes[0].get_lines())
              if label.endswith(" MB")}
    start = events[0]
    assert levels["budget"] == pytest.approx(start["budget_bytes"] / BYTES_PER_MB)
    assert levels["MeSP (paper)"] == 136.2 and levels["MeBP (paper)"] == 360.8   # qwen2.5-0.5b, seq 256
    assert "planner estimate" in levels
    anon = next(line for line in fig.axes[0].get_lines() if line.get_label() == "android_proc_status anon")
    assert list(anon.get_ydata()) == [71303168 / BYTES_PER_MB]
    assert "low-memory signal" in labels


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
