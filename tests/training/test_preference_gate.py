"""The evaluation gate and memory pressure of a DPO run (`train --objective dpo --eval-data PAIRS --memory-budget`),
eager: the gate's loss is the held-out pairs' DPO loss (checked against `dpo_step`'s own loss); a run made to
diverge (lr 10, or pairs whose loss is nan) is rolled back to its starting adapter and a good one kept, with the
`eval` / `gate` events; a run over its memory budget lowers the pair step's working set (the planner's pair bound)
instead of stopping, and never cuts a pair's sequences. The program trainer's counterparts are in
test_program_dpo.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import ARCH, CFG, OPTIMIZER, SEQ_LEN

from toolchain.lora import init_lora
from toolchain.memory.measure import MIB
from toolchain.mesp.dpo import dpo_step, pair_rows, reference_logps
from toolchain.mesp.step import pair_inputs_alive_bound
from toolchain.models import random_weights
from toolchain.training import TrainRun
from toolchain.training.gate import Evaluation
from toolchain.training.preference import PairItem, PreferenceTrainer
from toolchain.training.pressure import MemoryGuard

UNTIED = replace(ARCH, tie_embeddings=False)   # the poisoned embedding row must not be the LM head's
POISON = ARCH.vocab - 1                         # its embedding row is inf: a pair holding it has a nan loss


@pytest.fixture(scope="module")
def model():
    weights = random_weights(UNTIED, seed=0)
    weights.embed[POISON] = math.inf
    return weights, init_lora(UNTIED, CFG, seed=1, zero_b=False)


def _pairs(model, seed: int, n: int, *, poison: bool = False) -> list[PairItem]:
    weights, lora = model
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = lambda k: (torch.randint(0, POISON, (k,), generator=g)).tolist()  # noqa: E731
        prompt = ids(2 + i % 2)
        chosen, rejected = ids(SEQ_LEN - len(prompt) - i % 3), ids(3 + i)
        if poison:
            chosen[1] = POISON
        c, r = pair_rows(prompt, chosen, rejected)
        ref = (math.nan, math.nan) if poison else reference_logps(UNTIED, weights, CFG, lora, c, r)
        out.append(PairItem(c, r, ref))
    return out


def _trainer(model, pairs, *, lr, start=None, **run):
    """A DPO trainer from the model's adapter, or from `start` (a run's `RunOutcome`)."""
    weights, lora = model
    return PreferenceTrainer(UNTIED, weights, CFG, lora if start is None else start.lora, pairs, [],
                             TrainRun(optimizer=replace(OPTIMIZER, lr=lr), **run), beta=0.5)


def _flat(trainer) -> torch.Tensor:
    return torch.cat([x.reshape(-1) for layer in trainer.lora for t in sorted(layer) for x in layer[t]])


def test_the_held_out_loss_is_the_pairs_mean_dpo_loss(model):
    weights, lora = model
    held = _pairs(model, 3, 3)
    trainer = _trainer(model, held, lr=1e-2, steps=1)
    got = trainer.held_out(held)
    want = [float(dpo_step(UNTIED, weights, CFG, lora, p.chosen, p.rejected, p.ref, beta=0.5).loss) for p in held]
    assert got["loss"] == pytest.approx(sum(want) / 3, rel=1e-6) and got["rows"] == 3
    assert got["tokens"] == sum(int((r.labels[1:] != -100).sum()) for p in held for r in (p.chosen, p.rejected))
    rows = [held[0].chosen]                                   # rows (a probe) are still the mean next-token loss
    assert trainer.held_out(rows)["rows"] == 1


# (what the run does, lr, training pairs, expected decision)
RUNS = [("good", 3e-2, "same", "kept"),
        ("lr 10", 10.0, "other", "rolled_back"),
        ("nan data", 3e-2, "nan", "rolled_back")]


@pytest.mark.parametrize("what, lr, data, decision", RUNS, ids=[r[0] for r in RUNS])
def test_a_diverging_dpo_run_is_rolled_back_and_a_good_one_kept(model, tmp_path, what, lr, data, decision):
    held = _pairs(model, 3, 3)
    pairs = {"same": held, "other": _pairs(model, 6, 3), "nan": _pairs(model, 4, 2, poison=True)}[data]
    telemetry = tmp_path / "run.jsonl"
    # lr 10 starts from an adapter that fits the held-out pairs (near the start, an exploding adapter's random
    # margins give about the loss of no preference, log 2): 20 good steps on them first
    warm = _trainer(model, held, lr=3e-2, steps=20).run() if what == "lr 10" else None
    trainer = _trainer(model, pairs, lr=lr, steps=6, telemetry=telemetry, start=warm)
    trainer.evaluation = Evaluation(held, every=3)
    trainer.start()
    start = _flat(trainer)
    result = trainer.run()
    gate = result.gate
    assert gate.decision == decision, gate.reason
    if decision == "rolled_back":
        assert torch.equal(_flat(trainer), start)                 # the starting adapter, restored
        assert not (math.isfinite(gate.end_loss) and gate.end_loss < gate.start_loss)
        if data == "nan":
            assert gate.reason.endswith("-> nan")
    else:
        assert gate.end_loss < gate.start_loss and not torch.equal(_flat(trainer), start)
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "eval"] == [0, 3, 6]
    logged = [e for e in events if e["type"] == "gate"]
    assert len(logged) == 1 and logged[0]["decision"] == decision and logged[0]["reason"] == gate.reason


def _fake_peaks(monkeypatch, trainer, per_alive_mb: float, base_mb: float) -> list:
    """The guard's measurement as a function of the working set the step ran with: the pair step's inputs alive
    (`pair_inputs_alive_bound`, what `PreferenceTrainer.predict_peak_mb` counts)."""
    seen = []

    def after_step(self):
        ws = trainer.working
        mb = base_mb + per_alive_mb * pair_inputs_alive_bound(ws.selected(ARCH.layers), ws.layers_per_checkpoint)
        seen.append((ws, mb))
        self.last_peak_bytes = round(mb * MIB)
        return self.last_peak_bytes

    monkeypatch.setattr(MemoryGuard, "after_step", after_step)
    monkeypatch.setattr(MemoryGuard, "before_step", lambda self: None)
    return seen


def test_a_dpo_run_over_its_budget_adapts_and_completes(model, tmp_path, monkeypatch):
    """3 layers: the pair step holds 3 + 2 inputs; checkpoint groups of 2 or 3 would hold 6 (the planner passes
    them over), so the notch is LCSB's k 3 -> 1 (1 + 1 inputs)."""
    pairs = _pairs(model, 5, 2)
    telemetry = tmp_path / "run.jsonl"
    trainer = _trainer(model, pairs, lr=1e-2, steps=4, telemetry=telemetry, memory_budget_bytes=round(103 * MIB))
    seen = _fake_peaks(monkeypatch, trainer, per_alive_mb=1.0, base_mb=100.0)
    result = trainer.run()
    assert [a["knob"] for a in result.adaptations] == ["lcsb_k"] and result.adaptations[0]["step"] == 1
    assert [mb for _, mb in seen] == [105.0, 102.0, 102.0, 102.0]
    assert [len(e.layers) for e in result.log] == [3, 1, 1, 1]
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert [e["type"] for e in events].count("memory_adapted") == 1 and events[-1]["type"] == "run_end"


def test_a_dpo_run_never_cuts_its_pairs(model, tmp_path, monkeypatch):
    """Nothing below LCSB's k 1 is left for a pair step (its sequences keep their length: the reference
    log-probs are of the whole sequences): the run stops with one message instead of cutting them."""
    from toolchain.errors import BadInput

    pairs = _pairs(model, 5, 2)
    trainer = _trainer(model, pairs, lr=1e-2, steps=4, memory_budget_bytes=round(50 * MIB))
    _fake_peaks(monkeypatch, trainer, per_alive_mb=1.0, base_mb=100.0)
    with pytest.raises(BadInput, match="over --memory-budget 50 MiB with the smallest settings"):
        trainer.run()
    assert [a["knob"] for a in trainer.adaptations] == ["lcsb_k"] and trainer.working.seq_len == SEQ_LEN
