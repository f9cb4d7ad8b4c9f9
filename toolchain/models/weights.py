"""Frozen base weights of a model as plain tensor bundles (NamedTuples: pytrees, export-friendly).

Layouts follow Hugging Face: a projection's `weight` is [out, in]. A tensor the architecture does not have
(`ModelArch.layer_shapes`: q/k/v biases without `qkv_bias`, q/k norms without `qk_norm`) is None."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["LayerWeights", "ModelWeights"]


class LayerWeights(NamedTuple):
    input_norm: Tensor  # [d]
    q_proj: Tensor      # [q, d]   q = heads * head_dim
    q_bias: Tensor | None  # [q]  (qkv_bias)
    k_proj: Tensor      # [kv, d]
    k_bias: Tensor | None  # [kv]
    v_proj: Tensor      # [kv, d]
    v_bias: Tensor | None  # [kv]
    o_proj: Tensor      # [d, q]
    post_norm: Tensor   # [d]
    gate_proj: Tensor   # [f, d]
    up_proj: Tensor     # [f, d]
    down_proj: Tensor   # [d, f]
    q_norm: Tensor | None = None  # [head_dim] (qk_norm), shared by the query heads
    k_norm: Tensor | None = None  # [head_dim]

    def present(self) -> dict[str, Tensor]:
        """The tensors this layer has, by field name, in field order."""
        return {name: t for name, t in zip(self._fields, self) if t is not None}


class ModelWeights(NamedTuple):
    embed: Tensor                      # [V, d]
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor                 # [d]
    lm_head: Tensor                    # [V, d]; the same tensor object as `embed` when tied

    @property
    def tied(self) -> bool:
        return self.lm_head is self.embed

    def to(self, dtype) -> "ModelWeights":
        layers = tuple(LayerWeights(*(None if t is None else t.to(dtype) for t in lw)) for lw in self.layers)
        embed = self.embed.to(dtype)
        lm_head = embed if self.tied else self.lm_head.to(dtype)
        return ModelWeights(embed, layers, self.final_norm.to(dtype), lm_head)
