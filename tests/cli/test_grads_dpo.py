"""`toolchain grads --objective dpo`: the first pair's DPO gradients under PEFT keys, equal to `dpo_step` (itself
checked against HF + PEFT in tests/mesp/test_dpo.py); the reference log-probs from the pair when it has them;
bad input -> one `Error:` line, exit 2, no file."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import assert_grads_close
from safetensors import safe_open
from safetensors.torch import load_file

from toolchain.cli import cli
from toolchain.lora import LoraConfig, init_lora, load_adapter, lora_state_dict, save_adapter
from toolchain.mesp.dpo import dpo_step, pair_rows, reference_logps
from toolchain.models import get_preset, load_model

PAIR = {"prompt_ids": [256, 72, 105, 44], "chosen_ids": [32, 116, 104, 101, 114, 101], "rejected_ids": [32, 121, 111]}


@pytest.fixture
def adapter(tmp_path):
    arch = get_preset("tiny")
    cfg = LoraConfig(rank=3, alpha=5.0, targets=("q_proj", "v_proj", "down_proj"))
    return save_adapter(tmp_path / "adapter", cfg, init_lora(arch, cfg, seed=7, zero_b=False))


def _run(*args):
    return CliRunner().invoke(cli, ["grads", *map(str, args)])


def _pairs(tmp_path, *pairs):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


@pytest.mark.parametrize("with_ref", [False, True])
def test_dpo_grads_equal_the_step(tmp_path, adapter, with_ref):
    arch, weights = load_model("tiny", init="random", seed=2)
    cfg, lora = load_adapter(adapter, arch)
    c, r = pair_rows(PAIR["prompt_ids"], PAIR["chosen_ids"], PAIR["rejected_ids"])
    ref = (-30.0, -12.5) if with_ref else reference_logps(arch, weights, cfg, lora, c, r)
    pair = {**PAIR, "ref_chosen_logp": ref[0], "ref_rejected_logp": ref[1]} if with_ref else PAIR
    out = tmp_path / "g.safetensors"
    result = _run("--model", "tiny", "--init", "random", "--seed", 2, "--adapter", adapter, "--objective", "dpo",
                  "--beta", 0.5, "--data", _pairs(tmp_path, pair, {**PAIR, "chosen_ids": [1]}), "--out", out)
    assert result.exit_code == 0, result.output
    grads = load_file(str(out))
    expected = dpo_step(arch, weights, cfg, lora, c, r, ref, beta=0.5)
    assert sorted(grads) == sorted(load_file(str(adapter / "adapter_model.safetensors")))
    assert_grads_close(grads, lora_state_dict(expected.grads), rtol=0, atol=0)
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["objective"] == "dpo" and float(meta["loss"]) == pytest.approx(float(expected.loss), rel=1e-7)
    assert "dpo loss" in result.output and any(v.abs().max() > 0 for v in grads.values())


@pytest.mark.parametrize(("args", "message"), [
    (["--beta", "0"], "--beta"), (["--beta", "-1"], "--beta"), (["--beta", "nan"], "--beta"),
    (["--beta", "inf"], "--beta"), (["--mode", "autograd"], "by MeSP"),
])
def test_bad_dpo_input(tmp_path, adapter, args, message):
    out = tmp_path / "g.safetensors"
    result = _run("--model", "tiny", "--init", "random", "--adapter", adapter, "--objective", "dpo",
                  "--data", _pairs(tmp_path, PAIR), "--out", out, *args)
    assert result.exit_code == 2 and result.output.count("Error:") == 1 and message in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize(("pair", "message"), [
    ({**PAIR, "rejected_ids": PAIR["chosen_ids"]}, "chosen_ids equal rejected_ids"),
    ({**PAIR, "chosen_ids": [300]}, "outside the model's vocabulary"),
    ({**PAIR, "chosen_ids": []}, "should be non-empty"),
])
def test_bad_pairs(tmp_path, adapter, pair, message):
    out = tmp_path / "g.safetensors"
    result = _run("--model", "tiny", "--init", "random", "--adapter", adapter, "--objective", "dpo",
                  "--data", _pairs(tmp_path, pair), "--out", out)
    assert result.exit_code == 2 and result.output.count("Error:") == 1 and message in result.output, result.output
    assert "pairs.jsonl:1" in result.output and not out.exists()


def test_beta_needs_dpo(tmp_path, adapter):
    out = tmp_path / "g.safetensors"
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    result = _run("--model", "tiny", "--init", "random", "--data", data, "--beta", 0.1, "--out", out)
    assert result.exit_code == 2 and "--objective dpo" in result.output and not out.exists()
