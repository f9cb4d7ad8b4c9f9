"""The evaluation gate (training/gate.py): the decision table, and both trainers rolling back a run made to
diverge (lr 10; rows with a token whose embedding overflows to nan) while keeping a good one, with the
decision in telemetry (schema-checked by the recorder), in the run summary and in the report."""

from __future__ import annotations

import html
import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import ARCH, CFG, OPTIMIZER, SEQ_LEN, examples

from toolchain.export.build import ExportSpec, export_program
from toolchain.models import random_weights
from toolchain.program import ProgramDir
from toolchain.runtime import EagerRuntime
from toolchain.text.dataset import DataRow
from toolchain.training import EagerTrainer, ProgramTrainer, TrainRun
from toolchain.training.checkpoint import load_checkpoint
from toolchain.training.gate import Evaluation, ProbeCheck, decide

NAN = float("nan")
UNTIED = replace(ARCH, tie_embeddings=False)   # the poisoned embedding row must not be the LM head's
POISON = ARCH.vocab - 1          # the token whose embedding row is inf: its rows' loss and gradients are nan

# (start loss, later (step, loss) with the end last, decision, best_step, kept_step, reason)
DECISIONS = [
    (2.31, [(5, 2.2), (10, 2.1)], "kept", 10, 10, "kept: held-out 2.3100 -> 2.1000"),
    (2.31, [(5, 2.0), (10, 2.1)], "kept_best", 5, 5, "kept best: held-out 2.3100 -> 2.0000 at step 5 (last 2.1000)"),
    (2.31, [(5, 2.0), (10, NAN)], "kept_best", 5, 5, "kept best: held-out 2.3100 -> 2.0000 at step 5 (last nan)"),
    (2.31, [(5, 2.35), (10, 2.40)], "rolled_back", 5, 0, "rolled back: held-out 2.3100 -> 2.4000"),
    (2.31, [(5, NAN), (10, NAN)], "rolled_back", None, 0, "rolled back: held-out 2.3100 -> nan"),
    (2.31, [(10, 2.31)], "rolled_back", 10, 0, "rolled back: held-out 2.3100 -> 2.3100"),   # equal does not beat
    (2.31, [(5, 2.1), (10, 2.1)], "kept", 10, 10, "kept: held-out 2.3100 -> 2.1000"),       # a tie keeps the last
    (NAN, [(10, 7.5)], "kept", 10, 10, "kept: held-out nan -> 7.5000"),                     # any finite beats nan
    (2.31, [(10, math.inf)], "rolled_back", None, 0, "rolled back: held-out 2.3100 -> inf"),
]


@pytest.mark.parametrize("start, later, decision, best_step, kept_step, reason", DECISIONS,
                         ids=[d[-1] for d in DECISIONS])
def test_the_decision_table(start, later, decision, best_step, kept_step, reason):
    d = decide(0, start, later)
    assert (d.decision, d.best_step, d.kept_step, d.reason) == (decision, best_step, kept_step, reason)
    fields = d.event_fields()
    assert all(v is None or not isinstance(v, float) or math.isfinite(v) for v in fields.values())
    assert fields["probe"] == "no_probe"


@pytest.mark.parametrize("start, end, forgetting", [(3.0, 3.0, False), (3.0, 3.149, False),
                                                    (3.0, 3.16, True), (3.0, NAN, True), (3.0, 2.5, False)])
def test_the_probe_flags_a_rise_above_the_threshold(start, end, forgetting):
    p = ProbeCheck(start, end)
    assert p.forgetting is forgetting
    assert (p.warning() is not None) is forgetting


def _poisoned_weights():
    weights = random_weights(UNTIED, seed=0)
    weights.embed[POISON] = math.inf
    return weights


def _rows(n: int, seed: int) -> list[DataRow]:
    """Rows without the poisoned token."""
    out = []
    for r in examples(n, seed):
        ids = r.input_ids % POISON
        out.append(DataRow(ids, ids.clone()))
    return out


def _nan_rows(n: int) -> list[DataRow]:
    """Rows holding the poisoned token: their loss and gradients are nan."""
    out = []
    for r in _rows(n, 9):
        ids = r.input_ids.clone()
        ids[2] = POISON
        out.append(DataRow(ids, ids.clone()))
    return out


@pytest.fixture(scope="module")
def poisoned_program(tmp_path_factory):
    from toolchain.lora import init_lora

    weights = _poisoned_weights()
    lora = init_lora(UNTIED, CFG, seed=1, zero_b=False)
    out = tmp_path_factory.mktemp("poisoned") / "prog"
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=SEQ_LEN, optimizer=OPTIMIZER, targets=("onnx",),
                      default_lr=OPTIMIZER.lr)
    export_program(UNTIED, weights, CFG, lora, spec, out)
    return out, weights, lora


def _trainer(kind, program, rows, *, lr, start=None, **run):
    """A trainer of `kind` from the program's starting adapter, or from `start` (a run's `RunOutcome`)."""
    prog, weights, lora = program
    if kind == "program":
        pdir = ProgramDir(prog)
        return ProgramTrainer(pdir, EagerRuntime(pdir.spec), rows, TrainRun(lr=lr, **run),
                              state=None if start is None else start.state.clone())
    return EagerTrainer(UNTIED, weights, CFG, lora if start is None else start.lora, rows,
                        TrainRun(optimizer=replace(OPTIMIZER, lr=lr), **run))


def _flat(trainer) -> torch.Tensor:
    return trainer.state.clone() if isinstance(trainer, ProgramTrainer) else torch.cat(
        [x.reshape(-1) for layer in trainer.lora for t in sorted(layer) for x in layer[t]])


# (what the run does, lr, training rows, expected decision)
RUNS = [("good", 3e-2, "same", "kept"),
        ("lr 10", 10.0, "other", "rolled_back"),
        ("nan data", 3e-2, "nan", "rolled_back")]


@pytest.mark.parametrize("kind", ["eager", "program"])
@pytest.mark.parametrize("what, lr, data, decision", RUNS, ids=[r[0] for r in RUNS])
def test_a_diverging_run_is_rolled_back_and_a_good_one_kept(poisoned_program, tmp_path, kind, what, lr, data,
                                                             decision):
    held = _rows(4, 3)
    # "good": the held-out rows themselves, so their loss falls; random tokens of other rows do not generalize
    rows = {"same": held, "other": _rows(4, 5), "nan": _nan_rows(3)}[data]
    telemetry, ck = tmp_path / "run.jsonl", tmp_path / "run.ck"
    # lr 10 starts from an adapter that fits the held-out rows (a random model is near the uniform loss, which an
    # exploding adapter does not make worse): 20 good steps on them first
    warm = _trainer(kind, poisoned_program, held, lr=3e-2, steps=20).run() if what == "lr 10" else None
    trainer = _trainer(kind, poisoned_program, rows, lr=lr, steps=6, telemetry=telemetry, checkpoint=ck,
                       checkpoint_every=3, start=warm)
    trainer.evaluation = Evaluation(held, every=3)
    trainer.start()
    start = _flat(trainer)
    result = trainer.run()
    gate = result.gate
    assert gate.decision == decision, gate.reason
    if decision == "rolled_back":
        assert torch.equal(_flat(trainer), start)                         # the starting adapter, restored
        saved = load_checkpoint(ck)
        assert saved.step == 6 and (kind == "eager" or torch.equal(saved.tensors["state"], start))
        if data == "nan":
            assert gate.reason.endswith("-> nan") and gate.end_loss != gate.end_loss
    else:
        assert gate.end_loss < gate.start_loss and not torch.equal(_flat(trainer), start)
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    types = [e["type"] for e in events]
    assert types.count("gate") == 1 and types.index("gate") < types.index("run_end")
    logged = next(e for e in events if e["type"] == "gate")
    assert logged["decision"] == decision and logged["reason"] == gate.reason and logged["probe"] == "no_probe"
    assert [e["step"] for e in events if e["type"] == "eval"] == [0, 3, 6]

    from toolchain.telemetry.report import write_report
    from toolchain.telemetry.summary import summarize

    summary = summarize(logged["run_id"], events)
    assert summary["gate"]["decision"] == decision and summary["gate"]["reason"] == gate.reason
    files = write_report(logged["run_id"], events, tmp_path / "report", plots="svg")
    page = files.html.read_text()
    assert "Evaluation gate" in page and html.escape(gate.reason) in page
    assert json.loads(files.summary.read_text())["gate"]["decision"] == decision


def test_kept_best_restores_the_best_evaluated_adapter():
    """An adapter that got better, then worse: the best evaluation's state is restored (eager, exact)."""
    weights = _poisoned_weights()
    from toolchain.lora import init_lora

    lora = init_lora(UNTIED, CFG, seed=1, zero_b=False)
    held = _rows(4, 3)
    trainer = EagerTrainer(UNTIED, weights, CFG, lora, held + _nan_rows(1),
                           TrainRun(steps=5, optimizer=replace(OPTIMIZER, lr=3e-2)))
    trainer.evaluation = Evaluation(held, every=4)   # step 4 evaluated (good), step 5 trains on the nan row
    snapshots = {}
    result = trainer.run(on_step=lambda e: snapshots.setdefault(e.step, trainer.snapshot()))
    assert result.gate.decision == "kept_best" and result.gate.best_step == 4, result.gate.reason
    best = snapshots[4]
    for mine, theirs in zip(trainer.lora, best.lora):
        for t in mine:
            assert torch.equal(mine[t].a, theirs[t].a) and torch.equal(mine[t].b, theirs[t].b)


def test_no_gate_evaluates_but_keeps_the_last_adapter(poisoned_program):
    held = _rows(4, 3)
    trainer = _trainer("eager", poisoned_program, held, lr=10.0, steps=3)
    trainer.evaluation = Evaluation(held, every=0, gate=False)
    result = trainer.run()
    assert result.gate is None and [p["step"] for p in trainer.evaluation.points] == [0, 3]


def test_a_resumed_run_is_gated_against_where_it_resumed_and_logs_each_eval_once(poisoned_program, tmp_path):
    """Killed after the step-3 checkpoint and resumed: the resumed session's start is the checkpoint's adapter
    (evaluated again, its `eval` event not repeated), and the decision compares the end with that."""
    from test_program_trainer import _kill_at, _Killed

    held = _rows(4, 3)
    telemetry, ck = tmp_path / "run.jsonl", tmp_path / "run.ck"
    run = dict(lr=3e-2, steps=6, telemetry=telemetry, checkpoint=ck, checkpoint_every=3)
    first = _trainer("program", poisoned_program, held, **run)
    first.evaluation = Evaluation(held, every=3)
    with pytest.raises(_Killed):
        first.run(on_step=_kill_at(4))
    resumed = _trainer("program", poisoned_program, held, resume=True, **run)
    resumed.evaluation = Evaluation(held, every=3)
    result = resumed.run()
    points = resumed.evaluation.points
    assert [p["step"] for p in points] == [3, 6]
    assert result.gate.start_loss == points[0]["loss"] and result.gate.decision == "kept"
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "eval"] == [0, 3, 6]


def test_forgetting_is_a_warning_in_the_summary_and_the_report(tmp_path):
    """A `gate` event whose probe rose 7.4%: summary.json's `warnings` says so (the decision stands), the report
    shows the gate and the warning; the event and the summary validate against their schemas."""
    from toolchain.telemetry.events import TelemetryRecorder
    from toolchain.telemetry.report import write_report

    rec = TelemetryRecorder(tmp_path / "t.jsonl", "forgetting-run")
    rec.emit("run_start", model="demo", method="mesp", backend="eager", seq_len=64, rank=8, platform="linux",
             device_model="x86_64", os="Linux", total_ram_bytes=2**33, budget_bytes=2**33)
    gate = replace(decide(0, 2.13, [(4, 1.98)]), probe=ProbeCheck(3.91, 4.2))
    fields = gate.event_fields()
    assert fields["probe"] == "measured" and fields["forgetting"] is True and fields["probe_rise"] == 0.074169
    rec.emit("gate", **fields)
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    files = write_report("forgetting-run", events, tmp_path / "report", plots="svg")
    summary = json.loads(files.summary.read_text())
    assert summary["gate"]["decision"] == "kept" and summary["gate"]["forgetting"] is True
    assert summary["warnings"] == ["forgetting: the general-text probe's loss rose 7.4% (3.9100 -> 4.2000), above "
                                   "the 5% threshold (a warning: the adapter was kept)"]
    page = files.html.read_text()
    assert "<h2>Warnings</h2>" in page and "forgetting flagged above 5%: yes" in page
