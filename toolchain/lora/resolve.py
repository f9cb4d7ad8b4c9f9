"""The model and the adapter a run starts from: `--model/--init/--seed` and either `--adapter DIR` (a
PEFT adapter) or a fresh adapter of `--rank/--alpha/--targets` (PEFT's default init)."""

from __future__ import annotations

from pathlib import Path

import torch

from toolchain.lora.config import LoraConfig, parse_targets
from toolchain.lora.peft_io import load_adapter
from toolchain.lora.weights import LoraWeights, init_lora
from toolchain.models import ModelWeights, ModelArch, load_model
from toolchain.validate import check_rank

__all__ = ["lora_config", "load_model_and_adapter", "resolve_adapter"]


def lora_config(*, rank: int = 8, alpha: float | None = None, targets: str = "all") -> LoraConfig:
    """A fresh adapter's config from the command-line values.

    Args:
        rank: LoRA rank r. Default: 8.
        alpha: LoRA alpha (scale = alpha / r). Default: None, 2 x rank.
        targets: comma-separated projections, or "all". Default: "all".
    """
    return LoraConfig(rank=rank, alpha=alpha if alpha is not None else 2.0 * rank, targets=parse_targets(targets))


def load_model_and_adapter(model: str, *, init: str = "pretrained", seed: int = 0, adapter: Path | None = None,
                           rank: int = 8, alpha: float | None = None, targets: str = "all",
                           dtype: torch.dtype = torch.float32,
                           zero_b: bool = True) -> tuple[ModelArch, ModelWeights, LoraConfig, LoraWeights]:
    """Resolve the model and the starting adapter.

    Args:
        model: a preset name or a Hugging Face checkpoint directory (`toolchain.models.load_model`).
        init: "pretrained" or "random" (seeded random weights of a preset). Default: "pretrained".
        seed: seed of the random weights and of the fresh adapter's lora_A. Default: 0.
        adapter: a PEFT adapter directory to start from; its config overrides rank/alpha/targets.
            Default: None, a fresh adapter.
        rank / alpha / targets: the fresh adapter's shape (see `lora_config`).
        dtype: dtype of the weights and the adapter. Default: torch.float32.
        zero_b: a fresh adapter's lora_B is zero (PEFT's init: the adapter starts as the identity).
            Default: True.

    Returns:
        (arch, weights, cfg, lora): the model, then the LoRA config, then the LoRA weights.

    Raises:
        BadInput: unknown preset, bad targets, or a rank larger than a targeted projection allows.
        ShapeMismatch: the adapter's tensors do not fit the model.
    """
    arch, weights = load_model(model, init=init, seed=seed, dtype=dtype)
    cfg, lora = resolve_adapter(arch, seed=seed, adapter=adapter, rank=rank, alpha=alpha, targets=targets,
                                dtype=dtype, zero_b=zero_b)
    return arch, weights, cfg, lora


def resolve_adapter(arch: ModelArch, *, seed: int = 0, adapter: Path | None = None, rank: int = 8,
                    alpha: float | None = None, targets: str = "all", dtype: torch.dtype = torch.float32,
                    zero_b: bool = True) -> tuple[LoraConfig, LoraWeights]:
    """The starting adapter of `arch` (`load_model_and_adapter`'s arguments; no base weights needed)."""
    if adapter is not None:
        return load_adapter(adapter, arch, dtype=dtype)
    cfg = lora_config(rank=rank, alpha=alpha, targets=targets)
    check_rank(cfg.rank, arch, cfg.targets)
    return cfg, init_lora(arch, cfg, seed=seed, dtype=dtype, zero_b=zero_b)
