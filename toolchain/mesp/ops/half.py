"""Half-precision compute for the frozen-weight matmuls (`toolchain export --compute fp16`).

Inside `half_compute()`, every matmul by a frozen weight - the projections' x W^T and dy W (lora_linear.py,
quant.py), the MLP's chunked products (mesp/block.py) and the LM head's (ce_online.py) - multiplies in
float16: the weight chunk is dequantized straight to float16 (its group scales cast to float16, then
q * s), the activation is cast to float16 once per matmul, and the product is cast back to float32 before
anything else uses it (sums of chunk products, LoRA terms, norms, softmax, the loss). LoRA factors, their
products, the optimizer state and the loss stay float32. What the float16 matmul accumulates in is the
kernel's: XNNPACK's f16 GEMM accumulates in float16 on ARMv8.2 (NEON FP16 arithmetic, the phones' path)
and in float32 on x86 without AVX512-FP16 (F16C conversions around float32 FMAs, this host); torch's CPU
float16 matmul (the eager reference) accumulates in float32.

Outside the context (the default, `--compute fp32`) every function here is the identity: the float32 step
traces to the same graph as before the option existed.

Error bound: the inputs of each product are rounded to float16 (relative 2^-11 each) and so is its output;
tests/mesp/ops/test_half.py checks the resulting LoRA gradients against the float32 step (cosine, relative
error) on random Qwen2.5 configs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["COMPUTE_CHOICES", "half_compute", "half_enabled", "to_compute", "from_compute", "compute_weight"]

COMPUTE_CHOICES = ("fp32", "fp16")   # `--compute`, the manifest's `compute`

_HALF: torch.dtype | None = None


@contextlib.contextmanager
def half_compute(enabled: bool = True) -> Iterator[None]:
    """Within this context (if `enabled`) the frozen-weight matmuls compute in float16 (module docstring)."""
    global _HALF
    previous = _HALF
    if enabled:
        _HALF = torch.float16
    try:
        yield
    finally:
        _HALF = previous


def half_enabled() -> bool:
    return _HALF is not None


def to_compute(x: Tensor) -> Tensor:
    """An activation (or a LoRA-free operand) about to multiply a frozen weight: float16 inside the context."""
    return x if _HALF is None else x.to(_HALF)


def from_compute(y: Tensor) -> Tensor:
    """The product of a frozen-weight matmul, back to float32 for everything after it."""
    return y if _HALF is None else y.to(torch.float32)


def compute_weight(w):
    """A frozen weight (dense tensor or `QuantWeight`) in the compute dtype: a quantized one keeps its bytes
    and gets float16 group scales (so that dequantizing a chunk yields float16 directly); a dense one is
    converted (a whole copy: the export refuses `--compute fp16` for float32 bases)."""
    if _HALF is None:
        return w
    if isinstance(w, Tensor):
        return w.to(_HALF)
    return w._replace(scale=w.scale.to(_HALF))
