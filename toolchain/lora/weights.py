"""LoRA adapter tensors: per layer, per target, `a` = lora_A [r, in] and `b` = lora_B [out, r]."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.lora.config import LoraConfig
from toolchain.models.presets import ModelArch

__all__ = ["LoraPair", "LoraWeights", "init_lora", "lora_num_params"]


class LoraPair(NamedTuple):
    a: Tensor  # [r, in]   (PEFT lora_A.weight)
    b: Tensor  # [out, r]  (PEFT lora_B.weight)


# One dict per layer: target name -> pair. Only targeted projections have an entry.
LoraWeights = tuple[dict[str, LoraPair], ...]


def init_lora(arch: ModelArch, cfg: LoraConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
              zero_b: bool = True) -> LoraWeights:
    """PEFT's default init: A ~ kaiming-uniform(a=sqrt(5)) i.e. U(-1/sqrt(in), 1/sqrt(in)), B = 0.

    Args:
        zero_b: B = 0 (the adapter starts as the identity). False draws B like A, which tests use so
            that dA is not trivially zero.
    """
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(arch.layers):
        layer = {}
        for t in cfg.targets:
            d_out, d_in = arch.linear_shape(t)
            bound = 1 / math.sqrt(d_in)
            a = torch.empty(cfg.rank, d_in, dtype=dtype).uniform_(-bound, bound, generator=gen)
            b = torch.zeros(d_out, cfg.rank, dtype=dtype)
            if not zero_b:
                b.uniform_(-bound, bound, generator=gen)
            layer[t] = LoraPair(a, b)
        layers.append(layer)
    return tuple(layers)


def lora_num_params(arch: ModelArch, cfg: LoraConfig) -> int:
    return arch.layers * sum(cfg.rank * sum(arch.linear_shape(t)) for t in cfg.targets)
