"""Build `ModelWeights`: from a Hugging Face Qwen2 checkpoint directory, from the local HF cache
for a preset (`demo`: the package's own toolchain/assets/demo_model/), or random weights for any
preset (no download ever happens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from toolchain.errors import BadInput, MissingWeights, ShapeMismatch
from toolchain.models.keys import GLOBAL_KEYS, LAYER_KEYS
from toolchain.models.presets import HF_REPO_IDS, PRESETS, Qwen25Arch, get_preset
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["load_model", "random_weights", "weights_from_state_dict", "arch_from_hf_config", "state_dict_from_weights"]

Init = Literal["pretrained", "random"]


def load_model(spec: str, *, init: Init = "pretrained", seed: int = 0,
               dtype: torch.dtype = torch.float32) -> tuple[Qwen25Arch, ModelWeights]:
    """Resolve `--model` / `--init` into an architecture and its weights.

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
    path = Path(spec)
    if spec not in PRESETS and (path.exists() or "/" in spec or spec.startswith(".")):
        if init == "random":
            raise BadInput(f"--init random builds a preset; {spec!r} is a checkpoint path (drop --init random)")
        return load_checkpoint(path, dtype=dtype)
    arch = get_preset(spec)
    if init == "random":
        return arch, random_weights(arch, seed=seed, dtype=dtype)
    return load_checkpoint(_cached_checkpoint(spec), dtype=dtype)


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


def arch_from_hf_config(cfg: dict) -> Qwen25Arch:
    """Map a Qwen2 `config.json` dict to `Qwen25Arch`."""
    if cfg.get("model_type") != "qwen2":
        raise BadInput(f"config.json has model_type {cfg.get('model_type')!r}; only Qwen2 checkpoints are supported")
    try:
        return Qwen25Arch(
            hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
            kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
            max_positions=cfg.get("max_position_embeddings", 32768), rms_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(cfg), tie_embeddings=cfg.get("tie_word_embeddings", False),
        )
    except KeyError as e:
        raise BadInput(f"config.json lacks {e.args[0]!r}") from None


def _rope_theta(cfg: dict) -> float:
    # transformers 5 writes rope settings under `rope_parameters`; older files have `rope_theta`.
    params = cfg.get("rope_parameters") or {}
    scaling = params.get("rope_type", "default")
    if scaling != "default":
        raise BadInput(f"rope type {scaling!r} is not supported (only the default rotary embedding)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def load_checkpoint(path: Path, *, dtype: torch.dtype = torch.float32) -> tuple[Qwen25Arch, ModelWeights]:
    """Load a Hugging Face Qwen2 checkpoint directory (config.json + *.safetensors)."""
    from safetensors import SafetensorError, safe_open

    if not path.is_dir():
        raise BadInput(f"checkpoint {str(path)!r} is not a directory; pass a preset name or a checkpoint directory")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise MissingWeights(f"checkpoint {str(path)!r} has no config.json") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path / 'config.json'} is not valid JSON ({e.msg}, line {e.lineno})") from None
    arch = arch_from_hf_config(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise MissingWeights(f"checkpoint {str(path)!r} has no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    tensors[k] = sf.get_tensor(k)
        except (SafetensorError, OSError) as e:
            raise BadInput(f"{f} is not a readable safetensors file ({e})") from None
    return arch, weights_from_state_dict(arch, tensors, dtype=dtype)


def weights_from_state_dict(arch: Qwen25Arch, sd: dict[str, torch.Tensor], *,
                            dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Pick our tensors out of a Hugging Face state dict, checking every key and shape.

    Raises:
        MissingWeights: a required key is absent (named in the message).
        ShapeMismatch: a tensor's shape differs from the architecture's (named in the message).
    """
    def take(key: str, shape: tuple[int, ...]) -> torch.Tensor:
        if key not in sd:
            raise MissingWeights(f"checkpoint lacks {key!r}")
        t = sd[key]
        if tuple(t.shape) != shape:
            raise ShapeMismatch(f"{key!r} has shape {list(t.shape)}, the config implies {list(shape)}")
        return t.to(dtype)

    d, f, kv = arch.hidden, arch.intermediate, arch.kv_dim
    shapes = {"input_norm": (d,), "post_norm": (d,), "q_proj": (d, d), "q_bias": (d,), "k_proj": (kv, d),
              "k_bias": (kv,), "v_proj": (kv, d), "v_bias": (kv,), "o_proj": (d, d), "gate_proj": (f, d),
              "up_proj": (f, d), "down_proj": (d, f)}
    layers = tuple(
        LayerWeights(**{name: take(LAYER_KEYS[name].format(i), shapes[name]) for name in LayerWeights._fields})
        for i in range(arch.layers)
    )
    embed = take(GLOBAL_KEYS["embed"], (arch.vocab, d))
    if arch.tie_embeddings:
        lm_head = embed
    else:
        lm_head = take(GLOBAL_KEYS["lm_head"], (arch.vocab, d))
    return ModelWeights(embed, layers, take(GLOBAL_KEYS["final_norm"], (d,)), lm_head)


def state_dict_from_weights(weights: ModelWeights) -> dict[str, torch.Tensor]:
    """Inverse of `weights_from_state_dict` (HF key names; no `lm_head.weight` when tied)."""
    sd = {GLOBAL_KEYS["embed"]: weights.embed, GLOBAL_KEYS["final_norm"]: weights.final_norm}
    if not weights.tied:
        sd[GLOBAL_KEYS["lm_head"]] = weights.lm_head
    for i, lw in enumerate(weights.layers):
        for name, t in lw._asdict().items():
            sd[LAYER_KEYS[name].format(i)] = t
    return sd


def random_weights(arch: Qwen25Arch, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Seeded random weights: N(0, 0.02) matrices and biases (as HF's `initializer_range`),
    norms around 1. Built directly in `dtype` so a 3B preset needs no fp64 detour."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, mean: float = 0.0, std: float = 0.02) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype).normal_(mean, std, generator=gen)

    d, f, kv = arch.hidden, arch.intermediate, arch.kv_dim
    layers = tuple(
        LayerWeights(
            input_norm=normal(d, mean=1.0, std=0.1), q_proj=normal(d, d), q_bias=normal(d),
            k_proj=normal(kv, d), k_bias=normal(kv), v_proj=normal(kv, d), v_bias=normal(kv),
            o_proj=normal(d, d), post_norm=normal(d, mean=1.0, std=0.1), gate_proj=normal(f, d),
            up_proj=normal(f, d), down_proj=normal(d, f),
        )
        for _ in range(arch.layers)
    )
    embed = normal(arch.vocab, d)
    lm_head = embed if arch.tie_embeddings else normal(arch.vocab, d)
    return ModelWeights(embed, layers, normal(d, mean=1.0, std=0.1), lm_head)
