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

Plots use matplotlib's object API with the Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

import contextlib

import html
import math
import statistics
import textwrap
from pathlib import Path
from typing import NamedTuple

from toolchain.atomic import atomic_dir
from toolchain.errors import BadInput, SchemaError
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.paper import paper_reference
from toolchain.models.presets import PRESETS
from toolchain.schemas import write_json

__all__ = ["ReportFiles", "summarize", "memory_figure", "loss_figure", "step_time_figure", "write_report",
           "memory_notes", "moving_average", "baseline_sample", "planner_estimate", "program_peak"]


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


def _sample_peak(e: dict) -> int | None:
    keys = ("anon_bytes", "peak_bytes") if e["probe"] in _ANON_PEAK_PROBES else ("anon_bytes",)
    values = [e[k] for k in keys if k in e]
    return max(values) if values else None


def baseline_sample(events: list[dict]) -> dict | None:
    """The loaded-runtime baseline: the first memory event with `baseline: true` and an anon_bytes."""
    return next((e for e in _of(events, "memory") if e.get("baseline") is True and "anon_bytes" in e), None)


def planner_estimate(start: dict) -> tuple[int | None, str | None]:
    """The planner's estimate of the memory the run adds above its loaded-runtime baseline, and what it is:
    run_start's planner_estimate_bytes, else for an eager MeSP run of a preset the analytic step estimate
    with its calibrated overhead (what `toolchain bench memory` measures above its baseline)."""
    if isinstance(start.get("planner_estimate_bytes"), int):
        return start["planner_estimate_bytes"], start.get("planner_basis") or "logged by the run (run_start)"
    mb = _planner_mb(start) if start.get("backend") == "eager" else None
    return (None, None) if mb is None else (round(mb * BYTES_PER_MB), "analytic MeSP step estimate + overhead")


def program_peak(events: list[dict]) -> tuple[int | None, int | None]:
    """(baseline anon bytes, measured peak above it over the later samples of the baseline's probe)."""
    base = baseline_sample(events)
    if base is None:
        return None, None
    peaks = [p for e in _of(events, "memory") if e is not base and e["probe"] == base["probe"]
             and (p := _sample_peak(e)) is not None]
    return base["anon_bytes"], (max(0, max(peaks) - base["anon_bytes"]) if peaks else None)


def _error(estimate: int | None, measured: int | None) -> float | None:
    if estimate is None or not measured:
        return None
    return round((estimate - measured) / measured, 4)


def summarize(run_id: str, events: list[dict]) -> dict:
    """The run_summary document of a run's events (sorted by seq)."""
    start = (_of(events, "run_start") or [{}])[0]
    ends = _of(events, "run_end")
    steps = _of(events, "step")
    memory = _of(events, "memory")
    peak, probe = _peak_sample(memory)
    budget = start.get("budget_bytes")
    times = _times(events)
    base, program = program_peak(events)
    estimate, _basis = planner_estimate(start)
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
        "eval": [{"step": e["step"], "loss": e["loss"]} for e in sorted(_of(events, "eval"), key=lambda e: e["step"])],
        "baseline_bytes": base, "peak_program_bytes": program, "planner_estimate_bytes": estimate,
        "planner_error": _error(estimate, program),
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


def _within_reach(level_mb: float, lo: float, hi: float) -> bool:
    """A reference level is drawn when it does not squash the data: within [lo / 2, 2 hi] of the samples."""
    return lo / 2 <= level_mb <= 2 * hi


def _mb(x: float) -> str:
    return f"{x:,.0f} MB" if x >= 100 else f"{x:,.1f} MB"


def memory_notes(events: list[dict]) -> list[str]:
    """What the memory plot states in words: reference levels out of reach of the data, and the planner check."""
    return _memory_levels(events)[1]


def _memory_levels(events: list[dict]) -> tuple[list[tuple[str, float, str, str]], list[str]]:
    start = (_of(events, "run_start") or [{}])[0]
    memory = _of(events, "memory")
    values = [e[k] / BYTES_PER_MB for e in memory for k in ("anon_bytes", "peak_bytes", "rss_bytes") if k in e]
    peak, _probe = _peak_sample(memory)
    ref = paper_reference(start.get("model"), start.get("seq_len"), start.get("rank"))
    levels = [("budget", (start.get("budget_bytes") or 0) / BYTES_PER_MB or None, "red", "--"),
              ("MeSP (paper)", ref.get("mesp"), "green", "-."), ("MeBP (paper)", ref.get("mebp"), "orange", "-.")]
    drawn, words = [], []
    for label, mb, color, style in levels:
        if not mb:
            continue
        if values and _within_reach(mb, min(values), max(values)):
            drawn.append((label, mb, color, style))
        elif peak:
            words.append(f"{label} {_mb(mb)}, {mb / (peak / BYTES_PER_MB):,.1f}x the anon peak (not drawn: out of "
                         f"reach of the data)")
        else:
            words.append(f"{label} {_mb(mb)}")
    estimate, basis = planner_estimate(start)
    base, program = program_peak(events)
    if estimate is not None and base is not None and program is not None:
        err = _error(estimate, program)
        words.append(f"program-attributable peak (above the loaded-runtime baseline {_mb(base / BYTES_PER_MB)}): "
                     f"measured {_mb(program / BYTES_PER_MB)} vs planner {_mb(estimate / BYTES_PER_MB)}"
                     + ("" if err is None else f", planner error {err * 100:+.1f}%") + f" [planner: {basis}]")
    elif estimate is not None:
        words.append(f"planner estimate {_mb(estimate / BYTES_PER_MB)} of the memory the program adds above the "
                     f"loaded runtime [{basis}]: not compared, the run logged no baseline sample (memory event "
                     f"with baseline: true)")
    elif base is not None and program is not None:
        words.append(f"program-attributable peak {_mb(program / BYTES_PER_MB)} above the loaded-runtime baseline "
                     f"{_mb(base / BYTES_PER_MB)}; the run logged no planner estimate")
    return drawn, words


def memory_figure(events: list[dict]):
    """Memory over time, the axis fitted to the samples; reference levels (budget, the paper's MeSP/MeBP peaks)
    drawn when within reach of the data, else stated under the plot; with a loaded-runtime baseline, a second
    panel of the memory above it against the planner's estimate of that same quantity (a matplotlib Figure)."""
    from matplotlib.figure import Figure

    start = (_of(events, "run_start") or [{}])[0]
    times, memory = _times(events), _of(events, "memory")
    base, program = program_peak(events)
    estimate, _basis = planner_estimate(start)
    two = base is not None and program is not None
    fig = Figure(figsize=(9, 7.5 if two else 5), dpi=100, layout="constrained")
    axes = fig.subplots(2, 1, height_ratios=(3, 2)) if two else [fig.add_subplot()]
    ax = axes[0]
    ax.set_title(f"Memory: {start.get('model', '?')}, seq {start.get('seq_len', '?')}, "
                 f"{start.get('method', '?')} on {start.get('device_model', '?')}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("MB")
    ax.grid(True, alpha=0.3)
    values = []
    for probe in sorted({e["probe"] for e in memory}):
        for key, style in (("anon_bytes", "-"), ("peak_bytes", "--"), ("rss_bytes", ":")):
            points = [(times[e["seq"]], e[key] / BYTES_PER_MB) for e in memory if e["probe"] == probe and key in e]
            if points:
                xs, ys = zip(*sorted(points))
                values += ys
                ax.plot(xs, ys, style, marker="." if len(points) < 60 else None,
                        label=f"{probe} {key.removesuffix('_bytes')}")
    if not memory:
        _no_data(ax, "no memory samples")
    drawn, words = _memory_levels(events)
    for label, mb, color, style in drawn:
        values.append(mb)
        ax.axhline(mb, color=color, linestyle=style, linewidth=1.5, label=f"{label} {mb:.0f} MB")
    if two:
        ax.axhline(base / BYTES_PER_MB, color="gray", linestyle=":", linewidth=1.2,
                   label=f"loaded-runtime baseline {_mb(base / BYTES_PER_MB)}")
    if values:
        lo, hi = min(values), max(values)
        pad = max((hi - lo) * 0.08, hi * 0.01, 0.5)
        ax.set_ylim(max(0.0, lo - pad), hi + pad)
    low = [times[e["seq"]] for e in memory if _low_memory(e)]
    if low:
        ax.plot(low, [ax.get_ylim()[0]] * len(low), "x", color="red", markersize=9, clip_on=False,
                label="low-memory signal")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    if two:
        bx = axes[1]
        bx.grid(True, alpha=0.3)
        probe = baseline_sample(events)["probe"]
        pts = sorted((times[e["seq"]], (p - base) / BYTES_PER_MB) for e in memory
                     if e["probe"] == probe and e.get("baseline") is not True and (p := _sample_peak(e)) is not None)
        bx.plot(*zip(*pts), "-", color="tab:blue", label="measured above the baseline")
        bx.axhline(program / BYTES_PER_MB, color="tab:blue", linestyle="--", linewidth=1,
                   label=f"measured peak {_mb(program / BYTES_PER_MB)}")
        title = f"Program-attributable memory: measured peak {_mb(program / BYTES_PER_MB)}"
        if estimate is not None:
            bx.axhline(estimate / BYTES_PER_MB, color="purple", linestyle=":", linewidth=1.8,
                       label=f"planner estimate {_mb(estimate / BYTES_PER_MB)}")
            err = _error(estimate, program)
            title += f" vs planner {_mb(estimate / BYTES_PER_MB)}" + ("" if err is None else f" ({err * 100:+.1f}%)")
        ys = [y for _, y in pts] + [program / BYTES_PER_MB] + ([estimate / BYTES_PER_MB] if estimate else [])
        bx.set_ylim(min(0.0, min(ys)), max(ys) * 1.15 + 0.1)
        bx.set_title(title, fontsize=10)
        bx.set_xlabel("time (s)")
        bx.set_ylabel("MB above baseline")
        bx.legend(fontsize=8, loc="best")
    if words:   # the levels not drawn and the planner check, in words under the axes
        lines = [chunk for w in words for chunk in textwrap.wrap(w, 150)]
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=7.5, color="dimgray", va="bottom")
        bottom = (0.13 * len(lines) + 0.08) / fig.get_figheight()
        fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))
    return fig


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean of the last `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_figure(events: list[dict]):
    """Training loss as faint raw points (coloured by LCSB phase when there is one) with a moving average,
    and the held-out loss of `eval` events (at x = steps completed) on the same axes."""
    steps = sorted((s for s in _of(events, "step") if s["loss"] is not None), key=lambda s: s["step"])
    fig, ax = _figure("Loss", "step", "loss (nats per token)")
    phases = sorted({s["lcsb_phase"] for s in steps if "lcsb_phase" in s})
    if steps:
        if phases:
            for phase in phases:
                pts = [(s["step"], s["loss"]) for s in steps if s.get("lcsb_phase") == phase]
                ax.plot(*zip(*pts), "o", markersize=3, alpha=0.35, label=f"training loss, LCSB phase {phase}")
            warm = [(s["step"], s["loss"]) for s in steps if "lcsb_phase" not in s]  # a plan's warm-up steps
            if warm:
                ax.plot(*zip(*warm), "o", markersize=3, alpha=0.35, label="training loss, full-backprop warm-up")
        else:
            ax.plot([s["step"] for s in steps], [s["loss"] for s in steps], "o", markersize=2.5, color="tab:blue",
                    alpha=0.25, label="training loss (one row per step)")
        window = max(2, min(50, len(steps) // 20))
        ax.plot([s["step"] for s in steps], moving_average([s["loss"] for s in steps], window), "-",
                color="tab:blue", linewidth=2, label=f"moving average ({window} steps)")
    evals = sorted((e["step"], e["loss"]) for e in _of(events, "eval") if e.get("loss") is not None)
    if evals:
        ax.plot(*zip(*evals), "s-", color="tab:red", markersize=5, linewidth=1.8, label="held-out loss (eval)")
    if not steps and not evals:
        _no_data(ax, "no finite loss")
    else:
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


def svg_figures(events: list[dict]) -> dict[str, str]:
    """The report's three charts as SVG text (toolchain/telemetry/svgplot.py), for the pages of `telemetry fleet`:
    memory (each probe's anon / peak / rss, the loaded-runtime baseline and the planner's estimate above it), loss
    (each step's, its moving average, the held-out loss) and step time."""
    from toolchain.telemetry.svgplot import svg_chart

    start = (_of(events, "run_start") or [{}])[0]
    times, memory = _times(events), _of(events, "memory")
    series = []
    for probe in sorted({e["probe"] for e in memory}):
        for key in ("anon_bytes", "peak_bytes", "rss_bytes"):
            pts = sorted((times[e["seq"]], e[key] / BYTES_PER_MB) for e in memory if e["probe"] == probe and key in e)
            if pts:
                series.append((f"{probe} {key.removesuffix('_bytes')} (MB)", pts, "line"))
    base, program = program_peak(events)
    estimate, _basis = planner_estimate(start)
    levels = []
    if base is not None:
        levels.append((f"loaded-runtime baseline {_mb(base / BYTES_PER_MB)}", base / BYTES_PER_MB))
        if estimate is not None:
            levels.append((f"baseline + planner estimate {_mb(estimate / BYTES_PER_MB)}",
                           (base + estimate) / BYTES_PER_MB))
    memory_svg = svg_chart(f"Memory: {start.get('model', '?')}, seq {start.get('seq_len', '?')}, "
                           f"{start.get('method', '?')} on {start.get('device_model', '?')}", "time (s)", "MB",
                           series, levels, empty="no memory samples")
    steps = sorted((s for s in _of(events, "step") if s["loss"] is not None), key=lambda s: s["step"])
    loss_series = []
    if steps:
        window = max(2, min(50, len(steps) // 20))
        loss_series = [("training loss (one row per step)", [(s["step"], s["loss"]) for s in steps], "points"),
                       (f"moving average ({window} steps)", list(zip([s["step"] for s in steps],
                        moving_average([s["loss"] for s in steps], window))), "line")]
    evals = sorted((e["step"], e["loss"]) for e in _of(events, "eval") if e.get("loss") is not None)
    if evals:
        loss_series.append(("held-out loss (eval)", evals, "line+points"))
    all_steps = _of(events, "step")
    mean_tps = _mean(s["tokens_per_s"] for s in all_steps)
    return {"memory.svg": memory_svg,
            "loss.svg": svg_chart("Loss", "step", "loss (nats per token)", loss_series, empty="no finite loss"),
            "step_time.svg": svg_chart(f"Step time (mean {mean_tps:.1f} tokens/s)" if mean_tps else "Step time",
                                       "step", "seconds per step",
                                       [("step time", [(s["step"], s["step_time_s"]) for s in all_steps],
                                         "line+points")] if all_steps else [], ymin=0.0, empty="no steps")}


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
    start = (_of(events, "run_start") or [{}])[0]
    config = [(k, v) for k, v in start.items() if k not in ("schema_version", "type", "run_id", "seq")]
    errors = [(f"step {e.get('step', '-')}{' (fatal)' if e['fatal'] else ''}",
               f"{e.get('code', '')} {e['message']}" + "".join(f"\n  log: {line}" for line in e.get("log", [])))
              for e in _of(events, "error")]
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
             _table([(k, _fmt(k, v)) for k, v in summary.items() if k != "eval"])]
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
