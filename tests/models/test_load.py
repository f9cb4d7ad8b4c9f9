"""Model loading: HF checkpoints (tied and untied), presets, and every error a user can cause."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import save_checkpoint, small_arch

from toolchain.errors import BadInput, MissingWeights, ShapeMismatch
from toolchain.models import PRESETS, ModelArch, get_preset, load_model, random_weights, state_dict_from_weights
from toolchain.models.load import arch_from_hf_config


def test_load_checkpoint_round_trips_arch_and_every_tensor(tmp_checkpoint):
    arch, weights = load_model(str(tmp_checkpoint.path), dtype=torch.float64)
    assert arch == tmp_checkpoint.arch
    assert weights.tied == arch.tie_embeddings
    expected = tmp_checkpoint.hf_model.state_dict()
    ours = state_dict_from_weights(weights)
    assert set(ours) == set(expected) - ({"lm_head.weight"} if arch.tie_embeddings else set())
    for k, v in ours.items():
        assert v.dtype == torch.float64
        assert torch.equal(v, expected[k].double()), k


def test_load_checkpoint_keeps_float32_by_default(tmp_checkpoint):
    _, weights = load_model(str(tmp_checkpoint.path))
    assert weights.embed.dtype == torch.float32 and weights.layers[0].q_proj.dtype == torch.float32


@pytest.mark.parametrize(("name", "hidden", "layers", "heads", "kv_heads", "intermediate", "head_dim"), [
    ("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 64),
    ("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 128),
    ("qwen2.5-3b", 2048, 36, 16, 2, 11008, 128),
])
def test_presets_match_design(name, hidden, layers, heads, kv_heads, intermediate, head_dim):
    """Numbers from the model cards' config.json (docs/foundation.md)."""
    arch = get_preset(name)
    assert (arch.hidden, arch.layers, arch.heads, arch.kv_heads, arch.intermediate) == (
        hidden, layers, heads, kv_heads, intermediate)
    assert arch.head_dim == head_dim
    assert arch.vocab == 151936 and arch.rms_eps == 1e-6 and arch.rope_theta == 1e6
    assert arch.family == "qwen2" and arch.tie_embeddings and arch.qkv_bias and not arch.qk_norm


def test_tiny_preset_fits_the_byte_tokenizer():
    from toolchain.text.tokenizer import ByteTokenizer

    tiny = get_preset("tiny")
    assert tiny.vocab == ByteTokenizer.vocab and tiny.heads % tiny.kv_heads == 0 and tiny.layers >= 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_hf_config_round_trip(name):
    arch = PRESETS[name]
    assert arch_from_hf_config(arch.to_hf_config().to_dict()) == arch


def test_random_init_is_seeded_and_shaped():
    arch = small_arch(tied=False)
    _, a = load_model("tiny", init="random", seed=3)
    _, b = load_model("tiny", init="random", seed=3)
    _, c = load_model("tiny", init="random", seed=4)
    assert torch.equal(a.layers[0].q_proj, b.layers[0].q_proj)
    assert not torch.equal(a.layers[0].q_proj, c.layers[0].q_proj)
    assert a.tied
    w = random_weights(arch, seed=0)
    assert not w.tied and w.lm_head.shape == (arch.vocab, arch.hidden)
    assert w.layers[0].k_proj.shape == (arch.kv_dim, arch.hidden)


def test_unknown_preset():
    with pytest.raises(BadInput, match="unknown preset 'qwen2.5-72b'.*tiny"):
        load_model("qwen2.5-72b", init="random")


def test_missing_checkpoint_directory(tmp_path):
    with pytest.raises(BadInput, match="not a directory"):
        load_model(str(tmp_path / "nope"))


def test_random_init_with_a_checkpoint_path(tmp_checkpoint):
    with pytest.raises(BadInput, match="--init random"):
        load_model(str(tmp_checkpoint.path), init="random")


def test_missing_config(tmp_checkpoint):
    (tmp_checkpoint.path / "config.json").unlink()
    with pytest.raises(MissingWeights, match="config.json"):
        load_model(str(tmp_checkpoint.path))


def test_corrupt_config(tmp_checkpoint):
    (tmp_checkpoint.path / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        load_model(str(tmp_checkpoint.path))


def test_unsupported_model_type(tmp_checkpoint):
    cfg = json.loads((tmp_checkpoint.path / "config.json").read_text())
    cfg["model_type"] = "gemma3"
    (tmp_checkpoint.path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadInput, match="model_type 'gemma3'; supported model types: qwen2, qwen3, llama"):
        load_model(str(tmp_checkpoint.path))


def test_qwen2_tensors_under_a_llama_config(tmp_checkpoint):
    """A Qwen2 checkpoint relabelled llama: its q/k/v biases would be dropped silently; they are refused."""
    cfg = json.loads((tmp_checkpoint.path / "config.json").read_text())
    cfg["model_type"] = "llama"
    for qwen2_only in ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers"):
        cfg.pop(qwen2_only, None)       # refused for llama (models/hf_config.py), before the tensors are looked at
    (tmp_checkpoint.path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ShapeMismatch, match="tensors the llama config does not use: 'model.layers.0.self_attn.k_proj.bias'"):
        load_model(str(tmp_checkpoint.path))


def test_missing_safetensors(tmp_checkpoint):
    for f in tmp_checkpoint.path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(MissingWeights, match="safetensors"):
        load_model(str(tmp_checkpoint.path))


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"\xff" * 8 + b"{}"], ids=["empty", "text", "header"])
def test_corrupt_safetensors(tmp_checkpoint, content):
    (f,) = tmp_checkpoint.path.glob("*.safetensors")
    f.write_bytes(content)
    with pytest.raises(BadInput, match="not a readable safetensors"):
        load_model(str(tmp_checkpoint.path))


def test_wrong_shapes(tmp_path):
    """config.json says one architecture, the tensors have another."""
    ckpt = save_checkpoint(tmp_path / "ckpt", small_arch(tied=True))
    cfg = json.loads((ckpt.path / "config.json").read_text())
    cfg["intermediate_size"] += 1
    (ckpt.path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ShapeMismatch, match="mlp.*shape"):
        load_model(str(ckpt.path))


def test_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = save_checkpoint(tmp_path / "ckpt", small_arch(tied=False))
    (f,) = ckpt.path.glob("*.safetensors")
    sd = load_file(str(f))
    del sd["model.layers.1.self_attn.v_proj.bias"]
    save_file(sd, str(f))
    with pytest.raises(MissingWeights, match="model.layers.1.self_attn.v_proj.bias"):
        load_model(str(ckpt.path))


def test_untied_checkpoint_without_lm_head(tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = save_checkpoint(tmp_path / "ckpt", small_arch(tied=False))
    (f,) = ckpt.path.glob("*.safetensors")
    sd = load_file(str(f))
    del sd["lm_head.weight"]
    save_file(sd, str(f))
    with pytest.raises(MissingWeights, match="lm_head.weight"):
        load_model(str(ckpt.path))


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "tiny"])
def test_pretrained_preset_without_cached_weights(preset, tmp_path, monkeypatch):
    import huggingface_hub.constants

    for var in ("HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the cache location at import time; point the live constant there too.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "HF_HUB_CACHE"))
    with pytest.raises(MissingWeights, match="--init random") as err:
        load_model(preset)
    assert "--model PATH" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "HF_HUB_CACHE").exists() or not any((tmp_path / "HF_HUB_CACHE").iterdir())


def test_arch_validation():
    with pytest.raises(BadInput, match="divisible by `kv_heads`"):
        ModelArch(hidden=12, layers=1, heads=3, kv_heads=2, intermediate=5)
    with pytest.raises(BadInput, match="even"):
        ModelArch(hidden=9, layers=1, heads=3, kv_heads=1, intermediate=5)


def _family_arch(family: str, *, tied: bool):
    import dataclasses

    from helpers import random_family_arch

    return dataclasses.replace(random_family_arch(2, family), tie_embeddings=tied)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_load_qwen3_and_llama_checkpoints(tmp_path, family, tied):
    """`Qwen3ForCausalLM(config).save_pretrained(...)` / `LlamaForCausalLM`: the arch (flags, explicit head_dim,
    llama3 rope scaling) and every tensor come back (q/k norms for qwen3; no biases)."""
    arch = _family_arch(family, tied=tied)
    ckpt = save_checkpoint(tmp_path / "ckpt", arch)
    assert type(ckpt.hf_model).__name__ == {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[family]
    cfg = json.loads((ckpt.path / "config.json").read_text())
    assert cfg["model_type"] == family and cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]
    loaded, weights = load_model(str(ckpt.path), dtype=torch.float64)
    assert loaded == arch and loaded.family == family and weights.tied == tied
    assert (loaded.rope_scaling is not None) == (family == "llama")
    expected = ckpt.hf_model.state_dict()
    ours = state_dict_from_weights(weights)
    assert set(ours) == set(expected) - ({"lm_head.weight"} if tied else set())
    assert any(k.endswith("q_norm.weight") for k in ours) == (family == "qwen3")
    assert not any(k.endswith("_proj.bias") for k in ours)
    for k, v in ours.items():
        assert torch.equal(v, expected[k].double()), k


@pytest.mark.parametrize("name", ["qwen3-0.6b", "qwen3-1.7b", "llama3.2-1b", "llama3.2-3b"])
def test_new_family_presets_match_their_hf_configs(name):
    """Numbers from the HF config.json of Qwen/Qwen3-0.6B, -1.7B and meta-llama/Llama-3.2-1B, -3B."""
    expected = {
        "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936, 40960, 1e-6, 1e6),
        "qwen3-1.7b": (2048, 28, 16, 8, 128, 6144, 151936, 40960, 1e-6, 1e6),
        "llama3.2-1b": (2048, 16, 32, 8, 64, 8192, 128256, 131072, 1e-5, 5e5),
        "llama3.2-3b": (3072, 28, 24, 8, 128, 8192, 128256, 131072, 1e-5, 5e5),
    }[name]
    a = get_preset(name)
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab, a.max_positions,
            a.rms_eps, a.rope_theta) == expected
    assert a.tie_embeddings and not a.qkv_bias
    assert a.qk_norm == name.startswith("qwen3")
    if name.startswith("llama"):
        s = a.rope_scaling
        assert (s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_positions) == (32.0, 1.0, 4.0, 8192)


@pytest.mark.parametrize(("edit", "message"), [
    ({"attention_bias": True}, "sets attention_bias = True, which is not supported here"),
    ({"mlp_bias": True}, "sets mlp_bias = True"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "sets rope_parameters.rope_type = 'yarn', which is not supported"),
])
def test_llama_features_we_do_not_compute_are_refused(tmp_path, edit, message):
    ckpt = save_checkpoint(tmp_path / "ckpt", _family_arch("llama", tied=True))
    cfg = json.loads((ckpt.path / "config.json").read_text())
    cfg.update(edit)
    (ckpt.path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadInput, match=message):
        load_model(str(ckpt.path))


def test_family_flags_are_the_familys():
    with pytest.raises(BadInput, match="qwen3 models have qk_norm = True; got False"):
        ModelArch(family="qwen3", hidden=8, layers=1, heads=2, kv_heads=1, intermediate=4, qk_norm=False)
    with pytest.raises(BadInput, match="qwen2 models have no rope scaling"):
        ModelArch(hidden=8, layers=1, heads=2, kv_heads=1, intermediate=4, rope_scaling=get_preset("llama3.2-1b").rope_scaling)
    with pytest.raises(BadInput, match="unknown model family 'gemma'"):
        ModelArch(family="gemma", hidden=8, layers=1, heads=2, kv_heads=1, intermediate=4)


def test_arch_dict_round_trip_and_older_exports():
    for arch in PRESETS.values():
        assert ModelArch.from_dict(json.loads(json.dumps(arch.to_dict()))) == arch
    old = {"attention_bias": True, "heads": 4, "hidden": 64, "intermediate": 192, "kv_heads": 2, "layers": 8,
           "max_positions": 512, "rms_eps": 1e-06, "rope_theta": 1000000.0, "tie_embeddings": True, "vocab": 264}
    assert ModelArch.from_dict(old) == get_preset("tiny")
    with pytest.raises(BadInput, match=r"unknown fields \['sliding'\]"):
        ModelArch.from_dict({**old, "sliding": 4})
