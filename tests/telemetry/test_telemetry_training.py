"""What the trainers log for the report's like-for-like planner check: the loaded-runtime baseline (a
`memory` event with `baseline: true` right after run_start) and, when asked, peak_bytes per step."""

from __future__ import annotations

import torch
from helpers import small_arch

from toolchain.text.dataset import DataRow
from toolchain.lora import LoraConfig, init_lora
from toolchain.models import random_weights
from toolchain.telemetry.events import read_jsonl
from toolchain.telemetry.summary import summarize
from toolchain.training import EagerTrainer, TrainRun


def _trainer(tmp_path, **attrs) -> EagerTrainer:
    arch = small_arch(tied=True)
    cfg = LoraConfig(rank=2, alpha=4)
    ids = torch.arange(12) % arch.vocab
    trainer = EagerTrainer(arch, random_weights(arch, seed=0), cfg, init_lora(arch, cfg, seed=0),
                           [DataRow(ids, ids.clone())], TrainRun(steps=2, telemetry=tmp_path / "t.jsonl"))
    for k, v in attrs.items():
        setattr(trainer, k, v)
    return trainer


def test_the_baseline_is_logged_after_run_start_and_steps_carry_the_peak(tmp_path):
    base = {"probe": "linux_proc_status", "anon_bytes": 1 << 20, "rss_bytes": 2 << 20}
    _trainer(tmp_path, baseline=base, memory_peak=True).run()
    events = read_jsonl(tmp_path / "t.jsonl")
    assert [e["type"] for e in events[:2]] == ["run_start", "memory"]
    assert events[1]["baseline"] is True and events[1]["anon_bytes"] == 1 << 20 and "step" not in events[1]
    steps = [e for e in events if e["type"] == "memory" and not e.get("baseline")]
    assert len(steps) == 2 and all("peak_bytes" in e and e["peak_bytes"] >= 0 for e in steps)
    summary = summarize(events[0]["run_id"], events)
    assert summary["baseline_bytes"] == 1 << 20 and summary["peak_program_bytes"] > 0


def test_without_a_baseline_nothing_changes(tmp_path):
    _trainer(tmp_path).run()
    events = read_jsonl(tmp_path / "t.jsonl")
    memory = [e for e in events if e["type"] == "memory"]
    assert memory and not any("baseline" in e or "peak_bytes" in e for e in memory)
