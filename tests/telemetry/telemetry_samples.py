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
