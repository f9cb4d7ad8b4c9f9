"""Eager DPO training (toolchain.training.preference, `train --objective dpo`): a step's update is the optimizer
applied to `dpo_step`'s exact gradient (SGD: lora - lr * g, checked against the gradient itself, which
tests/mesp/test_dpo.py checks against HF + PEFT); the reference is the base model whatever the starting adapter;
mixed runs take SFT steps on rows; a few steps raise the margin; the CLI and its bad input."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.lora import LoraConfig, LoraPair, init_lora, load_adapter
from toolchain.mesp.dpo import dpo_step, pair_rows, reference_logps, sequence_logp
from toolchain.models import load_model
from toolchain.optim import optimizer_config
from toolchain.text.dataset import DataRow
from toolchain.training import EagerTrainer, TrainRun
from toolchain.training.preference import PairItem, PreferenceTrainer

PAIRS = [{"prompt_ids": [256, 72, 105, 44], "chosen_ids": [32, 116, 104, 101, 114, 101], "rejected_ids": [32, 121, 111]},
         {"prompt_ids": [256, 79, 107], "chosen_ids": [33, 33], "rejected_ids": [63, 63, 63, 63]}]


@pytest.fixture(scope="module")
def model():
    arch, weights = load_model("tiny", init="random", seed=3)
    cfg = LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "up_proj"))
    return arch, weights, cfg, init_lora(arch, cfg, seed=5, zero_b=False)


def _items(arch, weights, cfg, lora):
    out = []
    for p in PAIRS:
        c, r = pair_rows(p["prompt_ids"], p["chosen_ids"], p["rejected_ids"])
        out.append(PairItem(c, r, reference_logps(arch, weights, cfg, lora, c, r)))
    return out


def test_one_sgd_step_is_lora_minus_lr_times_the_dpo_gradient(model):
    arch, weights, cfg, lora = model
    items = _items(arch, weights, cfg, lora)
    opt = optimizer_config("sgd", lr=0.05, weight_decay=0.0)
    trainer = PreferenceTrainer(arch, weights, cfg, lora, items, [], TrainRun(steps=1, optimizer=opt), beta=0.3,
                                dpo_weight=2.0)
    outcome = trainer.run()
    g = dpo_step(arch, weights, cfg, lora, items[0].chosen, items[0].rejected, items[0].ref, beta=0.3, scale=2.0)
    assert outcome.losses[0] == pytest.approx(float(g.loss), rel=1e-6)
    for layer, new, grads in zip(lora, outcome.lora, g.grads):
        for t, p in layer.items():
            torch.testing.assert_close(new[t].a, p.a - 0.05 * grads[t].a)
            torch.testing.assert_close(new[t].b, p.b - 0.05 * grads[t].b)


def test_the_reference_is_the_base_model(model):
    arch, weights, cfg, lora = model
    c, r = pair_rows(PAIRS[0]["prompt_ids"], PAIRS[0]["chosen_ids"], PAIRS[0]["rejected_ids"])
    zero = tuple({t: LoraPair(p.a, torch.zeros_like(p.b)) for t, p in layer.items()} for layer in lora)
    fresh = init_lora(arch, cfg, seed=9)          # PEFT init: B = 0, the model is the base
    ref = reference_logps(arch, weights, cfg, lora, c, r)
    assert ref == reference_logps(arch, weights, cfg, fresh, c, r)
    assert ref[0] == pytest.approx(float(sequence_logp(arch, weights, cfg, zero, c)))
    assert ref[0] != pytest.approx(float(sequence_logp(arch, weights, cfg, lora, c)))


def test_mixed_run_takes_sft_steps_on_rows(model):
    arch, weights, cfg, lora = model
    items = _items(arch, weights, cfg, lora)
    row = DataRow(torch.tensor([256, 1, 2, 3, 4, 5]), torch.tensor([256, 1, 2, 3, 4, 5]))
    run = TrainRun(steps=3)
    mixed = PreferenceTrainer(arch, weights, cfg, lora, items[:1], [row], run, beta=0.1, dpo_weight=0.5).run()
    # step 2 (row 1) is the SFT step on `row` from the state after step 1: replay it with the eager trainer
    first = PreferenceTrainer(arch, weights, cfg, lora, items[:1], [], TrainRun(steps=1), beta=0.1, dpo_weight=0.5)
    first.run()
    sft = EagerTrainer(arch, weights, cfg, first.lora, [row], TrainRun(steps=1))
    sft._state = first.state.clone()
    sft_loss = sft.run().losses[0]
    assert [e.row for e in mixed.log] == [0, 1, 0]
    assert mixed.losses[1] == pytest.approx(sft_loss, rel=1e-6)


def test_a_few_steps_raise_the_margin(model):
    arch, weights, cfg, lora = model
    items = _items(arch, weights, cfg, lora)
    opt = optimizer_config("adamw", lr=1e-2)
    trainer = PreferenceTrainer(arch, weights, cfg, lora, items, [], TrainRun(steps=8, optimizer=opt), beta=0.5)
    outcome = trainer.run()
    after = [float(dpo_step(arch, weights, cfg, outcome.lora, p.chosen, p.rejected, p.ref, beta=0.5).margin)
             for p in items]
    before = [float(dpo_step(arch, weights, cfg, lora, p.chosen, p.rejected, p.ref, beta=0.5).margin) for p in items]
    assert all(a > b + 0.1 for a, b in zip(after, before)), (before, after)
    assert outcome.losses[-2] < outcome.losses[0]


BASE = ["train", "--model", "tiny", "--init", "random", "--rank", "2", "--targets", "q_proj,v_proj"]


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return path


def test_cli_trains_dpo_and_mixed(tmp_path, pairs_file):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [256, 1, 2, 3, 4]}) + "\n")
    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, [*BASE, "--objective", "dpo", "--beta", "0.2", "--data", str(pairs_file),
                                      "--sft-data", str(rows), "--dpo-weight", "0.5", "--steps", "3", "--json",
                                      "--adapter-out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [s["row"] for s in doc["steps"]] == [0, 1, 2]
    arch, _ = load_model("tiny", init="random", seed=0)
    load_adapter(out, arch)


@pytest.mark.parametrize(("args", "message"), [
    (["--objective", "dpo", "--beta", "0"], "--beta"),
    (["--objective", "dpo", "--beta", "nan"], "--beta"),
    (["--objective", "dpo", "--beta", "-2"], "--beta"),
    (["--beta", "0.1"], "go with --objective dpo"),
    (["--dpo-weight", "2"], "go with --objective dpo"),
    (["--objective", "dpo", "--dpo-weight", "0"], "--dpo-weight"),
])
def test_cli_bad_input(tmp_path, pairs_file, args, message):
    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, [*BASE, "--data", str(pairs_file), "--steps", "1", "--adapter-out", str(out),
                                      *args])
    assert result.exit_code == 2 and result.output.count("Error:") == 1 and message in result.output, result.output
    assert not out.exists()


def test_cli_bad_pair_names_its_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(PAIRS[0]) + "\n" + json.dumps({**PAIRS[1], "rejected_ids": PAIRS[1]["chosen_ids"]}) + "\n")
    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, [*BASE, "--objective", "dpo", "--data", str(path), "--steps", "1",
                                      "--adapter-out", str(out)])
    assert result.exit_code == 2 and "pairs.jsonl:2" in result.output and "chosen_ids equal" in result.output
    assert not out.exists()


def test_cli_dpo_eval_data_and_memory_budget(tmp_path, pairs_file):
    """--eval-data (held-out pairs: the gate on their DPO loss) and --memory-budget run with --objective dpo."""
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps(PAIRS[1]) + "\n")
    result = CliRunner().invoke(cli, [*BASE, "--objective", "dpo", "--data", str(pairs_file), "--eval-data", str(held),
                                      "--eval-every", "1", "--steps", "2", "--memory-budget", "100000", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    assert [p["step"] for p in doc["evals"]] == [0, 1, 2] and doc["evals"][0]["rows"] == 1
    assert doc["gate"]["decision"] in ("kept", "kept_best", "rolled_back") and doc["memory_adapted"] == []
    rows = tmp_path / "rows.jsonl"            # SFT rows are not held-out pairs: one error naming the line
    rows.write_text(json.dumps({"input_ids": [256, 1, 2, 3]}) + "\n")
    out = tmp_path / "adapter"
    bad = CliRunner().invoke(cli, [*BASE, "--objective", "dpo", "--data", str(pairs_file), "--eval-data", str(rows),
                                   "--steps", "1", "--adapter-out", str(out)])
    assert bad.exit_code == 2 and bad.output.count("Error:") == 1 and "rows.jsonl:1:" in bad.output, bad.output
    assert not out.exists()
