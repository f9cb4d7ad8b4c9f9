"""Event builders shared by the telemetry tests."""

from __future__ import annotations

from pathlib import Path

FIXTURE_RUN = Path(__file__).resolve().parent / "data" / "tiny_host_run.jsonl"   # see make_fixture.py
FIXTURE_RUN_ID = "tiny-host-fixture-0001"


def step_event(seq: int, run_id: str = "r1", **over) -> dict:
    return {"schema_version": 1, "type": "step", "run_id": run_id, "seq": seq, "timestamp": 1767225600.0 + seq,
            "step": seq, "loss": 2.5, "step_time_s": 0.5, "tokens_per_s": 512.0, **over}


def run_start_event(run_id: str = "r2", seq: int = 0, **over) -> dict:
    return {"schema_version": 1, "type": "run_start", "run_id": run_id, "seq": seq, "timestamp": 1.0, "model": "tiny",
            "method": "mesp", "backend": "eager", "seq_len": 8, "rank": 2, "platform": "linux", "device_model": "host",
            "os": "Linux", "total_ram_bytes": 1 << 30, "budget_bytes": 1 << 28, **over}


def baseline_run(run_id: str = "host-baseline-run", steps: int = 40) -> list[dict]:
    """A host run with what the like-for-like planner check needs: a loaded-runtime baseline sample, the
    planner's estimate in run_start, per-step memory (anon + peak) and eval events. Numbers are made up,
    of the demo's size (baseline 281 MB, program ~7.5 MB, planner 6.1 MB)."""
    mb = 1 << 20
    events = [run_start_event(run_id, model="demo", backend="executorch", seq_len=128, rank=8, optimizer="adamw",
                              steps_planned=steps, budget_bytes=24105 * mb, total_ram_bytes=24105 * mb,
                              planner_estimate_bytes=round(6.1 * mb), planner_basis="plan fit --program host figure"),
              {"schema_version": 1, "type": "memory", "run_id": run_id, "seq": 1, "timestamp": 1.5,
               "probe": "linux_proc_status", "baseline": True, "anon_bytes": 281 * mb, "rss_bytes": 365 * mb}]
    for s in range(steps):
        seq = len(events)
        events.append(step_event(seq, run_id, step=s, loss=2.0 - s / steps + 0.2 * ((s * 7) % 5) / 5,
                                 timestamp=2.0 + s))
        events.append({"schema_version": 1, "type": "memory", "run_id": run_id, "seq": seq + 1,
                       "timestamp": 2.0 + s + 0.5, "probe": "linux_proc_status", "step": s,
                       "anon_bytes": 281 * mb + round((7.2 + s / steps * 0.3) * mb),
                       "peak_bytes": 281 * mb + round((7.4 + s / steps * 0.3) * mb)})
        if s % 10 == 0 or s + 1 == steps:
            events.append({"schema_version": 1, "type": "eval", "run_id": run_id, "seq": seq + 2,
                           "timestamp": 2.0 + s + 0.7, "step": s + 1 if s else 0, "loss": 2.1 - s / steps,
                           "rows": 8, "tokens": 970})
    events.append({"schema_version": 1, "type": "run_end", "run_id": run_id, "seq": len(events),
                   "timestamp": 3.0 + steps, "status": "completed", "steps_completed": steps})
    return events
