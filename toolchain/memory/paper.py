"""Published peak memory of MeSP and MeBP (MeSP paper, arXiv 2602.13069; compared in docs/benchmarks.md).

Setting: Qwen2.5, batch 1, LoRA on q,k,v,o,gate,up,down, 4-bit base (group 64), bf16 LoRA, SGD;
memory = iOS phys_footprint peak (memory-mapped weights not counted). The paper's MB unit is not
stated; the numbers are used as printed. These are the reference levels the telemetry report draws.
"""

from __future__ import annotations

__all__ = ["PAPER_PEAK_MB", "paper_reference"]

# (preset, seq_len, rank) -> {"mebp": MB, "mesp": MB}; MeBP was reported at rank 8 only.
PAPER_PEAK_MB: dict[tuple[str, int, int], dict[str, float]] = {
    ("qwen2.5-0.5b", 128, 8): {"mebp": 252.7, "mesp": 110.7},
    ("qwen2.5-0.5b", 256, 8): {"mebp": 360.8, "mesp": 136.2},
    ("qwen2.5-0.5b", 512, 8): {"mebp": 582.4, "mesp": 245.8},
    ("qwen2.5-0.5b", 1024, 8): {"mebp": 1050.3, "mesp": 513.6},
    ("qwen2.5-1.5b", 256, 8): {"mebp": 516.2, "mesp": 262.6},
    ("qwen2.5-3b", 256, 8): {"mebp": 637.6, "mesp": 368.4},
    ("qwen2.5-0.5b", 256, 4): {"mesp": 132.8},
    ("qwen2.5-0.5b", 256, 16): {"mesp": 143.5},
    ("qwen2.5-0.5b", 256, 32): {"mesp": 158.2},
}


def paper_reference(model: str | None, seq_len: int | None, rank: int | None = 8) -> dict[str, float]:
    """The published levels for this model, sequence length and rank, falling back to rank 8
    (the paper's default) when the exact rank was not reported; {} when unknown."""
    if model is None or seq_len is None:
        return {}
    exact = PAPER_PEAK_MB.get((model, seq_len, rank))
    return dict(exact if exact is not None else PAPER_PEAK_MB.get((model, seq_len, 8), {}))
