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
