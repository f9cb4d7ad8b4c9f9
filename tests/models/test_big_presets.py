"""The 4B-8B presets (qwen2.5-7b, qwen3-4b, qwen3-8b, llama3.1-8b) against their model cards' config.json, and
checkpoints with the same config fields at small shapes.

1. Each preset equals what `arch_from_hf_config` reads from its model card's config.json, written out here as
   published on the Hugging Face Hub (Qwen/Qwen2.5-7B, Qwen/Qwen3-4B, Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B;
   transcribed from those files, the hub is not reachable from the tests), and its HF config class round-trips it.
2. The same config.json with only the sizes shrunk builds the HF model class (`Qwen2ForCausalLM`, ...);
   `save_pretrained` of it is a `--model PATH` checkpoint whose architecture, tensors and loss (float64) are
   Hugging Face's: the untied heads, the padded Qwen2.5-7B vocabulary, Llama 3.1's rope scaling, Qwen3's q/k norms.
3. A checkpoint whose config.json names the 7B shape but whose shard holds another model's tensors is one
   `Error:` line (exit 2) and writes nothing.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import float64_faithful_hf, hf_loss, randomize_hf_params

from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import model_loss
from toolchain.models import PRESETS, get_preset, load_model
from toolchain.models.family import get_family
from toolchain.models.load import arch_from_hf_config

# The model cards' config.json, every field as published (hub ids in HF_REPO_IDS).
CONFIG_JSON: dict[str, dict] = {
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 152064},
    "qwen3-4b": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
        "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 40960,
        "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
        "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "llama3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256},
}
BIG = tuple(CONFIG_JSON)

# The sizes shrunk, every other field kept: GQA kept (heads / kv_heads), head_dim != hidden / heads where the
# model's differs (qwen3-4b: 32 x 128 = 4096 != 2560), Qwen2.5-7B's vocabulary padded past the tokenizer's.
SMALL = {
    "qwen2.5-7b": {"hidden_size": 28, "num_attention_heads": 7, "num_key_value_heads": 1, "intermediate_size": 40,
                   "num_hidden_layers": 2, "vocab_size": 72, "max_window_layers": 2},
    "qwen3-4b": {"hidden_size": 20, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
                 "intermediate_size": 36, "num_hidden_layers": 2, "vocab_size": 64, "max_window_layers": 2},
    "qwen3-8b": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
                 "intermediate_size": 48, "num_hidden_layers": 2, "vocab_size": 64, "max_window_layers": 2},
    "llama3.1-8b": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1,
                    "intermediate_size": 56, "num_hidden_layers": 2, "vocab_size": 80},
}


def test_every_new_preset_is_listed_with_its_hub_id():
    from toolchain.models.presets import HF_REPO_IDS

    assert set(BIG) <= set(PRESETS)
    assert {n: HF_REPO_IDS[n] for n in BIG} == {"qwen2.5-7b": "Qwen/Qwen2.5-7B", "qwen3-4b": "Qwen/Qwen3-4B",
                                                "qwen3-8b": "Qwen/Qwen3-8B", "llama3.1-8b": "meta-llama/Llama-3.1-8B"}


@pytest.mark.parametrize("name", BIG)
def test_preset_is_its_model_cards_config(name):
    arch = get_preset(name)
    assert arch_from_hf_config(copy.deepcopy(CONFIG_JSON[name])) == arch
    hf = arch.to_hf_config()                         # the family's transformers config class
    assert type(hf).__name__ == get_family(arch.family).hf_config_class
    cfg = CONFIG_JSON[name]
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads,
            hf.intermediate_size, hf.vocab_size, hf.max_position_embeddings, hf.rms_norm_eps,
            hf.tie_word_embeddings) == (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                                        cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"],
                                        cfg["max_position_embeddings"], cfg["rms_norm_eps"], cfg["tie_word_embeddings"])
    assert hf.head_dim == cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    assert arch_from_hf_config(hf.to_dict()) == arch


def test_preset_sizes():
    """What the presets hold, independent of the parsing: untied heads at 7B/8B, Qwen3-4B tied, Llama 3.1's
    rope factor 8 (3.2's is 32), and the parameter counts the model cards state (7.6B, 4.0B, 8.2B, 8.0B)."""
    from toolchain.models.source import model_tensor_names, tensor_shape

    def params(name):
        a = get_preset(name)
        return sum(torch.Size(tensor_shape(a, t)).numel() for t in model_tensor_names(a))

    assert [get_preset(n).tie_embeddings for n in BIG] == [False, True, False, False]
    assert get_preset("llama3.1-8b").rope_scaling.factor == 8.0
    assert get_preset("llama3.2-1b").rope_scaling.factor == 32.0
    assert [round(params(n) / 1e9, 1) for n in BIG] == [7.6, 4.0, 8.2, 8.0]


def _small_checkpoint(name: str, path):
    import transformers

    cfg = {**copy.deepcopy(CONFIG_JSON[name]), **SMALL[name]}
    if cfg.get("rope_scaling"):
        cfg["rope_scaling"]["original_max_position_embeddings"] = 8   # shorter than the row: every band is used
    fam = get_family(cfg["model_type"])
    config = getattr(transformers, fam.hf_config_class).from_dict(cfg)
    config._attn_implementation = "eager"
    model = fam.causal_lm()(config).to(torch.float64).eval()
    randomize_hf_params(model, torch.Generator().manual_seed(3))
    model.to(torch.float32).save_pretrained(path, safe_serialization=True)
    return cfg, model


@pytest.mark.parametrize("name", BIG)
def test_small_checkpoint_with_the_presets_config_fields_loads_as_hugging_face_computes(name, tmp_path):
    cfg, model = _small_checkpoint(name, tmp_path / "ckpt")
    arch, weights = load_model(str(tmp_path / "ckpt"), dtype=torch.float64)
    preset = get_preset(name)
    for field in ("family", "tie_embeddings", "rms_eps", "rope_theta", "max_positions", "qkv_bias", "qk_norm"):
        assert getattr(arch, field) == getattr(preset, field), field
    assert (arch.rope_scaling is None) == (preset.rope_scaling is None)
    assert arch.vocab == cfg["vocab_size"] and weights.tied == preset.tie_embeddings
    assert arch_from_hf_config(arch.to_hf_config().to_dict()) == arch
    ids = torch.randint(0, arch.vocab, (14,), generator=torch.Generator().manual_seed(1))
    with float64_faithful_hf(), torch.no_grad():
        expected = hf_loss(model.to(torch.float64), ids, ids)
    lora_cfg = LoraConfig(rank=2, alpha=4)
    got = model_loss(arch, weights, lora_cfg, init_lora(arch, lora_cfg, seed=0, dtype=torch.float64), ids, ids)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=0)


def _mismatched_checkpoint(path):
    """config.json of Qwen2.5-7B, one shard holding a small model's tensors under the same keys."""
    from safetensors.torch import save_file

    from toolchain.models.load import state_dict_from_weights
    from toolchain.models import random_weights

    small = arch_from_hf_config({**copy.deepcopy(CONFIG_JSON["qwen2.5-7b"]), **SMALL["qwen2.5-7b"]})
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG_JSON["qwen2.5-7b"]))
    sd = {k: v.contiguous() for k, v in state_dict_from_weights(random_weights(small, seed=0)).items()}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("command", ["export", "bench"])
def test_a_7b_config_over_shards_of_another_size_is_one_error_line(command, tmp_path):
    from click.testing import CliRunner

    from toolchain.cli import cli

    _mismatched_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    args = (["export", "--model", str(tmp_path / "ckpt"), "--out", str(out)] if command == "export" else
            ["bench", "memory", "--model", str(tmp_path / "ckpt"), "--modes", "mesp", "--quant", "int4",
             "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "model.embed_tokens.weight" in lines[0] and "[152064, 3584]" in lines[0]
    assert "7.62B parameters" in lines[0] and "not the same model" in lines[0]
    assert not out.exists()


def test_model_option_help_names_every_preset():
    """`--model`'s help lists the names it takes: every preset of every family (the help is a fixed string)."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    for command in (["export"], ["bench", "memory"]):
        out = CliRunner().invoke(cli, [*command, "--help"]).output
        listed = "".join(out.split()).split("Preset(", 1)[1].split(")", 1)[0].split(",")
        assert sorted(listed) == sorted(PRESETS), command
