"""A frozen linear layer with an optional LoRA adapter (PEFT's `lora.Linear`, dropout 0).

Forward:  y = x W^T + bias + s * (x A^T) B^T            x [T, i], W [o, i], A [r, i], B [o, r]
Backward: h = x A^T (recomputed), dh = s * dy B
          dx = dy W + dh A,   dA = dh^T x,   dB = s * dy^T h
Saved: x [T, i] and references to W, A, B. NOT saved: h [T, r] (MeSP: recomputing it costs
2*T*i*r FLOPs, r << i). The bias is frozen: no gradient. A quantized W (`QuantWeight`) is dequantized
where it is used, in forward and again in backward: the dense matrix is a transient, never saved. `compute`
(ops/compute.py) is how x W^T and dy W are computed (fp16, or the fused int4 op in forward).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.lora.weights import LoraPair
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.quant import QuantWeight, int4_group, matmul_dyw, matmul_xwt

__all__ = ["LinearSaved", "LinearGrads", "linear_forward", "linear_backward", "lora_backward_reference",
           "lora_rows_backward_reference"]


class LinearSaved(NamedTuple):
    x: Tensor                 # [T, i] input; h = x A^T is NOT saved
    w: Tensor | QuantWeight   # [o, i] frozen base weight (a reference; quantized: dequantized on use)
    lora: LoraPair | None     # A [r, i], B [o, r] when this projection is adapted
    scale: float              # s = alpha / r


class LinearGrads(NamedTuple):
    dx: Tensor                # [T, i]
    lora: LoraPair | None     # (dA [r, i], dB [o, r]) exactly when the projection is adapted


def linear_forward(x: Tensor, w: Tensor | QuantWeight, bias: Tensor | None, lora: LoraPair | None,
                   scale: float, compute: Compute = FP32, residual: Tensor | None = None
                   ) -> tuple[Tensor, LinearSaved]:
    """y [T, o] (plus `residual` [T, o] when given: residual + y). With `compute.train_kernels` (--compute int8) and
    an int4 W, the whole projection is one `toolchain::lora_linear_a8` call (its W4A8 product, bias, LoRA and
    residual on the thread pool; the reference `decode_ops.lora_linear_a8_reference` adds in this order)."""
    if compute.train_kernels and isinstance(w, QuantWeight) and w.bits == 4 and x.dim() == 2:
        a, b = (None, None) if lora is None else lora
        y = torch.ops.toolchain.lora_linear_a8(x, w.q, w.scale, int4_group(w), bias, a, b, scale, residual)
        return y, LinearSaved(x, w, lora, scale)
    y = matmul_xwt(x, w, compute)                                    # [T, o]
    if bias is not None:
        y = y + bias
    if lora is not None:
        y = y + scale * F.linear(F.linear(x, lora.a), lora.b)        # h = x A^T is a transient
    return (y if residual is None else residual + y), LinearSaved(x, w, lora, scale)


def linear_backward(dy: Tensor, saved: LinearSaved, compute: Compute = FP32) -> LinearGrads:
    """Args: dy [T, o]. Returns dx [T, i] and, when adapted, (dA, dB)."""
    x, w, lora, s = saved
    dx = matmul_dyw(dy, w, compute)                                  # [T, i] (dequantized again)
    if lora is None:
        return LinearGrads(dx, None)
    a, b = lora
    if compute.train_kernels and x.dim() == 2:                       # one native op (toolchain::lora_backward)
        t, i, o, r = x.shape[0], x.shape[1], dy.shape[1], a.shape[0]
        f = torch.ops.toolchain.lora_backward(dy, x, a, b, s, dx)
        dx_a = f[:(t + r) * i].view(t + r, i)
        return LinearGrads(dx_a[:t], LoraPair(dx_a[t:], f[(t + r) * i:].view(o, r)))
    h = x @ a.T                                                      # [T, r] recomputed
    dh = s * (dy @ b)                                                # [T, r]
    return LinearGrads(dx + dh @ a, LoraPair(dh.T @ x, s * (dy.T @ h)))


def lora_backward_reference(dy: Tensor, x: Tensor, a: Tensor, b: Tensor, scale: float, dx: Tensor) -> Tensor:
    """The definition of `toolchain::lora_backward` (mesp/kernels.py; the native kernel in toolchain/native/
    kernels.cpp), what a `--compute int8` projection's backward calls (linear_backward's formulas): for dy [T, o],
    x [T, i], A [r, i], B [o, r] and the frozen product's dx [T, i], the flat [(T + r) i + o r] of
    dx + dh A, dA = dh^T x and dB = s dy^T h (h = x A^T, dh = s dy B)."""
    h = x @ a.T
    dh = scale * (dy @ b)
    return torch.cat([(dx + dh @ a).flatten(), (dh.T @ x).flatten(), (scale * (dy.T @ h)).flatten()])


def lora_rows_backward_reference(dy: Tensor, h: Tensor, b: Tensor, scale: float) -> Tensor:
    """The definition of `toolchain::lora_rows_backward`: an MLP chunk's LoRA rows (mesp/block.py) for dy [T, C],
    h [T, r], b [C, r]: [C + T, r] = (s dy^T h, s dy b)."""
    return torch.cat([scale * (dy.T @ h), scale * (dy @ b)])
