"""Half-precision compute for the frozen-weight matmuls (`toolchain export --compute fp16`).

With a `Compute` of precision "fp16" (ops/compute.py, passed with the block's parameters), every matmul by
a frozen weight - the projections' x W^T and dy W (lora_linear.py, quant.py), the MLP's chunked products
(mesp/block.py) and the LM head's (ce_online.py) - multiplies in float16: the weight chunk is dequantized
straight to float16 (its group scales cast to float16, then q * s), the activation is cast to float16 once
per matmul, and the product is cast back to float32 before anything else uses it (sums of chunk products,
LoRA terms, norms, softmax, the loss). LoRA factors, their products, the optimizer state and the loss stay
float32. What the float16 matmul accumulates in is the kernel's: XNNPACK's f16 GEMM accumulates in float16
on ARMv8.2 (NEON FP16 arithmetic, the phones' path) and in float32 on x86 without AVX512-FP16 (F16C
conversions around float32 FMAs, this host); torch's CPU float16 matmul (the eager reference) accumulates in
float32.

With precision "fp32" (the default, `--compute fp32`) every function here is the identity: the float32 step
traces to the same graph as before the option existed.

Error bound: the inputs of each product are rounded to float16 (relative 2^-11 each) and so is its output;
tests/mesp/ops/test_half.py checks the resulting LoRA gradients against the float32 step (cosine, relative
error) on random Qwen2.5 configs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from toolchain.mesp.ops.compute import COMPUTE_CHOICES, Compute

__all__ = ["COMPUTE_CHOICES", "to_compute", "from_compute", "compute_weight"]


def to_compute(x: Tensor, compute: Compute) -> Tensor:
    """An activation (or a LoRA-free operand) about to multiply a frozen weight: float16 with fp16 compute."""
    return x.to(torch.float16) if compute.half else x


def from_compute(y: Tensor, compute: Compute) -> Tensor:
    """The product of a frozen-weight matmul, back to float32 for everything after it."""
    return y.to(torch.float32) if compute.half else y


def compute_weight(w, compute: Compute):
    """A frozen weight (dense tensor or `QuantWeight`) in the compute dtype: a quantized one keeps its bytes
    and gets float16 group scales (so that dequantizing a chunk yields float16 directly); a dense one is
    converted (a whole copy: the export refuses `--compute fp16` for float32 bases)."""
    if not compute.half:
        return w
    if isinstance(w, Tensor):
        return w.to(torch.float16)
    return w._replace(scale=w.scale.to(torch.float16))
