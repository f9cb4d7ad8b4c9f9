"""The plots of one run's telemetry events (memory, loss, step time), as matplotlib figures or SVG text.

Plots use matplotlib's object API with the Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

import textwrap

from toolchain.memory.estimate import BYTES_PER_MB
from toolchain.memory.paper import paper_reference
from toolchain.telemetry.summary import (baseline_sample, event_times, events_of, finite_mean, low_memory, peak_sample,
                                         planner_estimate, program_peak, relative_error, sample_peak)

__all__ = ["memory_figure", "loss_figure", "step_time_figure", "svg_figures", "memory_notes", "moving_average"]


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
    start = (events_of(events, "run_start") or [{}])[0]
    memory = events_of(events, "memory")
    values = [e[k] / BYTES_PER_MB for e in memory for k in ("anon_bytes", "peak_bytes", "rss_bytes") if k in e]
    peak, _probe = peak_sample(memory)
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
        err = relative_error(estimate, program)
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

    start = (events_of(events, "run_start") or [{}])[0]
    times, memory = event_times(events), events_of(events, "memory")
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
    low = [times[e["seq"]] for e in memory if low_memory(e)]
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
                     if e["probe"] == probe and e.get("baseline") is not True and (p := sample_peak(e)) is not None)
        bx.plot(*zip(*pts), "-", color="tab:blue", label="measured above the baseline")
        bx.axhline(program / BYTES_PER_MB, color="tab:blue", linestyle="--", linewidth=1,
                   label=f"measured peak {_mb(program / BYTES_PER_MB)}")
        title = f"Program-attributable memory: measured peak {_mb(program / BYTES_PER_MB)}"
        if estimate is not None:
            bx.axhline(estimate / BYTES_PER_MB, color="purple", linestyle=":", linewidth=1.8,
                       label=f"planner estimate {_mb(estimate / BYTES_PER_MB)}")
            err = relative_error(estimate, program)
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
    steps = sorted((s for s in events_of(events, "step") if s["loss"] is not None), key=lambda s: s["step"])
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
    evals = sorted((e["step"], e["loss"]) for e in events_of(events, "eval") if e.get("loss") is not None)
    if evals:
        ax.plot(*zip(*evals), "s-", color="tab:red", markersize=5, linewidth=1.8, label="held-out loss (eval)")
    if not steps and not evals:
        _no_data(ax, "no finite loss")
    else:
        ax.legend(fontsize=8)
    return fig


def step_time_figure(events: list[dict]):
    steps = events_of(events, "step")
    fig, ax = _figure("Step time", "step", "seconds per step")
    if steps:
        ax.plot([s["step"] for s in steps], [s["step_time_s"] for s in steps], "-", marker=".")
        ax.set_title(f"Step time (mean {finite_mean(s['tokens_per_s'] for s in steps) or float('nan'):.1f} tokens/s)")
        ax.set_ylim(bottom=0)
    else:
        _no_data(ax, "no steps")
    return fig


def svg_figures(events: list[dict]) -> dict[str, str]:
    """The report's three charts as SVG text (toolchain/telemetry/svgplot.py), for the pages of `telemetry fleet`:
    memory (each probe's anon / peak / rss, the loaded-runtime baseline and the planner's estimate above it), loss
    (each step's, its moving average, the held-out loss) and step time."""
    from toolchain.telemetry.svgplot import svg_chart

    start = (events_of(events, "run_start") or [{}])[0]
    times, memory = event_times(events), events_of(events, "memory")
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
    steps = sorted((s for s in events_of(events, "step") if s["loss"] is not None), key=lambda s: s["step"])
    loss_series = []
    if steps:
        window = max(2, min(50, len(steps) // 20))
        loss_series = [("training loss (one row per step)", [(s["step"], s["loss"]) for s in steps], "points"),
                       (f"moving average ({window} steps)", list(zip([s["step"] for s in steps],
                        moving_average([s["loss"] for s in steps], window))), "line")]
    evals = sorted((e["step"], e["loss"]) for e in events_of(events, "eval") if e.get("loss") is not None)
    if evals:
        loss_series.append(("held-out loss (eval)", evals, "line+points"))
    all_steps = events_of(events, "step")
    mean_tps = finite_mean(s["tokens_per_s"] for s in all_steps)
    return {"memory.svg": memory_svg,
            "loss.svg": svg_chart("Loss", "step", "loss (nats per token)", loss_series, empty="no finite loss"),
            "step_time.svg": svg_chart(f"Step time (mean {mean_tps:.1f} tokens/s)" if mean_tps else "Step time",
                                       "step", "seconds per step",
                                       [("step time", [(s["step"], s["step_time_s"]) for s in all_steps],
                                         "line+points")] if all_steps else [], ymin=0.0, empty="no steps")}
