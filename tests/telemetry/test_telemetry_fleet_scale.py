"""`telemetry fleet` at scale: runs are consumed one at a time, each run's page has SVG charts that parse and
carry the run's data, and a page costs milliseconds of CPU, not matplotlib's ~0.9 s (scripts/bench_fleet.py
measures 10,000 runs; docs/telemetry.md)."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

from telemetry_samples import baseline_run

from toolchain.telemetry.fleet import write_fleet
from toolchain.telemetry.svgplot import svg_chart

SVG = "{http://www.w3.org/2000/svg}"


def test_runs_are_consumed_one_at_a_time_with_progress(tmp_path):
    alive, made, calls = [], [], []

    def runs():
        for i in range(5):
            made.append(i)
            alive.append(len(made) - len(calls))     # runs produced but not yet written
            yield f"run-{i}", baseline_run(f"run-{i}", steps=5)

    files = write_fleet(runs(), tmp_path / "fleet", on_run=lambda: calls.append(1))
    assert len(calls) == 5 and max(alive) == 1
    assert [p.parent.name for p in files.reports] == [f"run-{i}" for i in range(5)]


def test_each_run_page_has_svg_charts_with_its_data(tmp_path):
    files = write_fleet([("r", baseline_run("r", steps=12))], tmp_path / "fleet")
    page = files.reports[0].parent
    html = (page / "index.html").read_text()
    for name in ("memory.svg", "loss.svg", "step_time.svg"):
        assert f"src='{name}'" in html
        root = ET.fromstring((page / name).read_text())
        assert root.tag == f"{SVG}svg" and int(root.get("width")) > 300
        assert root.findall(f".//{SVG}polyline"), name
    loss = ET.fromstring((page / "loss.svg").read_text())
    assert len(loss.findall(f".//{SVG}circle")) >= 12          # one point per step, and the eval points
    memory = (page / "memory.svg").read_text()
    assert "loaded-runtime baseline" in memory and "planner estimate" in memory


def test_an_empty_chart_and_hostile_text_are_still_valid_svg():
    empty = ET.fromstring(svg_chart("<none> & \"x\"", "x", "y", [], empty="no <data>"))
    assert "no <data>" in "".join(empty.itertext())
    one = ET.fromstring(svg_chart("t", "x", "y", [("a", [(0.0, float("nan")), (1.0, 2.0)], "line+points")]))
    assert len(one.findall(f".//{SVG}circle")) == 1


def test_a_run_page_costs_milliseconds_of_cpu(tmp_path):
    runs = [(f"run-{i:04d}", baseline_run(f"run-{i:04d}")) for i in range(150)]
    write_fleet(runs[:2], tmp_path / "warm")
    t0 = time.process_time()
    write_fleet(runs, tmp_path / "fleet")
    per_run = (time.process_time() - t0) / len(runs)
    assert per_run < 0.05, f"{per_run * 1000:.1f} ms of CPU a run (matplotlib's pages took ~900)"
