"""Qwen2 / Qwen2.5 (`model_type: qwen2`): q/k/v biases, head_dim = hidden / heads, plain RoPE, tied embeddings
up to 3B (7B has its own
lm_head). Presets: numbers from the model cards' config.json (docs/foundation.md), plus `tiny` for tests and
`demo` (bundled pretrained weights) for the quick start."""

from __future__ import annotations

from toolchain.models.arch import ModelArch
from toolchain.models.family import Family

__all__ = ["FAMILY", "PRESETS", "HF_REPO_IDS"]

FAMILY = Family("qwen2", "qwen2", qkv_bias=True, qk_norm=False, rope_scaling=False,
                hf_config_class="Qwen2Config", causal_lm_class="Qwen2ForCausalLM",
                hf_extra=lambda arch: {"use_sliding_window": False}, vocabulary="qwen2.5")

PRESETS: dict[str, ModelArch] = {
    "qwen2.5-0.5b": ModelArch(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864),
    "qwen2.5-1.5b": ModelArch(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960),
    "qwen2.5-3b": ModelArch(hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008),
    # Qwen/Qwen2.5-7B: the first untied Qwen2.5 (its own lm_head), vocabulary padded to 152064, 131072 positions.
    "qwen2.5-7b": ModelArch(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064,
                            max_positions=131072, tie_embeddings=False),
    # Demo/test size: byte-level vocab (256 bytes + BOS/EOS/PAD padded to 264), GQA 4:2,
    # 8 layers so LCSB has something to cycle over; trains in milliseconds per step.
    "tiny": ModelArch(hidden=64, layers=8, heads=4, kv_heads=2, intermediate=192, vocab=264, max_positions=512),
    # The quick-start demo's model: byte-level vocab as `tiny`, pretrained on the bundled public-domain
    # corpus by scripts/pretrain_demo_model.py; its weights ship in toolchain/assets/demo_model/ (12 MB).
    "demo": ModelArch(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=704, vocab=264, max_positions=512),
}

# Where real weights of each preset live on the Hugging Face Hub (resolved from the local cache only).
HF_REPO_IDS: dict[str, str] = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
}
