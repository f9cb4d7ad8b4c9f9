"""Frozen base weights of a Qwen2 model as plain tensor bundles (NamedTuples: pytrees, export-friendly).

Layouts follow Hugging Face: a projection's `weight` is [out, in]."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["LayerWeights", "ModelWeights"]


class LayerWeights(NamedTuple):
    input_norm: Tensor  # [d]
    q_proj: Tensor      # [d, d]
    q_bias: Tensor      # [d]
    k_proj: Tensor      # [kv, d]
    k_bias: Tensor      # [kv]
    v_proj: Tensor      # [kv, d]
    v_bias: Tensor      # [kv]
    o_proj: Tensor      # [d, d]
    post_norm: Tensor   # [d]
    gate_proj: Tensor   # [f, d]
    up_proj: Tensor     # [f, d]
    down_proj: Tensor   # [d, f]


class ModelWeights(NamedTuple):
    embed: Tensor                      # [V, d]
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor                 # [d]
    lm_head: Tensor                    # [V, d]; the same tensor object as `embed` when tied

    @property
    def tied(self) -> bool:
        return self.lm_head is self.embed

    def to(self, dtype) -> "ModelWeights":
        layers = tuple(LayerWeights(*(t.to(dtype) for t in lw)) for lw in self.layers)
        embed = self.embed.to(dtype)
        lm_head = embed if self.tied else self.lm_head.to(dtype)
        return ModelWeights(embed, layers, self.final_norm.to(dtype), lm_head)
