"""Adapting to memory pressure (memory/fallback.py, training/pressure.py, loop.py): the ladder's order and its
planner check; a run whose measured step peaks are over the budget lowers its working set one notch at a time
(one `memory_adapted` event each) and completes, or stops with a checkpoint and one message when nothing smaller
is left; and (slow) on the real /proc measurement, a budget between the adapted and the default peak, both
measured first, is met by adapting instead of stopping."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ARCH, CFG, OPTIMIZER, examples

from toolchain.errors import BadInput
from toolchain.memory.fallback import WorkingSet, fallback_ladder, next_notch, notch
from toolchain.memory.measure import MIB
from toolchain.models import random_weights
from toolchain.lora import init_lora
from toolchain.program import ProgramDir
from toolchain.runtime import EagerRuntime
from toolchain.text.dataset import DataRow
from toolchain.training import EagerTrainer, ProgramTrainer, TrainRun
from toolchain.training.checkpoint import load_checkpoint
from toolchain.training.pressure import MemoryGuard


def test_each_knob_lowers_one_notch_until_its_floor():
    ws = WorkingSet(1, None, 64)
    assert notch(ws, "layers_per_checkpoint", 8) == WorkingSet(2, None, 64)
    assert notch(WorkingSet(8, None, 64), "layers_per_checkpoint", 8) is None        # one group: nothing left
    assert notch(ws, "lcsb_k", 8) == WorkingSet(1, 4, 64)
    assert notch(WorkingSet(4, 4, 64), "lcsb_k", 8) == WorkingSet(2, 2, 64)          # groups no larger than k
    assert notch(WorkingSet(1, 1, 64), "lcsb_k", 8) is None
    assert notch(ws, "seq_len", 8) == WorkingSet(1, None, 32)
    assert notch(WorkingSet(1, None, 16), "seq_len", 8) is None
    assert notch(WorkingSet(1, None, None), "seq_len", 8) is None                    # a program's: fixed


def _alive(ws: WorkingSet, layers: int = 8, full_seq: int = 64) -> float:
    """A planner stand-in: the layer inputs alive (mesp.step.inputs_alive_bound) x the row length / `full_seq`."""
    from toolchain.mesp.step import inputs_alive_bound

    k = ws.selected(layers)
    return inputs_alive_bound(k, ws.layers_per_checkpoint) * (ws.seq_len or full_seq) / full_seq


def test_the_ladder_takes_checkpoint_groups_first_and_skips_notches_the_planner_says_do_not_help():
    steps = []
    ws = WorkingSet(1, None, 64)
    while (n := next_notch(ws, 8, _alive)) is not None:
        assert _alive(n.after) < _alive(ws)                 # every notch taken lowers the planner's figure
        steps.append(n.knob)
        ws = n.after
    # 8 inputs alive -> groups of 2: 5; groups of 4 (5) and 8 (8) do not help and are passed over -> k 4 (3 alive),
    # k 2, k 1, then the rows' length 32, 16
    assert steps == ["layers_per_checkpoint", "lcsb_k", "lcsb_k", "lcsb_k", "seq_len", "seq_len"]
    assert ws == WorkingSet(1, 1, 16)


def test_the_fallback_ladder_stops_at_the_first_settings_that_fit():
    end, peak, taken = fallback_ladder(WorkingSet(1, None, 64), 8, _alive, budget_mb=4.0)
    assert peak == 3 and [n.knob for n in taken] == ["layers_per_checkpoint", "lcsb_k"] and end == WorkingSet(2, 4, 64)
    end, peak, taken = fallback_ladder(WorkingSet(1, None, 64), 8, _alive, budget_mb=0.1)
    assert peak > 0.1 and next_notch(end, 8, _alive) is None                    # nothing smaller: reported over


def _fake_peaks(monkeypatch, trainer, per_alive_mb: float, base_mb: float):
    """Make the guard's measurement a function of the working set the trainer ran the step with (the planner
    stand-in `_alive`), so that the adaptation logic is checked without /proc noise."""
    seen = []
    full = max((trainer.row_tokens(r) or 0) for r in range(trainer.rows)) or None

    def figure(ws):
        return _alive(ws, ARCH.layers, full or 64)

    def after_step(self):
        mb = base_mb + per_alive_mb * figure(trainer.working)
        seen.append((trainer.working, mb))
        self.last_peak_bytes = round(mb * MIB)
        return self.last_peak_bytes

    monkeypatch.setattr(MemoryGuard, "after_step", after_step)
    monkeypatch.setattr(MemoryGuard, "before_step", lambda self: None)
    monkeypatch.setattr(type(trainer), "predict_peak_mb", lambda self, ws: figure(ws))
    return seen


def _trainer(kind, program, rows, **run):
    prog, weights, lora = program
    if kind == "program":
        pdir = ProgramDir(prog)
        return ProgramTrainer(pdir, EagerRuntime(pdir.spec), rows, TrainRun(lr=OPTIMIZER.lr, **run))
    return EagerTrainer(ARCH, weights, CFG, lora, rows, TrainRun(optimizer=OPTIMIZER, **run))


@pytest.mark.parametrize("kind", ["eager", "program"])
def test_a_run_over_its_budget_adapts_at_step_boundaries_and_completes(program, tmp_path, monkeypatch, kind):
    """3 layers: checkpoint groups keep as many inputs alive as they save (the planner says so), so the first
    notch is LCSB's k (3 -> 1)."""
    rows = examples(3, seed=4)
    telemetry = tmp_path / "run.jsonl"
    trainer = _trainer(kind, program, rows, steps=6, telemetry=telemetry, memory_budget_bytes=round(102.5 * MIB))
    seen = _fake_peaks(monkeypatch, trainer, per_alive_mb=1.0, base_mb=100.0)   # 3 layers alive: 103 MB
    result = trainer.run()
    assert len(result.log) == 6
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    adapted = [e for e in events if e["type"] == "memory_adapted"]
    assert [e["knob"] for e in adapted] == ["lcsb_k"] and adapted[0]["step"] == 1
    assert adapted[0]["from"]["lcsb_k"] is None and adapted[0]["to"]["lcsb_k"] == 1
    assert adapted[0]["measured_bytes"] == round(103 * MIB) and adapted[0]["trigger"] == "measured"
    assert all(mb <= 102.5 for _, mb in seen[1:])                       # every later step within the budget
    assert [len(e.layers) for e in result.log] == [3, 1, 1, 1, 1, 1]     # the steps follow the new plan
    assert next(e for e in events if e["type"] == "run_start")["budget_bytes"] == round(102.5 * MIB)
    assert [e["type"] for e in events].count("run_end") == 1
    from toolchain.telemetry.summary import summarize

    assert summarize(events[0]["run_id"], events)["memory_adapted"][0]["knob"] == "lcsb_k"


def test_an_eager_run_cuts_the_next_rows_when_lcsb_k_is_at_its_floor(program, tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(3)
    rows = [DataRow(ids, ids.clone()) for ids in (torch.randint(0, ARCH.vocab, (32,), generator=g) for _ in range(2))]
    telemetry = tmp_path / "run.jsonl"
    trainer = _trainer("eager", program, rows, steps=5, telemetry=telemetry, memory_budget_bytes=round(99.6 * MIB))
    _fake_peaks(monkeypatch, trainer, per_alive_mb=1.0, base_mb=99.0)   # 3 alive: 102, k 1: 100, rows of 16: 99.5
    result = trainer.run()
    assert [a["knob"] for a in result.adaptations] == ["lcsb_k", "seq_len"]
    assert trainer.working == WorkingSet(1, 1, 16)
    steps = [e for e in (json.loads(line) for line in telemetry.read_text().splitlines()) if e["type"] == "step"]
    assert [e["tokens"] for e in steps] == [32, 32, 16, 16, 16]           # the rows cut to their first 16 tokens


@pytest.mark.parametrize("kind", ["eager", "program"])
def test_a_run_stops_with_a_checkpoint_when_nothing_smaller_fits(program, tmp_path, monkeypatch, kind):
    rows = examples(3, seed=4)
    telemetry, ck = tmp_path / "run.jsonl", tmp_path / "run.ck"
    trainer = _trainer(kind, program, rows, steps=20, telemetry=telemetry, checkpoint=ck, checkpoint_every=10,
                       memory_budget_bytes=round(50 * MIB))
    _fake_peaks(monkeypatch, trainer, per_alive_mb=1.0, base_mb=100.0)
    with pytest.raises(BadInput, match=r"^stopped after step (\d+): anonymous peak [0-9.]+ MiB is over "
                                       r"--memory-budget 50 MiB with the smallest settings") as e:
        trainer.run()
    saved = load_checkpoint(ck)
    assert f"stopped after step {saved.step}:" in str(e.value) and f"checkpoint of step {saved.step}" in str(e.value)
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    err = [e for e in events if e["type"] == "error"]
    assert len(err) == 1 and err[0]["code"] == "budget_exceeded" and err[0]["fatal"] is True
    assert not [e for e in events if e["type"] == "run_end"]
    assert [e["knob"] for e in events if e["type"] == "memory_adapted"] == ["lcsb_k"]   # then nothing smaller


def test_cli_memory_budget_stops_with_one_error_line(program, tmp_path):
    """Without faking: a budget of 1 MiB cannot be met by any working set."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": r.input_ids.tolist()}) + "\n" for r in examples(2, 1)))
    res = CliRunner().invoke(cli, ["train", "--program", str(program[0]), "--data", str(data), "--steps", "30",
                                   "--memory-budget", "1", "--adapter-out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "over --memory-budget 1 MiB with the smallest settings" in lines[0]
    assert not (tmp_path / "out").exists()


# -- on the real measurement ----------------------------------------------------------------------------------
BIG = replace(ARCH, hidden=256, layers=24, heads=4, kv_heads=2, intermediate=512, vocab=64, max_positions=512,
              tie_embeddings=True)


def _train_cli(tmp_path, name: str, checkpoint_dir, data, *extra) -> tuple[list[dict], str]:
    """`toolchain train` (eager) in a process of its own with the phone-like malloc (memory/measure.py
    PHONE_LIKE_MALLOC_ENV: freed blocks go back to the kernel, as on phones): its telemetry events and stdout."""
    import os
    import subprocess
    import sys

    from toolchain.memory.measure import PHONE_LIKE_MALLOC_ENV

    telemetry = tmp_path / f"{name}.jsonl"
    env = {**os.environ, **PHONE_LIKE_MALLOC_ENV, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "toolchain", "train", "--model", str(checkpoint_dir), "--data",
                          str(data), "--rank", "2", "--targets", "q_proj,v_proj", "--telemetry-out", str(telemetry),
                          *map(str, extra)], env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in telemetry.read_text().splitlines()], out.stdout


def _step_peaks(events: list[dict]) -> list[int]:
    return [e["peak_bytes"] for e in events if e["type"] == "memory" and "step" in e]


@pytest.mark.slow
def test_a_budget_between_the_adapted_and_the_default_peak_is_met_by_adapting(tmp_path):
    """`train --memory-budget` on a 24-layer model at 512 tokens (12 MiB of [512, 256] float32 layer inputs at
    layers_per_checkpoint 1): the default peak and the adapted one (groups of 5) are measured first, each in its
    own process (a huge budget: the same per-step measurement, never over), and the budget set midway; the run
    under it adapts (one or more `memory_adapted` events) and completes, every step after the adaptation within
    the budget."""
    from helpers import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "big", BIG).path
    g = torch.Generator().manual_seed(0)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": torch.randint(0, BIG.vocab, (512,), generator=g).tolist()})
                            + "\n" for _ in range(3)))
    huge = ["--memory-budget", "1000000", "--steps", "3"]
    default = max(_step_peaks(_train_cli(tmp_path, "default", ckpt, data, *huge)[0])[1:])
    adapted = max(_step_peaks(_train_cli(tmp_path, "adapted", ckpt, data, *huge, "--layers-per-checkpoint", 5)[0])[1:])
    assert default - adapted > 4 * MIB, (default / MIB, adapted / MIB)
    budget_mib = (default + adapted) / 2 / MIB
    events, stdout = _train_cli(tmp_path, "budget", ckpt, data, "--memory-budget", f"{budget_mib:.3f}", "--steps", 8)
    adaptations = [e for e in events if e["type"] == "memory_adapted"]
    peaks = _step_peaks(events)
    what = (f"default {default / MIB:.1f} MiB, adapted (groups of 5) {adapted / MIB:.1f} MiB, budget {budget_mib:.1f}"
            f" MiB: {[(a['step'], a['knob'], a['to']) for a in adaptations]}, step peaks "
            f"{[round(p / MIB, 1) for p in peaks]}")
    print(what)
    assert [e["steps_completed"] for e in events if e["type"] == "run_end"] == [8], what
    assert adaptations and all(p <= budget_mib * MIB for p in peaks[adaptations[-1]["step"]:]), what
    assert "memory: before step" in stdout
