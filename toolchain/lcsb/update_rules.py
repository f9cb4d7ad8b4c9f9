"""Per-tensor optimizer update rules, pure functions of tensors (no in-place writes), shared by the
eager trainer and the exported programs so each formula lives once.

`lr` and `step` may be Python floats or 0-d/[1] tensors (programs take them as inputs/buffers).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sgd_tensor_update", "adamw_tensor_update"]


def sgd_tensor_update(p: Tensor, g: Tensor, lr, *, weight_decay: float = 0.0) -> Tensor:
    """torch.optim.SGD (no momentum): p - lr * (g + weight_decay * p)."""
    if weight_decay:
        g = g + weight_decay * p
    return p - lr * g


def adamw_tensor_update(p: Tensor, g: Tensor, m: Tensor, v: Tensor, step, lr, *, betas: tuple[float, float] = (0.9, 0.999),
                        eps: float = 1e-8, weight_decay: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """torch.optim.AdamW, one step (step = t >= 1 after incrementing):

    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    Returns (p, m, v). b^t is computed as exp(t log b) so a tensor `step` exports as plain ops.
    """
    b1, b2 = betas
    if isinstance(step, Tensor):
        bc1 = 1 - torch.exp(step * math.log(b1))
        bc2 = 1 - torch.exp(step * math.log(b2))
    else:
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
    p = p * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * (g * g)
    denom = torch.sqrt(v) / (bc2 ** 0.5 if not isinstance(bc2, Tensor) else torch.sqrt(bc2)) + eps
    return p - (lr / bc1) * m / denom, m, v
