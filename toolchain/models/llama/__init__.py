"""Llama 3.x (`model_type: llama`): Llama 3 rotary scaling (`rope_type: llama3`), an explicit head_dim, no
biases (attention_bias and mlp_bias false), vocabulary 128256. Presets: numbers from the HF config.json of
meta-llama/Llama-3.2-1B and -3B (both tie their embeddings) and meta-llama/Llama-3.1-8B (its own lm_head, rope
scaling factor 8 where 3.2's is 32; its config.json has no head_dim: hidden / heads = 128)."""

from __future__ import annotations

from toolchain.models.arch import ModelArch, RopeScaling
from toolchain.models.family import Family

__all__ = ["FAMILY", "PRESETS", "HF_REPO_IDS", "LLAMA3_1_ROPE", "LLAMA3_2_ROPE"]

FAMILY = Family("llama", "llama", qkv_bias=False, qk_norm=False, rope_scaling=True,
                hf_config_class="LlamaConfig", causal_lm_class="LlamaForCausalLM",
                hf_extra=lambda arch: {"attention_bias": False, "mlp_bias": False}, heads_divide_hidden=True)

# Llama 3.1's rope_scaling (8B config.json) and 3.2's (1B / 3B config.json).
LLAMA3_1_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)
LLAMA3_2_ROPE = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)

PRESETS: dict[str, ModelArch] = {
    "llama3.2-1b": ModelArch(family="llama", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                             intermediate=8192, vocab=128256, max_positions=131072, rms_eps=1e-5,
                             rope_theta=500_000.0, rope_scaling=LLAMA3_2_ROPE),
    "llama3.2-3b": ModelArch(family="llama", hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128,
                             intermediate=8192, vocab=128256, max_positions=131072, rms_eps=1e-5,
                             rope_theta=500_000.0, rope_scaling=LLAMA3_2_ROPE),
    "llama3.1-8b": ModelArch(family="llama", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                             intermediate=14336, vocab=128256, max_positions=131072, rms_eps=1e-5,
                             rope_theta=500_000.0, rope_scaling=LLAMA3_1_ROPE, tie_embeddings=False),
}

HF_REPO_IDS: dict[str, str] = {"llama3.2-1b": "meta-llama/Llama-3.2-1B", "llama3.2-3b": "meta-llama/Llama-3.2-3B",
                               "llama3.1-8b": "meta-llama/Llama-3.1-8B"}
