"""The numbers of one run's telemetry events: `summarize` (summary.json, `shared_schemas/run_summary.schema.json`)
and the memory figures it and the plots share (the loaded-runtime baseline, the program's peak above it, the
planner's estimate of that peak)."""

from __future__ import annotations

import math
import statistics

from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.paper import paper_reference
from toolchain.models.presets import PRESETS

__all__ = ["gate_summary", "gate_warnings", "summarize", "baseline_sample", "planner_estimate", "program_peak", "events_of", "event_times",
           "peak_sample", "sample_peak", "finite_mean", "low_memory", "relative_error", "planner_mb"]


def events_of(events: list[dict], type_: str) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def event_times(events: list[dict]) -> dict[int, float]:
    """seq -> seconds since the run's first event: elapsed_s when every event has it (monotonic),
    else wall-clock timestamps."""
    if all("elapsed_s" in e for e in events):
        return {e["seq"]: e["elapsed_s"] for e in events}
    t0 = min(e["timestamp"] for e in events)
    return {e["seq"]: e["timestamp"] - t0 for e in events}


# Probes whose `peak_bytes` is a peak of anonymous/footprint memory; android_proc_status's is VmHWM,
# a peak of the whole RSS (file pages included), so only its anon_bytes (RssAnon) count.
_ANON_PEAK_PROBES = ("ios_phys_footprint", "linux_proc_status")


def peak_sample(memory: list[dict]) -> tuple[int | None, str | None]:
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


def finite_mean(values) -> float | None:
    values = list(values)
    if not values:
        return None
    try:
        return _finite(statistics.fmean(values))
    except (OverflowError, ValueError):
        return None


def low_memory(e: dict) -> bool:
    return e.get("low_memory") is True or e.get("pressure") in ("warning", "critical")


def sample_peak(e: dict) -> int | None:
    keys = ("anon_bytes", "peak_bytes") if e["probe"] in _ANON_PEAK_PROBES else ("anon_bytes",)
    values = [e[k] for k in keys if k in e]
    return max(values) if values else None


def baseline_sample(events: list[dict]) -> dict | None:
    """The loaded-runtime baseline: the first memory event with `baseline: true` and an anon_bytes."""
    return next((e for e in events_of(events, "memory") if e.get("baseline") is True and "anon_bytes" in e), None)


def planner_estimate(start: dict) -> tuple[int | None, str | None]:
    """The planner's estimate of the memory the run adds above its loaded-runtime baseline, and what it is:
    run_start's planner_estimate_bytes, else for an eager MeSP run of a preset the analytic step estimate
    with its calibrated overhead (what `toolchain bench memory` measures above its baseline)."""
    if isinstance(start.get("planner_estimate_bytes"), int):
        return start["planner_estimate_bytes"], start.get("planner_basis") or "logged by the run (run_start)"
    mb = planner_mb(start) if start.get("backend") == "eager" else None
    return (None, None) if mb is None else (round(mb * BYTES_PER_MB), "analytic MeSP step estimate + overhead")


def program_peak(events: list[dict]) -> tuple[int | None, int | None]:
    """(baseline anon bytes, measured peak above it over the later samples of the baseline's probe)."""
    base = baseline_sample(events)
    if base is None:
        return None, None
    peaks = [p for e in events_of(events, "memory") if e is not base and e["probe"] == base["probe"]
             and (p := sample_peak(e)) is not None]
    return base["anon_bytes"], (max(0, max(peaks) - base["anon_bytes"]) if peaks else None)


def relative_error(estimate: int | None, measured: int | None) -> float | None:
    if estimate is None or not measured:
        return None
    return round((estimate - measured) / measured, 4)


def summarize(run_id: str, events: list[dict]) -> dict:
    """The run_summary document of a run's events (sorted by seq)."""
    start = (events_of(events, "run_start") or [{}])[0]
    ends = events_of(events, "run_end")
    steps = events_of(events, "step")
    memory = events_of(events, "memory")
    peak, probe = peak_sample(memory)
    budget = start.get("budget_bytes")
    times = event_times(events)
    base, program = program_peak(events)
    estimate, _basis = planner_estimate(start)
    gate = gate_summary(events)
    return {
        "schema_version": 1, "run_id": run_id, "events": len(events),
        "status": ends[-1]["status"] if ends else "incomplete",
        **{k: start.get(k) for k in ("model", "method", "backend", "platform", "device_model", "os", "seq_len", "rank",
                                     "lcsb_k", "total_ram_bytes", "budget_bytes")},
        "steps": len(steps),
        "final_loss": steps[-1]["loss"] if steps else None,
        "mean_step_time_s": finite_mean(s["step_time_s"] for s in steps),
        "mean_tokens_per_s": finite_mean(s["tokens_per_s"] for s in steps),
        "peak_anon_bytes": peak, "peak_probe": probe,
        "within_budget": None if peak is None or budget is None else peak <= budget,
        "duration_s": _finite(max(times.values()) - min(times.values())) if times else None,
        "errors": len(events_of(events, "error")),
        "low_memory_signals": sum(low_memory(e) for e in memory),
        "reference_mb": paper_reference(start.get("model"), start.get("seq_len"), start.get("rank")),
        "eval": [{"step": e["step"], "loss": e["loss"]} for e in sorted(events_of(events, "eval"), key=lambda e: e["step"])],
        "baseline_bytes": base, "peak_program_bytes": program, "planner_estimate_bytes": estimate,
        "planner_error": relative_error(estimate, program),
        "gate": gate, "warnings": gate_warnings(gate),
        "memory_adapted": [{k: e[k] for k in _ADAPTED_KEYS if k in e}
                           for e in sorted(events_of(events, "memory_adapted"), key=lambda e: e["step"])],
    }


_GATE_KEYS = ("decision", "start_loss", "end_loss", "best_loss", "best_step", "kept_step", "reason", "probe",
              "probe_start_loss", "probe_end_loss", "probe_rise", "probe_threshold", "forgetting")
_ADAPTED_KEYS = ("step", "knob", "from", "to", "measured_bytes", "budget_bytes", "trigger")


def gate_summary(events: list[dict]) -> dict | None:
    """The run's last `gate` event as summary.json's `gate` (None: no gate event)."""
    gates = events_of(events, "gate")
    if not gates:
        return None
    g = gates[-1]
    return {k: g.get(k) for k in _GATE_KEYS}


def gate_warnings(gate: dict | None) -> list[str]:
    """The gate's warnings for a person: forgetting flagged by the probe (not a rollback: docs/training.md)."""
    if gate is None or not gate.get("forgetting"):
        return []
    start, end, rise = gate.get("probe_start_loss"), gate.get("probe_end_loss"), gate.get("probe_rise")
    moved = f"{start:.4f} -> {end:.4f}" if start is not None and end is not None else "to a non-finite loss"
    by = f" {rise * 100:.1f}%" if rise is not None else ""
    return [f"forgetting: the general-text probe's loss rose{by} ({moved}), above the "
            f"{(gate.get('probe_threshold') or 0) * 100:g}% threshold (a warning: the adapter was kept)"]


def planner_mb(start: dict) -> float | None:
    """Our analytic estimate for a MeSP run of a known preset (None otherwise)."""
    arch = PRESETS.get(start.get("model", ""))
    if arch is None or start.get("method") != "mesp" or "seq_len" not in start:
        return None
    shape = StepShape(arch, start["seq_len"], start["rank"], lcsb_k=start.get("lcsb_k"),
                      optimizer=start.get("optimizer", "sgd"))
    return estimate_peak(shape).peak_mb
