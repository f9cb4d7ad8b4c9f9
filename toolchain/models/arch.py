"""The architecture of a decoder-only transformer of one of the supported families, as one frozen dataclass.

Every family here (qwen2 = Qwen2 / Qwen2.5, qwen3 = Qwen3 dense, llama = Llama 3.x) is the same block: RMSNorm,
GQA attention with rotary embeddings, SwiGLU MLP, RMSNorm, with residual adds. They differ only in feature flags,
which the step reads (never the family's name):

  qkv_bias      q, k, v projections have biases (qwen2; o_proj and the MLP never do here)
  qk_norm       per-head RMSNorm on q and k (weights [head_dim]) after the projection, before RoPE (qwen3)
  head_dim      explicit; may differ from hidden / heads (qwen3, llama)
  rope_scaling  Llama 3's rescaled rotary frequencies (llama; `RopeScaling`)
  tie_embeddings the LM head is the input embedding matrix

The family (toolchain/models/<family>/) fixes which flags are possible, maps `config.json` to and from this
class and holds the presets.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from toolchain.errors import BadInput

__all__ = ["ModelArch", "RopeScaling", "FAMILY_NAMES"]

# The families `family` may name (toolchain/models/<family>/ defines each).
FAMILY_NAMES: tuple[str, ...] = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rotary scaling (`rope_type: llama3` in config.json): frequencies whose wavelength exceeds
    `original_max_positions / low_freq_factor` are divided by `factor`, those under
    `original_max_positions / high_freq_factor` are kept, and the band between is interpolated smoothly.
    Only the inverse frequencies change (transformers' `ROPE_INIT_FUNCTIONS["llama3"]` computes them)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int

    def to_hf(self) -> dict[str, Any]:
        return {"rope_type": "llama3", "factor": self.factor, "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_positions}


@dataclass(frozen=True)
class ModelArch:
    """Shape and feature flags of one model (see the module docstring).

    Args:
        hidden: model width d.
        layers: number of decoder blocks.
        heads: query heads.
        kv_heads: key/value heads (GQA); must divide `heads`.
        intermediate: SwiGLU width.
        vocab: vocabulary size (151936 for every Qwen2.5 size: 151646 tokens padded).
        max_positions: longest sequence a row may have (rope is defined beyond it, but the
            checkpoint was trained up to it).
        rms_eps: RMSNorm epsilon (every norm of the model, q/k norms included).
        rope_theta: RoPE base.
        tie_embeddings: LM head shares the input embedding matrix (all Qwen2.5 <= 3B do).
        family: "qwen2", "qwen3" or "llama": which Hugging Face architecture this is. Default: "qwen2".
        head_dim: width of one head. Default (None): hidden // heads.
        qkv_bias: q/k/v projections have biases. Default (None): the family's (qwen2 only).
        qk_norm: per-head RMSNorm on q and k before RoPE. Default (None): the family's (qwen3 only).
        rope_scaling: Llama 3 rotary scaling, or None (plain RoPE).
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151936
    max_positions: int = 32768
    rms_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_embeddings: bool = True
    family: str = "qwen2"
    head_dim: int | None = None
    qkv_bias: bool | None = None
    qk_norm: bool | None = None
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        from toolchain.models.family import get_family

        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "max_positions"):
            if getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1, got {getattr(self, name)}")
        fam = get_family(self.family)
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise BadInput(f"`hidden` ({self.hidden}) must be divisible by `heads` ({self.heads}) "
                               f"when `head_dim` is not given")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        for flag in ("qkv_bias", "qk_norm"):
            if getattr(self, flag) is None:
                object.__setattr__(self, flag, getattr(fam, flag))
        fam.check(self)
        if self.heads % self.kv_heads:
            raise BadInput(f"`heads` ({self.heads}) must be divisible by `kv_heads` ({self.kv_heads})")
        if self.head_dim < 2 or self.head_dim % 2:
            raise BadInput(f"head_dim ({self.head_dim}) must be even for rotary embeddings")

    @property
    def q_dim(self) -> int:
        """Width of all query heads (heads * head_dim; hidden for Qwen2.5, not for every Qwen3)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shape(self, target: str) -> tuple[int, int]:
        """(out_features, in_features) of one of the seven projections."""
        d, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        shapes = {"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q),
                  "gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f)}
        return shapes[target]

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """The frozen tensors of one block this architecture has, in `LayerWeights` field order."""
        from toolchain.models.weights import LayerWeights

        d, q, kv = self.hidden, self.q_dim, self.kv_dim
        vectors = {"input_norm": (d,), "post_norm": (d,), "q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,),
                   "q_norm": (self.head_dim,), "k_norm": (self.head_dim,)}
        present = {"q_bias": self.qkv_bias, "k_bias": self.qkv_bias, "v_bias": self.qkv_bias,
                   "q_norm": self.qk_norm, "k_norm": self.qk_norm}
        return {name: vectors[name] if name in vectors else self.linear_shape(name)
                for name in LayerWeights._fields if present.get(name, True)}

    def rope_inv_freq(self) -> torch.Tensor | None:
        """The rotary inverse frequencies [head_dim / 2] float32 when they are not plain RoPE's (None: plain,
        `rope_tables` computes them from `rope_theta`). Llama 3 scaling: transformers' own function."""
        if self.rope_scaling is None:
            return None
        return torch.tensor(_scaled_inv_freq(self), dtype=torch.float32)   # a constant of any traced method

    def to_hf_config(self):
        """The equivalent transformers config (`Qwen2Config`, `Qwen3Config`, `LlamaConfig`; imported lazily)."""
        from toolchain.models.family import get_family

        return get_family(self.family).hf_config(self)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (the manifest's `model.arch`); `from_dict` gives back an equal arch."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelArch:
        """Inverse of `to_dict`. Also reads what older exports wrote: no `family` (qwen2), and the unused
        `attention_bias` of the Qwen2-only arch (Qwen2's q/k/v biases, implied by the family)."""
        d = dict(d)
        d.pop("attention_bias", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise BadInput(f"model.arch has unknown fields {unknown}; re-export with this toolchain")
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        return cls(**d)


@functools.lru_cache(maxsize=16)
def _scaled_inv_freq(arch: ModelArch) -> tuple[float, ...]:
    """transformers' own llama3 frequencies (ROPE_INIT_FUNCTIONS), once per architecture (it builds a config),
    as Python floats (the float32 values exactly). Computed on real tensors even when first asked for while
    a method is being traced (fake tensors have no values; a cached tensor would leak one into later traces),
    or inside `torch.device("meta")` and a counting dispatch mode (the memory estimator's meta trace)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    with unset_fake_temporarily(), _disable_current_modes(), torch.device("cpu"):
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](arch.to_hf_config(), "cpu")
        values = tuple(inv_freq.to(torch.float32).tolist())
    if attention_factor != 1.0:
        raise BadInput(f"llama3 rope scaling with attention factor {attention_factor} is not supported")
    return values
