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
from toolchain.mesp.ops.quant import QuantWeight, matmul_dyw, matmul_xwt

__all__ = ["LinearSaved", "LinearGrads", "linear_forward", "linear_backward"]


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
        y = torch.ops.toolchain.lora_linear_a8(x, w.q, w.scale, 2 * w.q.shape[1] // w.scale.shape[1], bias, a, b,
                                               scale, residual)
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
    h = x @ a.T                                                      # [T, r] recomputed
    dh = s * (dy @ b)                                                # [T, r]
    return LinearGrads(dx + dh @ a, LoraPair(dh.T @ x, s * (dy.T @ h)))
