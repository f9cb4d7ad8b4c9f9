"""Qwen2.5 architectures as frozen dataclasses, one preset per size (numbers from the model cards'
config.json; see docs/foundation.md), plus `tiny` for tests and `demo`
(bundled pretrained weights) for the quick start."""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import BadInput

__all__ = ["Qwen25Arch", "PRESETS", "HF_REPO_IDS", "get_preset"]


@dataclass(frozen=True)
class Qwen25Arch:
    """Shape of a Qwen2 decoder-only transformer.

    Args:
        hidden: model width d.
        layers: number of decoder blocks.
        heads: query heads; head_dim = hidden // heads.
        kv_heads: key/value heads (GQA); must divide `heads`.
        intermediate: SwiGLU width.
        vocab: vocabulary size (151936 for every Qwen2.5 size: 151646 tokens padded).
        max_positions: longest sequence a row may have (rope is defined beyond it, but the
            checkpoint was trained up to it).
        rms_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        tie_embeddings: LM head shares the input embedding matrix (all Qwen2.5 <= 3B do).
        attention_bias: q/k/v projections have biases (always true for Qwen2).
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
    attention_bias: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "max_positions"):
            if getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise BadInput(f"`hidden` ({self.hidden}) must be divisible by `heads` ({self.heads})")
        if self.heads % self.kv_heads:
            raise BadInput(f"`heads` ({self.heads}) must be divisible by `kv_heads` ({self.kv_heads})")
        if self.head_dim % 2:
            raise BadInput(f"head_dim ({self.head_dim}) must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shape(self, target: str) -> tuple[int, int]:
        """(out_features, in_features) of one of the seven projections."""
        d, kv, f = self.hidden, self.kv_dim, self.intermediate
        shapes = {"q_proj": (d, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, d),
                  "gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f)}
        return shapes[target]

    def to_hf_config(self):
        """The equivalent `transformers.Qwen2Config` (imported lazily: transformers is heavy)."""
        from transformers import Qwen2Config

        return Qwen2Config(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, max_position_embeddings=self.max_positions,
            rms_norm_eps=self.rms_eps, rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_embeddings, hidden_act="silu", attention_dropout=0.0,
            use_sliding_window=False,
        )


PRESETS: dict[str, Qwen25Arch] = {
    "qwen2.5-0.5b": Qwen25Arch(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864),
    "qwen2.5-1.5b": Qwen25Arch(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960),
    "qwen2.5-3b": Qwen25Arch(hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008),
    # Demo/test size: byte-level vocab (256 bytes + BOS/EOS/PAD padded to 264), GQA 4:2,
    # 8 layers so LCSB has something to cycle over; trains in milliseconds per step.
    "tiny": Qwen25Arch(hidden=64, layers=8, heads=4, kv_heads=2, intermediate=192, vocab=264,
                       max_positions=512),
    # The quick-start demo's model: byte-level vocab as `tiny`, pretrained on the bundled public-domain
    # corpus by scripts/pretrain_demo_model.py; its weights ship in toolchain/assets/demo_model/ (12 MB).
    "demo": Qwen25Arch(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=704, vocab=264,
                       max_positions=512),
}

# Where real weights of each preset live on the Hugging Face Hub (resolved from the local cache only).
HF_REPO_IDS: dict[str, str] = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
}


def get_preset(name: str) -> Qwen25Arch:
    """Look up a preset by name.

    Raises:
        BadInput: the name is not a preset.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInput(f"unknown preset {name!r}; choose {', '.join(PRESETS)} or pass a checkpoint directory") from None
