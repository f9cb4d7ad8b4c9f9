"""Build `ModelWeights`: from a Hugging Face checkpoint directory (model_type qwen2, qwen3 or llama), from the
local HF cache for a preset (`demo`: the package's own toolchain/assets/demo_model/), or random weights for any
preset (no download ever happens)."""

from __future__ import annotations

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
    """Map a `config.json` dict (model_type qwen2, qwen3 or llama) to `ModelArch`, every field checked against
    what the step computes (models/hf_config.py: an allow-list per family); an absent field takes the Hugging
    Face config class's default.

    Raises:
        BadInput: not a JSON object, another model_type (the message names the supported ones), a missing size,
            or a field the step does not compute as Hugging Face does (named with its value).
    """
    from toolchain.models.hf_config import check_config, field_value, rope_settings

    if not isinstance(cfg, dict):
        raise BadInput(f"config.json is a JSON {type(cfg).__name__ if cfg is not None else 'null'}, not an object")
    fam = family_for_model_type(cfg.get("model_type"))
    check_config(cfg, fam.name)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if cfg.get(key) is None:
            raise BadInput(f"config.json lacks {key!r}")
    get = lambda name: field_value(cfg, fam.name, name)  # noqa: E731
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", get("num_key_value_heads"))
    rope = rope_settings(cfg, fam.name)
    scaling = None
    if rope["rope_type"] == "llama3":
        scaling = RopeScaling(factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                              high_freq_factor=float(rope["high_freq_factor"]),
                              original_max_positions=rope["original_max_position_embeddings"])
    try:
        return _arch(fam, cfg, get, heads, kv_heads, rope, scaling)
    except BadInput as e:          # a relation between fields (divisibility): named as config.json names them
        msg = str(e)
        for ours, theirs in _CONFIG_NAMES.items():
            msg = msg.replace(f"`{ours}`", f"{theirs}")
        raise BadInput(f"config.json: {msg}") from None


_CONFIG_NAMES = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
                 "layers": "num_hidden_layers", "intermediate": "intermediate_size", "vocab": "vocab_size",
                 "max_positions": "max_position_embeddings"}


def _arch(fam, cfg, get, heads, kv_heads, rope, scaling) -> ModelArch:
    return ModelArch(
        family=fam.name, hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
        kv_heads=heads if kv_heads is None else kv_heads, head_dim=get("head_dim"),
        intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
        max_positions=get("max_position_embeddings"), rms_eps=float(get("rms_norm_eps")),
        rope_theta=float(rope["rope_theta"]), rope_scaling=scaling,
        tie_embeddings=get("tie_word_embeddings"),
    )


def checkpoint_source(path: Path) -> tuple[ModelArch, CheckpointSource]:
    """A Hugging Face checkpoint directory (config.json + *.safetensors) as an architecture and a source."""
    if not path.is_dir():
        raise BadInput(f"checkpoint {str(path)!r} is not a directory; pass a preset name or a checkpoint directory")
    from toolchain.validate import read_json

    config = path / "config.json"
    if not (config.exists() or config.is_symlink()):
        raise MissingWeights(f"checkpoint {str(path)!r} has no config.json")
    cfg = read_json(config)
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
