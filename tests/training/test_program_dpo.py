"""DPO on an exported program (`block_backward_pair`, `LayerLoop.pair_step`, `program_preference_trainer`) against
the eager DPO trainer on the same weights (whose step is checked against HF + PEFT in tests/mesp/test_dpo.py):
the same losses, margins and adapter, on the eager reference runtime and on the real ExecuTorch runtime; the
reference log-probs from the program with the adapter disabled equal the eager ones; a program exported without
--preference is refused."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCH, CFG, OPTIMIZER, SEQ_LEN

from toolchain.errors import BadInput
from toolchain.export.build import ExportSpec, export_program
from toolchain.lcsb import make_plan
from toolchain.mesp.dpo import pair_rows, reference_logps
from toolchain.program import ProgramDir
from toolchain.runtime import EagerRuntime
from toolchain.text.dataset import DataRow
from toolchain.training import TrainRun
from toolchain.training.preference import PairItem, PreferenceTrainer, program_preference_trainer


def _pairs(seed: int, n: int = 3) -> list[PairItem]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = lambda k: torch.randint(0, ARCH.vocab, (k,), generator=g).tolist()  # noqa: E731
        prompt = ids(2 + i)
        c, r = pair_rows(prompt, ids(SEQ_LEN - len(prompt) - i % 2), ids(3 + i))
        out.append(PairItem(c, r, None))
    return out


@pytest.fixture(scope="module")
def preference_program(tmp_path_factory):
    from toolchain.lora import init_lora
    from toolchain.models import random_weights

    weights = random_weights(ARCH, seed=0)
    lora = init_lora(ARCH, CFG, seed=1, zero_b=False)
    out = tmp_path_factory.mktemp("pref") / "prog"
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=SEQ_LEN, optimizer=OPTIMIZER, targets=("onnx",),
                      default_lr=OPTIMIZER.lr, preference=True)
    export_program(ARCH, weights, CFG, lora, spec, out)
    return out, weights, lora


def _eager(weights, lora, pairs, rows, **run):
    with_ref = [p._replace(ref=reference_logps(ARCH, weights, CFG, lora, p.chosen, p.rejected)) for p in pairs]
    return PreferenceTrainer(ARCH, weights, CFG, lora, with_ref, rows, TrainRun(optimizer=OPTIMIZER, **run),
                             beta=0.4, dpo_weight=1.5)


def _compare(prog_trainer, eager_trainer):
    prog, eager = prog_trainer.run(), eager_trainer.run()
    torch.testing.assert_close(torch.tensor(prog.losses), torch.tensor(eager.losses), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.tensor(prog_trainer.margins), torch.tensor(eager_trainer.margins),
                               rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(prog.lora, eager.lora):
        for t in CFG.targets:
            torch.testing.assert_close(ours[t].a, theirs[t].a, rtol=1e-3, atol=1e-5)
            torch.testing.assert_close(ours[t].b, theirs[t].b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("run", [{}, {"plan": make_plan(ARCH.layers, 2, "cyclic")}, {"layers_per_checkpoint": 2}],
                         ids=["full", "lcsb", "groups"])
def test_program_dpo_equals_eager_dpo(preference_program, run):
    prog, weights, lora = preference_program
    pairs = _pairs(3)
    rows = [DataRow(torch.arange(5) % ARCH.vocab, torch.arange(5) % ARCH.vocab)]
    pdir = ProgramDir(prog)
    trainer = program_preference_trainer(pdir, EagerRuntime(pdir.spec), pairs, rows,
                                         TrainRun(steps=6, lr=OPTIMIZER.lr, **run), beta=0.4, dpo_weight=1.5)
    expected = [reference_logps(ARCH, weights, CFG, lora, p.chosen, p.rejected) for p in pairs]
    torch.testing.assert_close(torch.tensor([p.ref for p in trainer.pairs]), torch.tensor(expected),
                               rtol=1e-5, atol=1e-5)
    _compare(trainer, _eager(weights, lora, pairs, rows, steps=6, **run))


def test_pair_step_graded_groups_equal_every_input_kept(preference_program):
    """`LayerLoop.pair_step`'s default (the second sequence's inputs in graded groups, rebuilt by block_forward at
    backward) leaves the losses and the updated state as keeping every input of both does."""
    from toolchain.runtime.loop import LayerLoop

    prog, _, _ = preference_program
    pdir = ProgramDir(prog)
    loop = LayerLoop(pdir, EagerRuntime(pdir.spec))
    pair = _pairs(7, n=1)[0]
    padded = [(torch.nn.functional.pad(r.input_ids, (0, SEQ_LEN - len(r.input_ids))),
               torch.nn.functional.pad(r.labels, (0, SEQ_LEN - len(r.labels)), value=-100))
              for r in (pair.chosen, pair.rejected)]
    states, losses = [], []
    for second in ("graded", "same"):
        state = pdir.state_init()
        losses.append(loop.pair_step(tuple(padded), lambda a, b: (0.7, -0.3), 1e-2, state, second_groups=second))
        states.append(state)
    assert losses[0] == losses[1]
    assert not torch.equal(states[0], pdir.state_init())
    torch.testing.assert_close(states[0], states[1], rtol=0, atol=0)


def test_a_program_without_the_pair_method_is_refused(program):
    prog, _, _ = program
    pdir = ProgramDir(prog)
    with pytest.raises(BadInput, match="re-export it with --preference"):
        program_preference_trainer(pdir, EagerRuntime(pdir.spec), _pairs(1), [], TrainRun(steps=1), beta=0.1)


@pytest.mark.slow
def test_executorch_program_dpo_equals_eager(tmp_path):
    """The real ExecuTorch runtime (XNNPACK) runs block_backward_pair: the same DPO steps as eager."""
    from toolchain.lora import init_lora
    from toolchain.models import random_weights
    from toolchain.runtime.program_runtime import open_runtime

    weights = random_weights(ARCH, seed=0)
    lora = init_lora(ARCH, CFG, seed=1, zero_b=False)
    out = tmp_path / "prog"
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=SEQ_LEN, optimizer=OPTIMIZER,
                      targets=("executorch",), default_lr=OPTIMIZER.lr, preference=True)
    export_program(ARCH, weights, CFG, lora, spec, out)
    pdir = ProgramDir(out)
    runtime = open_runtime(pdir, "executorch", use="train")
    assert runtime.backend == "executorch"
    pairs = _pairs(4)
    trainer = program_preference_trainer(pdir, runtime, pairs, [], TrainRun(steps=4, lr=OPTIMIZER.lr), beta=0.4,
                                         dpo_weight=1.5)
    _compare(trainer, _eager(weights, lora, pairs, [], steps=4))


def _pairs_file(tmp_path, pairs):
    import json

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": p.chosen.input_ids[:-len(c)].tolist(), "chosen_ids": c,
                                        "rejected_ids": p.rejected.input_ids[-len(r):].tolist()}) + "\n"
                            for p in pairs for c, r in [(_response(p.chosen), _response(p.rejected))]))
    return path


def _response(row: DataRow) -> list[int]:
    return [t for t in row.labels.tolist() if t != -100]


def test_cli_train_program_dpo(preference_program, program, tmp_path):
    import json

    from click.testing import CliRunner

    from toolchain.cli import cli

    prog, _, _ = preference_program
    data = _pairs_file(tmp_path, _pairs(5, n=2))
    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, ["train", "--program", str(prog), "--objective", "dpo", "--beta", "0.3",
                                      "--data", str(data), "--steps", "3", "--json", "--adapter-out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [s["row"] for s in doc["steps"]] == [0, 1, 0] and len(doc["margins"]) == 3
    assert (out / "adapter_model.safetensors").is_file()
    old = CliRunner().invoke(cli, ["train", "--program", str(program[0]), "--objective", "dpo", "--data", str(data),
                                   "--steps", "1", "--adapter-out", str(tmp_path / "other")])
    assert old.exit_code == 2 and old.output.count("Error:") == 1 and "--preference" in old.output, old.output
    assert not (tmp_path / "other").exists()


def _program_trainer(prog, pairs, **run):
    pdir = ProgramDir(prog)
    return program_preference_trainer(pdir, EagerRuntime(pdir.spec), pairs, [],
                                      TrainRun(lr=run.pop("lr", OPTIMIZER.lr), **run), beta=0.4)


@pytest.mark.parametrize("what, lr, decision", [("good", 3e-2, "kept"), ("lr 10", 10.0, "rolled_back")])
def test_program_dpo_gate_keeps_a_good_run_and_rolls_back_a_diverging_one(preference_program, tmp_path, what, lr,
                                                                          decision):
    """The gate on held-out pairs, on the program's methods: their DPO loss equals the eager trainer's on the same
    adapter; lr 10 (from an adapter first fitted to the held-out pairs) is rolled back to the starting state."""
    from toolchain.training.gate import Evaluation

    prog, weights, lora = preference_program
    held = _pairs(11)
    if what == "lr 10":
        warm = _program_trainer(prog, held, steps=15, lr=3e-2)
        warm.run()
        start_state = warm.state.clone()
        pairs = _pairs(12)
    else:
        start_state, pairs = None, held
    trainer = _program_trainer(prog, pairs, steps=6, lr=lr, telemetry=tmp_path / "run.jsonl")
    if start_state is not None:
        trainer.state.copy_(start_state)
    held = trainer.with_reference(held)
    if what == "good":       # the program's held-out DPO loss is the eager trainer's on the same adapter
        eager = _eager(weights, lora, held, [], steps=1)
        assert trainer.held_out(held)["loss"] == pytest.approx(eager.held_out(held)["loss"], rel=1e-4)
    trainer.evaluation = Evaluation(held, every=3)
    trainer.start()
    start = trainer.state.clone()
    gate = trainer.run().gate
    assert gate.decision == decision, gate.reason
    if decision == "rolled_back":
        assert torch.equal(trainer.state, start)
    else:
        assert gate.end_loss < gate.start_loss and not torch.equal(trainer.state, start)
    import json

    events = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "eval"] == [0, 3, 6]
    assert [e["decision"] for e in events if e["type"] == "gate"] == [decision]


def test_program_dpo_over_its_budget_adapts(preference_program, monkeypatch):
    """The program's pair step follows the adapted working set (here LCSB's k 3 -> 1; the planner stand-in counts
    the pair step's inputs alive, as `program_peak(pair=True)` does)."""
    from toolchain.memory.measure import MIB
    from toolchain.mesp.step import pair_inputs_alive_bound
    from toolchain.training.pressure import MemoryGuard

    prog, _, _ = preference_program
    trainer = _program_trainer(prog, _pairs(13, n=2), steps=4, memory_budget_bytes=round(103 * MIB))
    alive = lambda ws: pair_inputs_alive_bound(ws.selected(ARCH.layers), ws.layers_per_checkpoint)  # noqa: E731
    monkeypatch.setattr(MemoryGuard, "after_step", lambda self: round((100 + alive(trainer.working)) * MIB))
    monkeypatch.setattr(MemoryGuard, "before_step", lambda self: None)
    monkeypatch.setattr(type(trainer), "predict_peak_mb", lambda self, ws: float(alive(ws)))
    result = trainer.run()
    assert [a["knob"] for a in result.adaptations] == ["lcsb_k"]
    assert [len(e.layers) for e in result.log] == [3, 1, 1, 1]


def test_cli_train_program_dpo_eval_data_and_budget(preference_program, tmp_path):
    import json

    from click.testing import CliRunner

    from toolchain.cli import cli

    prog, _, _ = preference_program
    data, held = _pairs_file(tmp_path, _pairs(5, n=2)), _pairs_file(tmp_path / "h", _pairs(6, n=2))
    result = CliRunner().invoke(cli, ["train", "--program", str(prog), "--objective", "dpo", "--data", str(data),
                                      "--eval-data", str(held), "--eval-every", "2", "--steps", "2", "--json",
                                      "--memory-budget", "100000"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    assert [p["step"] for p in doc["evals"]] == [0, 2] and doc["gate"]["decision"] in ("kept", "kept_best",
                                                                                      "rolled_back")
    assert doc["memory_adapted"] == []
