"""The fused generation methods' small custom ops: one native call each where ExecuTorch's portable kernels
would run a graph of element-wise ops (decode runs ~80 of them per layer and token, each a few microseconds of
dispatch over a few thousand floats: ~6.5 ms of a token's ~29 ms, CHANGELOG.md 2026-12-02).

  toolchain::rms_norm(x, w, eps)                     RMSNorm (`rmsnorm_forward`)
  toolchain::lora_linear_a8(x, qweight, scales, group, bias?, lora_a?, lora_b?, lora_scale, residual?)
                                                     residual + (x W^T + bias + s (x A^T) B^T), W int4 with x
                                                     rounded to int8 per group (W4A8, `int4_linear_a8_reference`)
  toolchain::rope_heads(x, pos, heads, theta)        x [C, n D] split into heads [n, C, D] and rotated at
                                                     positions pos .. pos + C - 1 (`rope_forward` of `decode_rope`)
  toolchain::swiglu(g, u)                            silu(g) * u (`swiglu_forward`)

Each op's PyTorch implementation below is its definition: the stock graph it replaces, what eager generation
runs (a fused `Compute`), and the reference the native kernels (toolchain/native/kernels.cpp) are tested against;
the kernels agree with it to float32 rounding (their sums run in their own order). The ops' schemas, shapes and
registration with PyTorch are the native kernels' table, mesp/kernels.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.mesp.ops import rmsnorm_forward, rope_forward, rope_tables, swiglu_forward
from toolchain.mesp.ops.quant import int4_linear_a8_reference

__all__ = ["rms_norm_reference", "lora_linear_a8_reference", "rope_heads_reference", "swiglu_reference"]


def rms_norm_reference(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return rmsnorm_forward(x, w, eps)[0]


def lora_linear_a8_reference(x: Tensor, qweight: Tensor, scales: Tensor, group: int, bias: Tensor | None,
                             lora_a: Tensor | None, lora_b: Tensor | None, lora_scale: float,
                             residual: Tensor | None) -> Tensor:
    """x [T, i] -> [T, o]: residual + ((x W^T + bias) + lora_scale (x A^T) B^T), in that order (`linear_forward`
    with the W4A8 product, then the block's residual add); absent terms are skipped."""
    y = int4_linear_a8_reference(x, qweight, scales, group)
    if bias is not None:
        y = y + bias
    if lora_a is not None:
        y = y + lora_scale * F.linear(F.linear(x, lora_a), lora_b)
    return y if residual is None else residual + y


def lora_linear_a8_rows_reference(x: Tensor, qweight: Tensor, scales: Tensor, group: int, row0: int, rows: int,
                                  lora_a: Tensor | None, lora_b: Tensor | None, lora_scale: float) -> Tensor:
    """x [T, i] -> [T, rows]: `lora_linear_a8_reference` (no bias, no residual) on rows row0 .. row0 + rows - 1 of W
    (qweight, scales) and of B (`toolchain::lora_linear_a8_rows`: an MLP chunk's gate / up in the `--compute int8`
    training step, the rows read in place by the kernel)."""
    if row0 < 0 or rows < 0 or row0 + rows > qweight.shape[0]:
        raise ValueError(f"rows [{row0}, {row0 + rows}) outside W's {qweight.shape[0]}")
    sl = slice(row0, row0 + rows)
    return lora_linear_a8_reference(x, qweight[sl], scales[sl], group, None, lora_a,
                                    None if lora_b is None else lora_b[sl], lora_scale, None)


def rope_heads_reference(x: Tensor, pos: Tensor, heads: int, theta: float) -> Tensor:
    """x [C, n D] -> [n, C, D] after RoPE at positions pos .. pos + C - 1 (`pos` [1] int64)."""
    c = x.shape[0]
    xh = x.reshape(c, heads, -1).transpose(0, 1)
    return rope_forward(xh, rope_tables(pos.reshape(1) + torch.arange(c), xh.shape[-1], theta, x.dtype))


def swiglu_reference(g: Tensor, u: Tensor) -> Tensor:
    return swiglu_forward(g, u)[0]
