"""Qwen3 dense (`model_type: qwen3`): per-head RMSNorm on q and k (weights [head_dim], after the projection and
before RoPE), an explicit head_dim (128 for every size, not hidden / heads), no q/k/v biases, plain RoPE,
Qwen2.5's vocabulary. Presets: numbers from the HF config.json of Qwen/Qwen3-0.6B, -1.7B, -4B (tied embeddings up to 4B) and -8B
(its own lm_head)."""

from __future__ import annotations

from toolchain.models.arch import ModelArch
from toolchain.models.family import Family

__all__ = ["FAMILY", "PRESETS", "HF_REPO_IDS"]

FAMILY = Family("qwen3", "qwen3", qkv_bias=False, qk_norm=True, rope_scaling=False,
                hf_config_class="Qwen3Config", causal_lm_class="Qwen3ForCausalLM",
                hf_extra=lambda arch: {"attention_bias": False, "use_sliding_window": False}, vocabulary="qwen3")

PRESETS: dict[str, ModelArch] = {
    "qwen3-0.6b": ModelArch(family="qwen3", hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                            intermediate=3072, max_positions=40960),
    "qwen3-1.7b": ModelArch(family="qwen3", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                            intermediate=6144, max_positions=40960),
    "qwen3-4b": ModelArch(family="qwen3", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                          intermediate=9728, max_positions=40960),
    "qwen3-8b": ModelArch(family="qwen3", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                          intermediate=12288, max_positions=40960, tie_embeddings=False),
}

HF_REPO_IDS: dict[str, str] = {"qwen3-0.6b": "Qwen/Qwen3-0.6B", "qwen3-1.7b": "Qwen/Qwen3-1.7B",
                               "qwen3-4b": "Qwen/Qwen3-4B", "qwen3-8b": "Qwen/Qwen3-8B"}
