"""Turn one run's telemetry events into a report a person reads: PNG plots, an HTML page, summary.json.

  memory.png     memory samples over time, per probe (anon = what the OS holds against the app;
                 dashed = the probe's peak), the run's budget, the MeSP/MeBP peaks published for
                 this model and sequence length, and our planner's estimate; low-memory signals
                 as red marks on the time axis.
  loss.png       loss per step (coloured by LCSB phase when there is one) and, beside it, the held-out
                 loss of `eval` events (at x = steps completed: the adapter the next step starts from).
  step_time.png  seconds per step.
  index.html     the plots, the summary and the run's configuration (run_start) in one page.
  summary.json   `shared_schemas/run_summary.schema.json`.

Plots use matplotlib's object API with the Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

import html
import math
import statistics
from pathlib import Path
from typing import NamedTuple

from toolchain.atomic import atomic_dir
from toolchain.errors import BadInput, SchemaError
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.paper import paper_reference
from toolchain.models.presets import PRESETS
from toolchain.schemas import write_json

__all__ = ["ReportFiles", "summarize", "memory_figure", "loss_figure", "step_time_figure", "write_report"]


class ReportFiles(NamedTuple):
    html: Path
    summary: Path
    plots: tuple[Path, ...]


def _of(events: list[dict], type_: str) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def _times(events: list[dict]) -> dict[int, float]:
    """seq -> seconds since the run's first event: elapsed_s when every event has it (monotonic),
    else wall-clock timestamps."""
    if all("elapsed_s" in e for e in events):
        return {e["seq"]: e["elapsed_s"] for e in events}
    t0 = min(e["timestamp"] for e in events)
    return {e["seq"]: e["timestamp"] - t0 for e in events}


# Probes whose `peak_bytes` is a peak of anonymous/footprint memory; android_proc_status's is VmHWM,
# a peak of the whole RSS (file pages included), so only its anon_bytes (RssAnon) count.
_ANON_PEAK_PROBES = ("ios_phys_footprint", "linux_proc_status")


def _peak_sample(memory: list[dict]) -> tuple[int | None, str | None]:
    best, probe = None, None
    for e in memory:
        keys = ("anon_bytes", "peak_bytes") if e["probe"] in _ANON_PEAK_PROBES else ("anon_bytes",)
        for key in keys:
            if key in e and (best is None or e[key] > best):
                best, probe = e[key], e["probe"]
    return best, probe


def _finite(x: float | None) -> float | None:
    """Sums of finite values can overflow (1e308 + 1e308): a summary never holds a non-finite number."""
    return x if x is None or math.isfinite(x) else None


def _mean(values) -> float | None:
    values = list(values)
    if not values:
        return None
    try:
        return _finite(statistics.fmean(values))
    except (OverflowError, ValueError):
        return None


def _low_memory(e: dict) -> bool:
    return e.get("low_memory") is True or e.get("pressure") in ("warning", "critical")


def summarize(run_id: str, events: list[dict]) -> dict:
    """The run_summary document of a run's events (sorted by seq)."""
    start = (_of(events, "run_start") or [{}])[0]
    ends = _of(events, "run_end")
    steps = _of(events, "step")
    memory = _of(events, "memory")
    peak, probe = _peak_sample(memory)
    budget = start.get("budget_bytes")
    times = _times(events)
    return {
        "schema_version": 1, "run_id": run_id, "events": len(events),
        "status": ends[-1]["status"] if ends else "incomplete",
        **{k: start.get(k) for k in ("model", "method", "backend", "platform", "device_model", "os", "seq_len", "rank",
                                     "lcsb_k", "total_ram_bytes", "budget_bytes")},
        "steps": len(steps),
        "final_loss": steps[-1]["loss"] if steps else None,
        "mean_step_time_s": _mean(s["step_time_s"] for s in steps),
        "mean_tokens_per_s": _mean(s["tokens_per_s"] for s in steps),
        "peak_anon_bytes": peak, "peak_probe": probe,
        "within_budget": None if peak is None or budget is None else peak <= budget,
        "duration_s": _finite(max(times.values()) - min(times.values())) if times else None,
        "errors": len(_of(events, "error")),
        "low_memory_signals": sum(_low_memory(e) for e in memory),
        "reference_mb": paper_reference(start.get("model"), start.get("seq_len"), start.get("rank")),
    }


def _planner_mb(start: dict) -> float | None:
    """Our analytic estimate for a MeSP run of a known preset (None otherwise)."""
    arch = PRESETS.get(start.get("model", ""))
    if arch is None or start.get("method") != "mesp" or "seq_len" not in start:
        return None
    shape = StepShape(arch, start["seq_len"], start["rank"], lcsb_k=start.get("lcsb_k"),
                      optimizer=start.get("optimizer", "sgd"))
    return estimate_peak(shape).peak_mb


def _figure(title: str, xlabel: str, ylabel: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def memory_figure(events: list[dict]):
    """Memory over time with the budget and the reference levels (a matplotlib Figure)."""
    start = (_of(events, "run_start") or [{}])[0]
    fig, ax = _figure(f"Memory: {start.get('model', '?')}, seq {start.get('seq_len', '?')}, "
                      f"{start.get('method', '?')} on {start.get('device_model', '?')}", "time (s)", "MB")
    times, memory = _times(events), _of(events, "memory")
    for probe in sorted({e["probe"] for e in memory}):
        for key, style in (("anon_bytes", "-"), ("peak_bytes", "--"), ("rss_bytes", ":")):
            points = [(times[e["seq"]], e[key] / BYTES_PER_MB) for e in memory if e["probe"] == probe and key in e]
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, style, marker=".", label=f"{probe} {key.removesuffix('_bytes')}")
    if not memory:
        _no_data(ax, "no memory samples")
    levels = [("budget", start.get("budget_bytes", 0) / BYTES_PER_MB or None, "red", "--")]
    ref = paper_reference(start.get("model"), start.get("seq_len"), start.get("rank"))
    levels += [("MeSP (paper)", ref.get("mesp"), "green", "-."), ("MeBP (paper)", ref.get("mebp"), "orange", "-."),
               ("planner estimate", _planner_mb(start), "purple", ":")]
    for label, mb, color, style in levels:
        if mb:
            ax.axhline(mb, color=color, linestyle=style, linewidth=1.5, label=f"{label} {mb:.0f} MB")
    low = [times[e["seq"]] for e in memory if _low_memory(e)]
    if low:
        ax.plot(low, [0] * len(low), "x", color="red", markersize=9, clip_on=False, label="low-memory signal")
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    return fig


def loss_figure(events: list[dict]):
    steps = [s for s in _of(events, "step") if s["loss"] is not None]
    fig, ax = _figure("Loss", "step", "loss")
    phases = sorted({s["lcsb_phase"] for s in steps if "lcsb_phase" in s})
    if steps:
        ax.plot([s["step"] for s in steps], [s["loss"] for s in steps], "-", color="gray", alpha=0.6, label="loss")
    for phase in phases:
        pts = [(s["step"], s["loss"]) for s in steps if s.get("lcsb_phase") == phase]
        ax.plot(*zip(*pts), "o", markersize=3, label=f"LCSB phase {phase}")
    evals = sorted((e["step"], e["loss"]) for e in _of(events, "eval") if e.get("loss") is not None)
    if evals:
        ax.plot(*zip(*evals), "s-", color="tab:red", markersize=4, label="held-out loss (eval)")
    if not steps and not evals:
        _no_data(ax, "no finite loss")
    elif phases or evals:
        ax.legend(fontsize=8)
    return fig


def step_time_figure(events: list[dict]):
    steps = _of(events, "step")
    fig, ax = _figure("Step time", "step", "seconds per step")
    if steps:
        ax.plot([s["step"] for s in steps], [s["step_time_s"] for s in steps], "-", marker=".")
        ax.set_title(f"Step time (mean {_mean(s['tokens_per_s'] for s in steps) or float('nan'):.1f} tokens/s)")
        ax.set_ylim(bottom=0)
    else:
        _no_data(ax, "no steps")
    return fig


def _save_png(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).print_png(str(path))


def _table(rows: list[tuple[str, object]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _fmt(key: str, value) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / BYTES_PER_MB:.1f} MB"
    return str(value)


def _html(summary: dict, events: list[dict], plots: list[str]) -> str:
    start = (_of(events, "run_start") or [{}])[0]
    config = [(k, v) for k, v in start.items() if k not in ("schema_version", "type", "run_id", "seq")]
    errors = [(f"step {e.get('step', '-')}{' (fatal)' if e['fatal'] else ''}", f"{e.get('code', '')} {e['message']}")
              for e in _of(events, "error")]
    device = [(e["type"], ", ".join(f"{k}={v}" for k, v in e.items() if k not in (
        "schema_version", "type", "run_id", "seq", "timestamp", "elapsed_s"))) for e in events
        if e["type"] in ("thermal", "battery")]
    title = html.escape(f"Run {summary['run_id']}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
             "<style>body{font-family:sans-serif;max-width:1000px;margin:auto} th{text-align:left;padding-right:1em}"
             " td,th{border-bottom:1px solid #ddd;vertical-align:top} img{max-width:100%}</style></head><body>",
             f"<h1>{title}</h1>", "<h2>Summary</h2>", _table([(k, _fmt(k, v)) for k, v in summary.items()])]
    parts += [f"<p><img src='{html.escape(p)}' alt='{html.escape(p)}'></p>" for p in plots]
    parts += ["<h2>Configuration (run_start)</h2>", _table(config) if config else "<p>no run_start event</p>"]
    if errors:
        parts += ["<h2>Errors</h2>", _table(errors)]
    if device:
        parts += ["<h2>Thermal and battery</h2>", _table(device)]
    parts.append("<p>Memory in MB = 2^20 bytes. Paper levels: MeSP paper (arXiv 2602.13069), iOS phys_footprint, "
                 "rank 8 unless the run's rank was reported.</p></body></html>\n")
    return "\n".join(parts)


def _check_stored(run_id: str, events: list[dict]) -> None:
    """Events as read back from a store must still be valid events: a store written by an older version
    may hold non-finite numbers (read back as null), which no plot or summary can use."""
    from toolchain.telemetry.events import InvalidBatch, check_events

    try:
        check_events(events)
    except InvalidBatch as e:
        first = min(e.errors)
        seq = events[first].get("seq", first) if isinstance(events[first], dict) else first
        raise SchemaError(f"run {run_id!r}: stored event seq {seq} is not a valid event ({e.errors[first][0]}); "
                          f"it was stored by an older version (non-finite numbers): delete the run's events or "
                          f"re-import the run from its JSONL file") from None


def write_report(run_id: str, events: list[dict], out_dir: Path) -> ReportFiles:
    """Write plots, index.html and summary.json for one run into `out_dir` (atomically: a failure
    leaves no partial directory).

    Raises:
        BadInput: there are no events.
    """
    if not events:
        raise BadInput(f"run {run_id!r} has no events; list runs with `toolchain telemetry runs`")
    _check_stored(run_id, events)
    events = sorted(events, key=lambda e: e["seq"])
    summary = summarize(run_id, events)
    figures = {"memory.png": memory_figure(events), "loss.png": loss_figure(events),
               "step_time.png": step_time_figure(events)}
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        for name, fig in figures.items():
            _save_png(fig, tmp / name)
        write_json(tmp / "summary.json", "run_summary", summary)
        (tmp / "index.html").write_text(_html(summary, events, list(figures)), encoding="utf-8")
    return ReportFiles(out_dir / "index.html", out_dir / "summary.json", tuple(out_dir / n for n in figures))
