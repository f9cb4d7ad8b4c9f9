"""The view across runs: an HTML page and fleet.json over every stored run (or a filtered subset).

Runs are grouped by device model and configuration (model, method, backend, seq_len, rank, LCSB k, quant,
compute, optimizer); per group: runs, completed, killed (no run_end: the app was killed, or the run is still going;
or an error whose code names a kill), failed, low-memory signals, median step time, the median measured
program-attributable peak (above the run's loaded-runtime baseline), the planner's estimate of it and the
planner's error. `scatter.png` plots measured against predicted peak, one point per run that has both.
Each run gets its own report (`runs/<run_id>/`, `report.write_report` with SVG charts) the page links to.
Runs are read and written one at a time (10,000 generated runs in minutes: docs/telemetry.md).

fleet.json: {"schema_version": 1, "generated_at", "filters", "runs": [per run: run_id, device_model,
config, status, killed, first_timestamp, summary fields, "report": relative path], "groups": [per group:
device_model, config, runs, completed, killed, failed, low_memory_signals, median_step_time_s,
median_peak_program_bytes, median_planner_estimate_bytes, median_planner_error, median_peak_anon_bytes]}.
"""

from __future__ import annotations

import html
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from toolchain.atomic import atomic_dir
from toolchain.memory.estimate import BYTES_PER_MB
from toolchain.telemetry.report import write_report
from toolchain.telemetry.summary import summarize

__all__ = ["CONFIG_KEYS", "FleetFiles", "fleet_document", "write_fleet"]

CONFIG_KEYS = ("model", "method", "backend", "seq_len", "rank", "lcsb_k", "quant", "compute", "optimizer")
_KILL_CODES = ("killed", "oom", "lmk")


class FleetFiles(NamedTuple):
    html: Path
    json: Path
    scatter: Path
    reports: tuple[Path, ...]


def _config(start: dict) -> dict[str, Any]:
    return {k: start.get(k) for k in CONFIG_KEYS}


_SHORT = {"seq_len": "T", "rank": "r", "lcsb_k": "LCSB k="}


def _config_text(config: dict) -> str:
    """e.g. 'qwen2.5-0.5b mesp executorch T256 r8 LCSB k=6 int4 adamw'."""
    parts = [f"{_SHORT[k]}{v}" if k in _SHORT else str(v)
             for k, v in config.items() if v is not None]
    return " ".join(parts) or "unknown"


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _killed(summary: dict, events: list[dict]) -> bool:
    codes = [str(e.get("code", "")) for e in events if e["type"] == "error"]
    return summary["status"] == "incomplete" or any(k in c for c in codes for k in _KILL_CODES)


def _run_row(run_id: str, events: list[dict]) -> dict:
    events = sorted(events, key=lambda e: e["seq"])
    start = next((e for e in events if e["type"] == "run_start"), {})
    summary = summarize(run_id, events)
    timestamps = [e["timestamp"] for e in events]
    return {"run_id": run_id, "device_model": start.get("device_model"), "platform": start.get("platform"),
            "config": _config(start), "status": summary["status"], "killed": _killed(summary, events),
            "first_timestamp": min(timestamps), "steps": summary["steps"], "final_loss": summary["final_loss"],
            "mean_step_time_s": summary["mean_step_time_s"], "low_memory_signals": summary["low_memory_signals"],
            "errors": summary["errors"], "peak_anon_bytes": summary["peak_anon_bytes"],
            "budget_bytes": summary["budget_bytes"], "peak_program_bytes": summary["peak_program_bytes"],
            "planner_estimate_bytes": summary["planner_estimate_bytes"], "planner_error": summary["planner_error"],
            "held_out_loss": summary["eval"][-1]["loss"] if summary["eval"] else None,
            "report": f"runs/{run_id}/index.html"}


def _groups(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["device_model"] or "?", tuple(row["config"].items())), []).append(row)
    out = []
    for (device, config), members in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        out.append({"device_model": device, "config": dict(config), "runs": len(members),
                    "completed": sum(r["status"] == "completed" for r in members),
                    "killed": sum(r["killed"] for r in members),
                    "failed": sum(r["status"] == "failed" for r in members),
                    "low_memory_signals": sum(r["low_memory_signals"] for r in members),
                    "median_step_time_s": _median(r["mean_step_time_s"] for r in members),
                    "median_peak_anon_bytes": _median(r["peak_anon_bytes"] for r in members),
                    "median_peak_program_bytes": _median(r["peak_program_bytes"] for r in members),
                    "median_planner_estimate_bytes": _median(r["planner_estimate_bytes"] for r in members),
                    "median_planner_error": _median(r["planner_error"] for r in members),
                    "run_ids": [r["run_id"] for r in members]})
    return out


def fleet_document(runs: list[tuple[str, list[dict]]], filters: dict | None = None) -> dict:
    """fleet.json of (run_id, events) pairs (see the module docstring)."""
    rows = sorted((_run_row(run_id, events) for run_id, events in runs if events),
                  key=lambda r: (r["first_timestamp"], r["run_id"]))
    return {"schema_version": 1, "generated_at": round(time.time(), 3), "filters": filters or {}, "runs": rows,
            "groups": _groups(rows), "reports": True}


def _mb(value) -> str:
    return "-" if value is None else f"{value / BYTES_PER_MB:,.1f} MB"


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _num(value, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def scatter_figure(rows: list[dict]):
    """Measured program-attributable peak against the planner's estimate, one point per run with both."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 5.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("Peak above the loaded runtime: measured vs planner")
    ax.set_xlabel("planner estimate (MB)")
    ax.set_ylabel("measured (MB)")
    ax.grid(True, alpha=0.3)
    pts = [(r["planner_estimate_bytes"] / BYTES_PER_MB, r["peak_program_bytes"] / BYTES_PER_MB, r)
           for r in rows if r["planner_estimate_bytes"] is not None and r["peak_program_bytes"] is not None]
    if not pts:
        ax.text(0.5, 0.5, "no run has both a baseline sample and a planner estimate", ha="center", va="center",
                transform=ax.transAxes, color="gray", wrap=True)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        return fig
    devices = sorted({r["device_model"] or "?" for _, _, r in pts})
    for device in devices:
        mine = [(x, y) for x, y, r in pts if (r["device_model"] or "?") == device]
        ax.plot(*zip(*mine), "o", markersize=7, label=device)
    top = max(max(x, y) for x, y, _ in pts) * 1.25
    ax.plot([0, top], [0, top], "-", color="gray", linewidth=1, label="measured = planner")
    for error in (0.3, -0.3):       # error = (planner - measured) / measured: measured = planner / (1 + error)
        ax.plot([0, top], [0, top / (1 + error)], ":", color="gray", linewidth=0.8)
    ax.text(top * 0.98, top * 0.98 / 1.3, "planner +30%", ha="right", va="top", fontsize=7, color="gray")
    ax.text(top * 0.7 * 0.98, top * 0.98, "planner -30%", ha="right", va="top", fontsize=7, color="gray")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def _html(doc: dict) -> str:
    esc = html.escape
    f = doc["filters"]
    shown = ", ".join(f"{k} {v}" for k, v in f.items() if v is not None) or "none"
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Fleet: training runs</title>"
             "<link rel='icon' href='data:,'>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto} table{border-collapse:collapse}"
             " th{text-align:left;padding-right:0.8em} td,th{border-bottom:1px solid #ddd;padding:2px 6px;"
             "vertical-align:top} td.n{text-align:right} img{max-width:100%}</style></head><body>",
             f"<h1>Fleet: {len(doc['runs'])} runs, {len(doc['groups'])} device/config groups</h1>",
             f"<p>Filters: {esc(shown)}. Data: <a href='fleet.json'>fleet.json</a>. Peak above baseline = the "
             f"measured program-attributable peak (above the run's loaded-runtime baseline sample); planner = the "
             f"planner's estimate of that same quantity (run_start planner_estimate_bytes); error = (planner - "
             f"measured) / measured. MB = 2^20 bytes.</p>",
             "<h2>Per device model and configuration</h2><table><tr><th>device</th><th>config</th><th>runs</th>"
             "<th>completed</th><th>killed</th><th>failed</th><th>low-memory signals</th><th>median step time</th>"
             "<th>median anon peak</th><th>median peak above baseline</th><th>median planner</th>"
             "<th>median planner error</th><th>runs</th></tr>"]
    for g in doc["groups"]:
        links = " ".join(f"<a href='runs/{esc(r)}/index.html'>{esc(r[:8])}</a>" if doc["reports"] else esc(r[:8])
                         for r in g["run_ids"])
        parts.append(
            f"<tr><td>{esc(g['device_model'])}</td><td>{esc(_config_text(g['config']))}</td>"
            f"<td class=n>{g['runs']}</td><td class=n>{g['completed']}</td><td class=n>{g['killed']}</td>"
            f"<td class=n>{g['failed']}</td><td class=n>{g['low_memory_signals']}</td>"
            f"<td class=n>{_num(g['median_step_time_s'], '{:.3f} s')}</td>"
            f"<td class=n>{_mb(g['median_peak_anon_bytes'])}</td><td class=n>{_mb(g['median_peak_program_bytes'])}</td>"
            f"<td class=n>{_mb(g['median_planner_estimate_bytes'])}</td>"
            f"<td class=n>{_pct(g['median_planner_error'])}</td><td>{links}</td></tr>")
    parts += ["</table>", "<h2>Measured vs predicted peak</h2>",
              "<p><img src='scatter.png' alt='measured vs planner scatter'></p>",
              "<h2>Runs</h2><table><tr><th>run</th><th>started (UTC)</th><th>device</th><th>model</th>"
              "<th>status</th><th>steps</th><th>final loss</th><th>held-out loss</th><th>mean step time</th>"
              "<th>anon peak</th><th>peak above baseline</th><th>planner</th><th>error</th>"
              "<th>low-memory</th></tr>"]
    def run_link(r: dict) -> str:
        return f"<a href='{esc(r['report'])}'>{esc(r['run_id'])}</a>" if r["report"] else esc(r["run_id"])

    for r in doc["runs"]:
        started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["first_timestamp"]))
        status = r["status"] + (" (killed)" if r["killed"] and r["status"] != "incomplete" else "")
        parts.append(
            f"<tr><td>{run_link(r)}</td><td>{started}</td>"
            f"<td>{esc(str(r['device_model']))}</td><td>{esc(str(r['config']['model']))}</td><td>{esc(status)}</td>"
            f"<td class=n>{r['steps']}</td><td class=n>{_num(r['final_loss'])}</td>"
            f"<td class=n>{_num(r['held_out_loss'])}</td><td class=n>{_num(r['mean_step_time_s'], '{:.3f} s')}</td>"
            f"<td class=n>{_mb(r['peak_anon_bytes'])}</td><td class=n>{_mb(r['peak_program_bytes'])}</td>"
            f"<td class=n>{_mb(r['planner_estimate_bytes'])}</td><td class=n>{_pct(r['planner_error'])}</td>"
            f"<td class=n>{r['low_memory_signals']}</td></tr>")
    parts.append("</table></body></html>\n")
    return "\n".join(parts)


def write_fleet(runs: Iterable[tuple[str, list[dict]]], out_dir: Path, *, filters: dict | None = None,
                reports: bool = True, replace: bool = False,
                on_run: Callable[[], None] | None = None) -> FleetFiles:
    """Write index.html, fleet.json, scatter.png and (with `reports`) every run's report under runs/ into
    `out_dir`, atomically (a non-empty `out_dir` is refused unless `replace`, the command's --force). `runs` is consumed one run at a time (the CLI reads each run's events from the store
    as it comes), so a fleet's events are never all in memory; each run's page draws its charts as SVG
    (`report.svg_figures`: milliseconds, where matplotlib's PNGs cost ~0.9 s of CPU a run). `on_run` is called
    after each run (a progress bar)."""
    import json

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out_dir = Path(out_dir)
    written, rows = [], []
    with atomic_dir(out_dir, replace=replace) as tmp:
        if reports:
            (tmp / "runs").mkdir()
        for run_id, events in runs:
            if not events:
                continue
            row = _run_row(run_id, events)
            if reports:
                write_report(run_id, events, tmp / "runs" / run_id, plots="svg", atomic=False)
                written.append(out_dir / "runs" / run_id / "index.html")
            else:
                row["report"] = None
            rows.append(row)
            if on_run is not None:
                on_run()
        rows.sort(key=lambda r: (r["first_timestamp"], r["run_id"]))
        doc = {"schema_version": 1, "generated_at": round(time.time(), 3), "filters": filters or {}, "runs": rows,
               "groups": _groups(rows), "reports": reports}
        FigureCanvasAgg(scatter_figure(doc["runs"])).print_png(str(tmp / "scatter.png"))
        (tmp / "fleet.json").write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n",
                                        encoding="utf-8")
        (tmp / "index.html").write_text(_html(doc), encoding="utf-8")
    return FleetFiles(out_dir / "index.html", out_dir / "fleet.json", out_dir / "scatter.png", tuple(written))
