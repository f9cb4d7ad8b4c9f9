"""Build `ModelWeights`: from a Hugging Face checkpoint directory (model_type qwen2, qwen3 or llama), from the
local HF cache for a preset (`demo`: the package's own toolchain/assets/demo_model/), or random weights for any
preset (no download ever happens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from toolchain.errors import BadInput, MissingWeights
from toolchain.models.keys import GLOBAL_KEYS, LAYER_KEYS
from toolchain.models.arch import ModelArch, RopeScaling
from toolchain.models.family import family_for_model_type
from toolchain.models.presets import HF_REPO_IDS, PRESETS, get_preset
from toolchain.models.source import CheckpointSource, RandomSource, WeightSource, check_checkpoint_keys, materialize
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["load_model", "model_source", "checkpoint_source", "random_weights", "weights_from_state_dict",
           "arch_from_hf_config", "state_dict_from_weights"]

Init = Literal["pretrained", "random"]


def load_model(spec: str, *, init: Init = "pretrained", seed: int = 0,
               dtype: torch.dtype = torch.float32) -> tuple[ModelArch, ModelWeights]:
    """Resolve `--model` / `--init` into an architecture and its weights, in memory (`model_source` for a
    source read one tensor at a time).

    Args:
        spec: a preset name (see `PRESETS`) or a checkpoint directory (config.json + safetensors).
        init: "pretrained" loads real weights; "random" builds a preset with seeded random weights.
        seed: seed of the random weights. Default: 0.
        dtype: dtype of the returned weights. Default: torch.float32.

    Raises:
        BadInput: unknown preset, or `--init random` with a checkpoint directory.
        MissingWeights: the preset's weights are not in the local Hugging Face cache.
        ShapeMismatch: the checkpoint's tensors do not fit its config.
    """
    arch, source = model_source(spec, init=init, seed=seed)
    return arch, materialize(source, dtype)


def model_source(spec: str, *, init: Init = "pretrained", seed: int = 0) -> tuple[ModelArch, WeightSource]:
    """`load_model` without loading: the architecture and a source of its tensors (models/source.py), a
    checkpoint's keys, shapes, dtypes and files already checked. Raises as `load_model`."""
    path = Path(spec)
    if spec not in PRESETS and (path.exists() or "/" in spec or spec.startswith(".")):
        if init == "random":
            raise BadInput(f"--init random builds a preset; {spec!r} is a checkpoint path (drop --init random)")
        return checkpoint_source(path)
    arch = get_preset(spec)
    if init == "random":
        return arch, RandomSource(arch, seed)
    return checkpoint_source(_cached_checkpoint(spec))


# Presets whose pretrained weights ship inside the package (a Hugging Face checkpoint directory).
BUNDLED_CHECKPOINTS: dict[str, Path] = {"demo": Path(__file__).resolve().parents[1] / "assets" / "demo_model"}


def _cached_checkpoint(preset: str) -> Path:
    if preset in BUNDLED_CHECKPOINTS:
        return BUNDLED_CHECKPOINTS[preset]
    repo_id = HF_REPO_IDS.get(preset)
    hint = "use --init random for random weights, or --model PATH for a downloaded checkpoint"
    if repo_id is None:
        raise MissingWeights(f"preset {preset!r} has no pretrained weights; {hint}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError and friends: nothing cached, and we never download
        raise MissingWeights(f"weights of {preset} ({repo_id}) are not in the local Hugging Face cache; {hint}") from None


def arch_from_hf_config(cfg: dict) -> ModelArch:
    """Map a `config.json` dict (model_type qwen2, qwen3 or llama) to `ModelArch`.

    Raises:
        BadInput: another model_type (the message names the supported ones), a missing field, or a feature
            this toolchain does not compute (o_proj / MLP biases, a rope type other than default / llama3).
    """
    fam = family_for_model_type(cfg.get("model_type"))
    for flag in ("attention_bias", "mlp_bias"):
        if not fam.qkv_bias and cfg.get(flag):
            raise BadInput(f"config.json sets {flag}: true; {fam.name} models are supported without biases")
    try:
        heads = cfg["num_attention_heads"]
        return ModelArch(
            family=fam.name, hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=cfg.get("head_dim") or None,
            intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
            max_positions=cfg.get("max_position_embeddings", 32768), rms_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(cfg), rope_scaling=_rope_scaling(cfg),
            tie_embeddings=cfg.get("tie_word_embeddings", False),
        )
    except KeyError as e:
        raise BadInput(f"config.json lacks {e.args[0]!r}") from None


def _rope_params(cfg: dict) -> dict:
    # transformers 5 writes rope settings under `rope_parameters`; older files have `rope_theta` and
    # `rope_scaling` (null for plain RoPE).
    return {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}


def _rope_theta(cfg: dict) -> float:
    return float(_rope_params(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _rope_scaling(cfg: dict) -> RopeScaling | None:
    params = _rope_params(cfg)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise BadInput(f"rope type {kind!r} is not supported (only the default rotary embedding and llama3)")
    try:
        return RopeScaling(factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                           high_freq_factor=float(params["high_freq_factor"]),
                           original_max_positions=int(params["original_max_position_embeddings"]))
    except KeyError as e:
        raise BadInput(f"config.json's llama3 rope scaling lacks {e.args[0]!r}") from None


def checkpoint_source(path: Path) -> tuple[ModelArch, CheckpointSource]:
    """A Hugging Face checkpoint directory (config.json + *.safetensors) as an architecture and a source."""
    if not path.is_dir():
        raise BadInput(f"checkpoint {str(path)!r} is not a directory; pass a preset name or a checkpoint directory")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise MissingWeights(f"checkpoint {str(path)!r} has no config.json") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path / 'config.json'} is not valid JSON ({e.msg}, line {e.lineno})") from None
    arch = arch_from_hf_config(cfg)
    return arch, CheckpointSource(arch, path)


def load_checkpoint(path: Path, *, dtype: torch.dtype = torch.float32) -> tuple[ModelArch, ModelWeights]:
    """Load a Hugging Face checkpoint directory (config.json + *.safetensors) into memory."""
    arch, source = checkpoint_source(path)
    return arch, materialize(source, dtype)


def weights_from_state_dict(arch: ModelArch, sd: dict[str, torch.Tensor], *,
                            dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Pick our tensors out of a Hugging Face state dict, checking every key and shape (`check_checkpoint_keys`).

    Raises:
        MissingWeights: a required key is absent (named in the message).
        ShapeMismatch: a tensor's shape differs from the architecture's (named in the message), or the state
            dict has tensors the architecture does not use (e.g. q/k/v biases under a config without them).
    """
    check_checkpoint_keys(arch, {k: tuple(t.shape) for k, t in sd.items()})
    shapes = arch.layer_shapes()
    absent = {name: None for name in LayerWeights._fields if name not in shapes}
    layers = tuple(LayerWeights(**{name: sd[LAYER_KEYS[name].format(i)].to(dtype) for name in shapes}, **absent)
                   for i in range(arch.layers))
    embed = sd[GLOBAL_KEYS["embed"]].to(dtype)
    lm_head = embed if arch.tie_embeddings else sd[GLOBAL_KEYS["lm_head"]].to(dtype)
    return ModelWeights(embed, layers, sd[GLOBAL_KEYS["final_norm"]].to(dtype), lm_head)


def state_dict_from_weights(weights: ModelWeights) -> dict[str, torch.Tensor]:
    """Inverse of `weights_from_state_dict` (HF key names; no `lm_head.weight` when tied)."""
    sd = {GLOBAL_KEYS["embed"]: weights.embed, GLOBAL_KEYS["final_norm"]: weights.final_norm}
    if not weights.tied:
        sd[GLOBAL_KEYS["lm_head"]] = weights.lm_head
    for i, lw in enumerate(weights.layers):
        for name, t in lw.present().items():
            sd[LAYER_KEYS[name].format(i)] = t
    return sd


def random_weights(arch: ModelArch, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Seeded random weights in memory (`RandomSource`: N(0, 0.02) matrices and biases, as HF's
    `initializer_range`, norms N(1, 0.1); drawn in float32, each tensor from a generator of its own, then
    converted to `dtype`)."""
    return materialize(RandomSource(arch, seed), dtype)
