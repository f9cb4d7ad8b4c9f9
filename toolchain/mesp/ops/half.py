"""Half-precision compute for the frozen-weight matmuls (`toolchain export --compute fp16`).

With a `Compute` of precision "fp16" (ops/compute.py, passed with the block's parameters), every matmul by
a frozen weight - the projections' x W^T and dy W (lora_linear.py, quant.py), the MLP's chunked products
(mesp/block.py) and the LM head's (ce_online.py) - multiplies in float16. What a float16 product is here:

  x W^T = s * sum_c float32( float16(x / s)[:, c] float16(W)[:, c]^T )        (`linear`; x W alike: `matmul`)

- the weight chunk is dequantized straight to float16 (its group scales cast to float16, then q * s);
- the activation x [T, K] is scaled per row by s = max_k |x[t, k]| (1 for an all-zero row) before its cast to
  float16 (`to_compute`), so every row's largest element is 1 whatever the row's magnitude, and the result is
  multiplied back by s in float32;
- the reduction over K runs in slices c of at most `REDUCTION_CHUNK` columns, each slice's product cast to
  float32 and the slices summed in float32.
LoRA factors, their products, the optimizer state, norms, softmax and the loss stay float32.

Why the scale and the slices (measured under qemu-aarch64, docs/kernels.md "fp16 on arm64"): XNNPACK's f16
GEMM, which runs these products, accumulates in float16 (NEON FP16 arithmetic on ARMv8.2 phones; on x86 its F16C
and AVX512-FP16 kernels round the accumulator to float16 after every multiply-add, the same arithmetic), and on
FEAT_FP16 CPUs it flushes float16 subnormals (below 2^-14 = 6.1e-5) to zero. The backward's gradients are small
(most elements far below their row's maximum, itself often < 1e-3): unscaled, their products with weights of a
few hundredths and the running sums fall below 2^-14 and vanish, and the fp16 step's LoRA gradient missed the bound
below by 6x-33x on `-cpu max` / `cortex-a76` (relative L2 6.1e-2 / 0.33).
Scaled, a row's accumulator holds values near the row's output magnitude; only elements below 2^-14 of their
row's maximum are lost, a relative 2^-14 per element at most. Float16 accumulation over K terms errs by up to
K 2^-11 (worst case; the typical error grows as sqrt(K): measured 1.2e-3, 4.5e-3, 1.1e-2 of the product's norm at
K = 64, 896, 4864): slices of 256 keep it at the K = 256 level for every width. torch's CPU float16 matmul (the
eager reference) accumulates in float32; both compute the same expression.

With precision "fp32" (the default, `--compute fp32`) every function here is the plain float32 operation: the
float32 step traces to the same graph as before the option existed.

Error bound: tests/mesp/ops/test_half.py checks the LoRA gradients against the float32 step (cosine >= 0.9999,
relative L2 <= 1e-2) on random Qwen2.5 configs; tests/export/test_compute_fp16.py on the ExecuTorch runtime;
scripts/check_arm64.sh under qemu-aarch64 (with and without FEAT_FP16).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.mesp.ops.compute import COMPUTE_CHOICES, Compute

__all__ = ["COMPUTE_CHOICES", "REDUCTION_CHUNK", "HalfOperand", "to_compute", "cols", "linear", "matmul",
           "compute_weight"]

REDUCTION_CHUNK = 256   # columns of K per float16 product (its float16 accumulation); the slices sum in float32


class HalfOperand(NamedTuple):
    """An activation ready for float16 products: `x` = float16(x / scale) [T, K], `scale` [T, 1] float32."""
    x: Tensor
    scale: Tensor


def to_compute(x: Tensor, compute: Compute) -> Tensor | HalfOperand:
    """An activation [T, K] about to multiply a frozen weight: with fp16 compute, scaled per row to max |x| = 1
    and cast to float16 (`HalfOperand`); else x itself."""
    if not compute.half:
        return x
    amax = x.abs().amax(dim=-1, keepdim=True)                           # [T, 1]
    scale = torch.where(amax > 0, amax, torch.ones_like(amax))          # all-zero rows: 1 (NaN rows stay NaN)
    return HalfOperand((x / scale).to(torch.float16), scale)


def cols(x: Tensor | HalfOperand, start: int, stop: int) -> Tensor | HalfOperand:
    """Columns [start, stop) of an operand `to_compute` returned (its rows keep their scale)."""
    if isinstance(x, HalfOperand):
        return HalfOperand(x.x[:, start:stop], x.scale)
    return x[:, start:stop]


def _sliced(x: HalfOperand, w: Tensor, k_axis: int) -> Tensor:
    """s * sum over slices c of K of float32(x[:, c] @ (w's slice c)); w's reduction axis is k_axis."""
    k = x.x.shape[-1]
    out = None
    for a in range(0, k, REDUCTION_CHUNK):
        b = min(k, a + REDUCTION_CHUNK)
        xa = x.x if (a, b) == (0, k) else x.x[:, a:b]
        if k_axis == 1:                                                 # x W^T, W [N, K]
            part = F.linear(xa, w if (a, b) == (0, k) else w[:, a:b])
        else:                                                           # x W, W [K, N]
            part = torch.mm(xa, w if (a, b) == (0, k) else w[a:b])
        part = part.to(torch.float32)                                   # [T, N]
        out = part if out is None else out + part
    return out * x.scale


def linear(x: Tensor | HalfOperand, w: Tensor, compute: Compute) -> Tensor:
    """x W^T (`F.linear`) for x from `to_compute` [T, K] and W [N, K] in the compute dtype; float32 [T, N]."""
    if not compute.half:
        return F.linear(x, w)
    return _sliced(x, w, 1)


def matmul(x: Tensor | HalfOperand, w: Tensor, compute: Compute) -> Tensor:
    """x W for x from `to_compute` [T, K] and W [K, N] in the compute dtype; float32 [T, N]."""
    if not compute.half:
        return x @ w
    return _sliced(x, w, 0)


def compute_weight(w, compute: Compute):
    """A frozen weight (dense tensor or `QuantWeight`) in the compute dtype: a quantized one keeps its bytes
    and gets float16 group scales (so that dequantizing a chunk yields float16 directly); a dense one is
    converted (a whole copy: the export refuses `--compute fp16` for float32 bases)."""
    if not compute.half:
        return w
    if isinstance(w, Tensor):
        return w.to(torch.float16)
    return w._replace(scale=w.scale.to(torch.float16))
