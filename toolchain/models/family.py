"""What a model family is: its Hugging Face `model_type`, the feature flags it fixes, and the mapping between
its `config.json` and `ModelArch`. Each family lives in toolchain/models/<family>/ (its `FAMILY`, presets and
Hub ids); this module is the registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolchain.errors import BadInput

if TYPE_CHECKING:
    from toolchain.models.arch import ModelArch

__all__ = ["Family", "get_family", "family_for_model_type", "SUPPORTED_MODEL_TYPES"]


@dataclass(frozen=True)
class Family:
    """One model family.

    Args:
        name: the family's name (`ModelArch.family`, the folder toolchain/models/<name>/).
        model_type: `model_type` of its config.json.
        qkv_bias: its q/k/v projections have biases.
        qk_norm: it has per-head q/k RMSNorms.
        rope_scaling: it may scale its rotary frequencies (Llama 3).
        hf_config_class: the transformers config class name (`Qwen2Config`, ...).
        causal_lm_class: the transformers model class name (`Qwen2ForCausalLM`, ...).
        hf_extra: extra keyword arguments of the transformers config (`ModelArch` -> kwargs).
        vocabulary: the tokenizer a registry package ships for it ("qwen2.5", "qwen3"; None: none, e.g. Llama's).
        heads_divide_hidden: its config requires hidden % heads == 0 even with an explicit head_dim (Llama).
    """

    name: str
    model_type: str
    qkv_bias: bool
    qk_norm: bool
    rope_scaling: bool
    hf_config_class: str
    causal_lm_class: str
    hf_extra: Callable[[ModelArch], dict[str, Any]] = lambda arch: {}
    vocabulary: str | None = None
    heads_divide_hidden: bool = False

    def check(self, arch: ModelArch) -> None:
        """Raises BadInput when `arch`'s flags are not this family's (the HF model would compute otherwise)."""
        for flag in ("qkv_bias", "qk_norm"):
            if getattr(arch, flag) != getattr(self, flag):
                raise BadInput(f"{self.name} models have {flag} = {getattr(self, flag)}; got {getattr(arch, flag)}")
        if self.heads_divide_hidden and arch.hidden % arch.heads:
            raise BadInput(f"{self.name} models need `hidden` ({arch.hidden}) divisible by `heads` ({arch.heads})")
        if arch.rope_scaling is not None and not self.rope_scaling:
            raise BadInput(f"{self.name} models have no rope scaling here (only llama's llama3 scaling)")

    def hf_config(self, arch: ModelArch):
        import transformers

        rope = {"rope_type": "default", "rope_theta": arch.rope_theta}
        if arch.rope_scaling is not None:
            rope.update(arch.rope_scaling.to_hf())
        cls = getattr(transformers, self.hf_config_class)
        return cls(
            vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
            num_hidden_layers=arch.layers, num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
            head_dim=arch.head_dim, max_position_embeddings=arch.max_positions, rms_norm_eps=arch.rms_eps,
            rope_parameters=rope, tie_word_embeddings=arch.tie_embeddings, hidden_act="silu",
            attention_dropout=0.0, **self.hf_extra(arch))

    def causal_lm(self):
        """The transformers model class (`Qwen3ForCausalLM`, ...)."""
        import transformers

        return getattr(transformers, self.causal_lm_class)


_FAMILY_MODULES = {"qwen2": "toolchain.models.qwen2", "qwen3": "toolchain.models.qwen3",
                   "llama": "toolchain.models.llama"}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("qwen2", "qwen3", "llama")


def get_family(name: str) -> Family:
    """The family named `name`.

    Raises:
        BadInput: no such family.
    """
    if name not in _FAMILY_MODULES:
        raise BadInput(f"unknown model family {name!r}; supported: {', '.join(_FAMILY_MODULES)}")
    return importlib.import_module(_FAMILY_MODULES[name]).FAMILY


def family_for_model_type(model_type: Any) -> Family:
    """The family of a config.json `model_type`.

    Raises:
        BadInput: not one of `SUPPORTED_MODEL_TYPES` (the message names them).
    """
    for name in _FAMILY_MODULES:
        fam = get_family(name)
        if fam.model_type == model_type:
            return fam
    raise BadInput(f"config.json has model_type {model_type!r}; supported model types: "
                   f"{', '.join(SUPPORTED_MODEL_TYPES)}")
