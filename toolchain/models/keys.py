"""Hugging Face state-dict keys <-> our weight names, one table for every family (Qwen2, Qwen3 and Llama name
their tensors alike; which of them a checkpoint has follows `ModelArch.layer_shapes`). `{}` is the layer index."""

from __future__ import annotations

__all__ = ["LAYER_KEYS", "GLOBAL_KEYS", "LINEAR_TARGETS"]

# The seven projections LoRA may target, in block order.
LINEAR_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Per-layer tensors: our name -> HF key (layer index in `{}`).
LAYER_KEYS: dict[str, str] = {
    "input_norm": "model.layers.{}.input_layernorm.weight",
    "post_norm": "model.layers.{}.post_attention_layernorm.weight",
    "q_proj": "model.layers.{}.self_attn.q_proj.weight",
    "q_bias": "model.layers.{}.self_attn.q_proj.bias",
    "k_proj": "model.layers.{}.self_attn.k_proj.weight",
    "k_bias": "model.layers.{}.self_attn.k_proj.bias",
    "v_proj": "model.layers.{}.self_attn.v_proj.weight",
    "v_bias": "model.layers.{}.self_attn.v_proj.bias",
    "o_proj": "model.layers.{}.self_attn.o_proj.weight",
    "q_norm": "model.layers.{}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{}.self_attn.k_norm.weight",
    "gate_proj": "model.layers.{}.mlp.gate_proj.weight",
    "up_proj": "model.layers.{}.mlp.up_proj.weight",
    "down_proj": "model.layers.{}.mlp.down_proj.weight",
}

# Whole-model tensors: our name -> HF key. `lm_head` is absent from tied checkpoints.
GLOBAL_KEYS: dict[str, str] = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}
