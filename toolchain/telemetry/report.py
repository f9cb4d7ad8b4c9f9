"""Turn one run's telemetry events into a report a person reads: PNG plots, an HTML page, summary.json.

  memory.png     memory samples over time, per probe (anon = what the OS holds against the app;
                 dashed = the probe's peak), the axis fitted to the data; the run's budget and the MeSP/MeBP
                 peaks published for this model and sequence length drawn when within reach of the data,
                 else stated in words under the plot; low-memory signals as red marks. With a loaded-runtime
                 baseline (memory event `baseline: true`) a second panel: the memory above it (what the
                 program adds) against the planner's estimate of that same quantity, error in percent.
  loss.png       training loss per step as faint points (coloured by LCSB phase when there is one) with a
                 moving average, and the held-out loss of `eval` events (at x = steps completed).
  step_time.png  seconds per step.
  index.html     the plots, the summary and the run's configuration (run_start) in one page.
  summary.json   `shared_schemas/run_summary.schema.json`.

The numbers are `summary`'s, the plots `figures`'.
"""

from __future__ import annotations

import contextlib
import html
from pathlib import Path
from typing import NamedTuple

from toolchain.atomic import atomic_dir
from toolchain.errors import BadInput, SchemaError
from toolchain.memory.estimate import BYTES_PER_MB
from toolchain.schemas import write_json
from toolchain.telemetry.figures import loss_figure, memory_figure, memory_notes, step_time_figure, svg_figures
from toolchain.telemetry.summary import events_of, summarize

__all__ = ["ReportFiles", "write_report"]


class ReportFiles(NamedTuple):
    html: Path
    summary: Path
    plots: tuple[Path, ...]


def _save_png(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).print_png(str(path))


def _table(rows: list[tuple[str, object]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _fmt(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "planner_error" and isinstance(value, float):
        return f"{value * 100:+.1f}%"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / BYTES_PER_MB:.1f} MB"
    return str(value)


def _html(summary: dict, events: list[dict], plots: list[str]) -> str:
    start = (events_of(events, "run_start") or [{}])[0]
    config = [(k, v) for k, v in start.items() if k not in ("schema_version", "type", "run_id", "seq")]
    errors = [(f"step {e.get('step', '-')}{' (fatal)' if e['fatal'] else ''}",
               f"{e.get('code', '')} {e['message']}" + "".join(f"\n  log: {line}" for line in e.get("log", [])))
              for e in events_of(events, "error")]
    device = [(e["type"], ", ".join(f"{k}={v}" for k, v in e.items() if k not in (
        "schema_version", "type", "run_id", "seq", "timestamp", "elapsed_s"))) for e in events
        if e["type"] in ("thermal", "battery")]
    title = html.escape(f"Run {summary['run_id']}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
             "<link rel='icon' href='data:,'>",
             "<style>body{font-family:sans-serif;max-width:1000px;margin:auto} th{text-align:left;padding-right:1em}"
             " td,th{border-bottom:1px solid #ddd;vertical-align:top;white-space:pre-wrap} img{max-width:100%}"
             "</style></head><body>",
             f"<h1>{title}</h1>", "<h2>Summary</h2>",
             _table([(k, _fmt(k, v)) for k, v in summary.items() if k not in ("eval", "gate", "warnings",
                                                                                  "memory_adapted")])]
    parts += _gate_html(summary)
    notes = memory_notes(events)
    if notes:
        parts += ["<h2>Memory, in words</h2>", "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"]
    parts += [f"<p><img src='{html.escape(p)}' alt='{html.escape(p)}'></p>" for p in plots]
    if summary.get("eval"):
        parts += ["<h2>Held-out loss (eval events)</h2>",
                  _table([(f"step {e['step']}", "-" if e["loss"] is None else f"{e['loss']:.4f}")
                          for e in summary["eval"]])]
    parts += ["<h2>Configuration (run_start)</h2>", _table(config) if config else "<p>no run_start event</p>"]
    if errors:
        parts += ["<h2>Errors</h2>", _table(errors)]
    if device:
        parts += ["<h2>Thermal and battery</h2>", _table(device)]
    parts.append("<p>Memory in MB = 2^20 bytes. Paper levels: MeSP paper (arXiv 2602.13069), iOS phys_footprint, "
                 "rank 8 unless the run's rank was reported.</p></body></html>\n")
    return "\n".join(parts)


def _gate_html(summary: dict) -> list[str]:
    """The evaluation gate's decision, the warnings, and the memory adaptations (docs/training.md)."""
    parts = []
    gate = summary.get("gate")
    if gate is not None:
        rows = [("decision", gate["decision"]), ("why", gate["reason"])]
        rows += [(k, _fmt(k, gate.get(k))) for k in ("start_loss", "end_loss", "best_loss", "best_step", "kept_step")]
        if gate.get("probe") == "measured":
            rows += [("probe", f"{_fmt('', gate.get('probe_start_loss'))} -> {_fmt('', gate.get('probe_end_loss'))}"
                               f" (forgetting flagged above {(gate.get('probe_threshold') or 0) * 100:g}%: "
                               f"{'yes' if gate.get('forgetting') else 'no'})")]
        else:
            rows.append(("probe", "no probe (an eager run, or a program exported without one)"))
        parts += ["<h2>Evaluation gate</h2>", _table(rows)]
    if summary.get("warnings"):
        parts += ["<h2>Warnings</h2>", "<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in summary["warnings"])
                  + "</ul>"]
    if summary.get("memory_adapted"):
        parts += ["<h2>Memory pressure: the working set lowered</h2>",
                  _table([(f"before step {a['step'] + 1}",
                           f"{a['knob']} {a['from'].get(a['knob'])} -> {a['to'].get(a['knob'])} "
                           f"(peak {_fmt('measured_bytes', a['measured_bytes'])} over the "
                           f"{_fmt('budget_bytes', a['budget_bytes'])} budget, {a.get('trigger', 'measured')})")
                          for a in summary["memory_adapted"]])]
    return parts


def _holds_null(value) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_holds_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_null(v) for v in value)
    return False


def _check_stored(run_id: str, events: list[dict]) -> None:
    """Events as read back from a store must still be valid events: a store written by an older version
    may hold non-finite numbers (read back as null), which no plot or summary can use."""
    from toolchain.telemetry.events import InvalidBatch, check_events

    # Every stored event was valid when stored; what a store can give back changed is a non-finite number an
    # older version stored, read back as null. Only events holding a null are validated again (the schema
    # validation of every event was ~80% of a fleet's time).
    suspects = [i for i, e in enumerate(events) if _holds_null(e)]
    try:
        check_events([events[i] for i in suspects])
    except InvalidBatch as e:
        first = suspects[min(e.errors)]
        seq = events[first].get("seq", first) if isinstance(events[first], dict) else first
        raise SchemaError(f"run {run_id!r}: stored event seq {seq} is not a valid event "
                          f"({e.errors[min(e.errors)][0]}); "
                          f"it was stored by an older version (non-finite numbers): delete the run's events or "
                          f"re-import the run from its JSONL file") from None


@contextlib.contextmanager
def _made(path: Path):
    path.mkdir()
    yield path


def write_report(run_id: str, events: list[dict], out_dir: Path, *, plots: str = "png",
                 atomic: bool = True, replace: bool = False) -> ReportFiles:
    """Write plots, index.html and summary.json for one run into `out_dir` (atomically: a failure
    leaves no partial directory; a non-empty `out_dir` is refused unless `replace`, the command's --force).
    `plots`: "png" (matplotlib, ~0.9 s of CPU a run) or "svg" (svg_figures, a
    few ms: the pages of `telemetry fleet`). `atomic=False`: `out_dir` is made in place (inside a directory
    that is itself written atomically, as the fleet's).

    Raises:
        BadInput: there are no events.
    """
    if not events:
        raise BadInput(f"run {run_id!r} has no events; list runs with `toolchain telemetry runs`")
    _check_stored(run_id, events)
    events = sorted(events, key=lambda e: e["seq"])
    summary = summarize(run_id, events)
    out_dir = Path(out_dir)
    if plots == "svg":
        figures = svg_figures(events)
    else:
        figures = {"memory.png": memory_figure(events), "loss.png": loss_figure(events),
                   "step_time.png": step_time_figure(events)}
    with atomic_dir(out_dir, replace=replace) if atomic else _made(out_dir) as tmp:
        for name, fig in figures.items():
            if isinstance(fig, str):
                (tmp / name).write_text(fig, encoding="utf-8")
            else:
                _save_png(fig, tmp / name)
        write_json(tmp / "summary.json", "run_summary", summary)
        (tmp / "index.html").write_text(_html(summary, events, list(figures)), encoding="utf-8")
    return ReportFiles(out_dir / "index.html", out_dir / "summary.json", tuple(out_dir / n for n in figures))
