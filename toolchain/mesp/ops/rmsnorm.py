"""RMSNorm with a frozen weight (Qwen2RMSNorm).

Forward:  r = (mean_j x_j^2 + eps)^(-1/2),   y = w * (x * r)
Backward: with g = dy * w and xhat = x * r,
          dx = r * (g - xhat * mean_j(g_j * xhat_j))
Saved: x [T, d] and a reference to w. Recomputed: r [T, 1] (one reduction, d FLOPs per token).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["RmsNormSaved", "rmsnorm_forward", "rmsnorm_backward", "rms_norm_backward_reference"]


class RmsNormSaved(NamedTuple):
    x: Tensor     # [T, d] input
    w: Tensor     # [d] frozen weight (a reference)
    eps: float


def _rstd(x: Tensor, eps: float) -> Tensor:
    # x * x, not x.pow(2): the same bits (both are the correctly rounded square), and ExecuTorch's portable
    # pow.Tensor_Scalar calls std::pow per element (0.5 ms of a 32-token prefill chunk's 10.6 ms, ETDump)
    return torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)  # [T, 1]


def rmsnorm_forward(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, RmsNormSaved]:
    """y = w * x / rms(x). Args: x [T, d], w [d]. Returns y [T, d] and what backward needs."""
    return w * (x * _rstd(x, eps)), RmsNormSaved(x, w, eps)


def rmsnorm_backward(dy: Tensor, saved: RmsNormSaved) -> Tensor:
    """dx [T, d] for dy [T, d] (w is frozen: no weight gradient)."""
    x, w, eps = saved
    r = _rstd(x, eps)                                   # [T, 1] recomputed
    xhat = x * r                                        # [T, d]
    g = dy * w                                          # [T, d]
    return r * (g - xhat * (g * xhat).mean(-1, keepdim=True))


def rms_norm_backward_reference(x: Tensor, w: Tensor, eps: float, dy: Tensor, dy2: Tensor | None = None,
                                dy3: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    """The definition of `toolchain::rms_norm_backward` (mesp/kernels.py; the native kernel in
    toolchain/native/kernels.cpp), a `--compute int8` block's norm backward with the sums around it: for x [T, d],
    the gradient (dy + dy2) + dy3 of the norm's output (the absent ones skipped; the attention half's q, k, v
    projections' dx), residual + rmsnorm_backward(that) (the residual absent: the norm's dx alone)."""
    g = dy if dy2 is None else dy + dy2
    g = g if dy3 is None else g + dy3
    dx = rmsnorm_backward(g, RmsNormSaved(x, w, eps))
    return dx if residual is None else residual + dx
