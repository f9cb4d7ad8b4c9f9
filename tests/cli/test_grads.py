"""`toolchain grads`: output keys and values, and every bad input -> one `Error:` line, exit 2, no file."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner
from helpers import assert_grads_close, save_checkpoint
from safetensors.torch import load_file

from toolchain.baselines import autograd_step, mebp_step
from toolchain.cli import cli
from toolchain.lora import LoraConfig, init_lora, load_adapter, lora_state_dict, save_adapter
from toolchain.mesp import mesp_step
from toolchain.models import ModelArch, get_preset, load_model

STEPS = {"mesp": mesp_step, "mebp": mebp_step, "autograd": autograd_step}


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.jsonl"
    gen = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(0, 264, (23,), generator=gen).tolist()},
            {"input_ids": [1, 2, 3]}]
    rows[0]["labels"] = [-100] * 5 + rows[0]["input_ids"][5:]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def adapter(tmp_path):
    arch = get_preset("tiny")
    cfg = LoraConfig(rank=3, alpha=5.0, targets=("q_proj", "v_proj", "down_proj"))
    return save_adapter(tmp_path / "adapter", cfg, init_lora(arch, cfg, seed=7, zero_b=False))


def _run(*args):
    return CliRunner().invoke(cli, ["grads", *map(str, args)])


@pytest.mark.parametrize("mode", list(STEPS))
def test_grads_with_adapter_equal_the_step(tmp_path, data, adapter, mode):
    out = tmp_path / "grads.safetensors"
    result = _run("--model", "tiny", "--init", "random", "--seed", 2, "--adapter", adapter, "--data", data,
                  "--mode", mode, "--out", out)
    assert result.exit_code == 0, result.output
    grads = load_file(str(out))
    assert sorted(grads) == sorted(load_file(str(adapter / "adapter_model.safetensors")))
    arch, weights = load_model("tiny", init="random", seed=2)
    cfg, lora = load_adapter(adapter, arch)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    ids, labels = torch.tensor(rows[0]["input_ids"]), torch.tensor(rows[0]["labels"])
    expected = lora_state_dict(mesp_step(arch, weights, cfg, lora, ids, labels).grads)
    # Same mode: bit-identical. Other modes: the same gradients to float32 accuracy.
    same_mode = lora_state_dict(STEPS[mode](arch, weights, cfg, lora, ids, labels).grads)
    assert_grads_close(grads, same_mode, rtol=0, atol=0)
    assert_grads_close(grads, expected)
    assert f"({mode})" in result.stdout and str(out) in result.stdout


def test_grads_without_adapter_use_rank_alpha_targets(tmp_path, data):
    out = tmp_path / "g.safetensors"
    result = _run("--model", "tiny", "--init", "random", "--rank", 2, "--alpha", 3, "--targets", "k_proj,up_proj",
                  "--data", data, "--out", out)
    assert result.exit_code == 0, result.output
    arch = get_preset("tiny")
    cfg = LoraConfig(rank=2, alpha=3.0, targets=("k_proj", "up_proj"))
    expected_keys = lora_state_dict(init_lora(arch, cfg))
    grads = load_file(str(out))
    assert sorted(grads) == sorted(expected_keys)
    assert all(grads[k].shape == v.shape for k, v in expected_keys.items())
    # PEFT init: B = 0, so dA = 0 and dB carries the signal.
    assert all(not v.any() for k, v in grads.items() if "lora_A" in k)
    assert all(v.abs().max() > 0 for k, v in grads.items() if "lora_B" in k)


def test_grads_from_a_checkpoint_directory(tmp_path, data):
    arch = ModelArch(hidden=16, layers=2, heads=4, kv_heads=2, intermediate=21, vocab=300, max_positions=64,
                      tie_embeddings=False)
    ckpt = save_checkpoint(tmp_path / "ckpt", arch)
    out = tmp_path / "g.safetensors"
    result = _run("--model", ckpt.path, "--data", data, "--rank", 1, "--out", out)
    assert result.exit_code == 0, result.output
    assert len(load_file(str(out))) == 2 * 7 * arch.layers


def _bad_inputs(tmp_path, data, adapter):
    """(name, extra args) for each user error; every case otherwise uses valid arguments."""
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text(json.dumps(get_preset("tiny").to_hf_config().to_dict()))
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((corrupt / "config.json").read_text())
    other = dataclasses.replace(get_preset("tiny"), hidden=get_preset("tiny").hidden // 2)
    cfg = LoraConfig(rank=3, alpha=5.0, targets=("q_proj",))
    mismatched = save_adapter(tmp_path / "mismatched", cfg, init_lora(other, cfg))

    def rows(name, *lines):
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        return path

    tiny = ["--model", "tiny", "--init", "random"]
    return {
        "unknown-preset": (["--model", "qwen9", "--init", "random", "--data", data], "unknown preset 'qwen9'"),
        "missing-checkpoint": (["--model", tmp_path / "nowhere", "--data", data], "not a directory"),
        "checkpoint-without-weights": (["--model", no_weights, "--data", data], "no *.safetensors"),
        "corrupt-checkpoint": (["--model", corrupt, "--data", data], "not a readable safetensors"),
        "pretrained-not-cached": (["--model", "qwen2.5-0.5b", "--data", data], "not in the local Hugging Face cache"),
        "tiny-has-no-weights": (["--model", "tiny", "--data", data], "--init random"),
        "adapter-shapes": ([*tiny, "--adapter", mismatched, "--data", data], "has shape"),
        "row-too-long": ([*tiny, "--data", rows("long.jsonl", json.dumps({"input_ids": [1] * 513}))],
                         "513 tokens"),
        "id-out-of-range": ([*tiny, "--data", rows("ids.jsonl", json.dumps({"input_ids": [1, 264]}))],
                            "token id 264"),
        "invalid-json": ([*tiny, "--data", rows("bad.jsonl", '{"input_ids": [1, 2]', "")], "not valid JSON"),
        "schema": ([*tiny, "--data", rows("schema.jsonl", json.dumps({"input_ids": [7]}))], "input_ids"),
        "bad-target": ([*tiny, "--targets", "q_proj,foo", "--data", data], "unknown LoRA target"),
    }


CASES = ["unknown-preset", "missing-checkpoint", "checkpoint-without-weights", "corrupt-checkpoint",
         "pretrained-not-cached", "tiny-has-no-weights", "adapter-shapes", "row-too-long", "id-out-of-range",
         "invalid-json", "schema", "bad-target"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exit_2_one_error_line_no_output(tmp_path, data, adapter, case, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    args, message = _bad_inputs(tmp_path, data, adapter)[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = _run(*args, "--out", out_dir / "grads.safetensors")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""
    assert list(out_dir.iterdir()) == []  # no output, no temporary file


def test_existing_output_untouched_after_error(tmp_path, data):
    out = tmp_path / "grads.safetensors"
    out.write_bytes(b"previous")
    result = _run("--model", "qwen9", "--init", "random", "--data", data, "--out", out)
    assert result.exit_code == 2
    assert out.read_bytes() == b"previous"


def test_missing_data_file_is_a_usage_error(tmp_path):
    result = _run("--model", "tiny", "--init", "random", "--data", tmp_path / "none.jsonl", "--out",
                  tmp_path / "g.safetensors")
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert not (tmp_path / "g.safetensors").exists()
