"""Per-head RMSNorm on queries and keys (Qwen3's q_norm / k_norm): a frozen weight w [D] shared by the heads,
applied to every (head, token) row of the projection's output split into heads, after the projection and before
RoPE.

Forward, x [H, T, D] (row x_ht in R^D):
          r_ht = (mean_j x_htj^2 + eps)^(-1/2),   y_ht = w * (x_ht * r_ht)
Backward: rows do not interact (each row's r depends on that row alone), so the gradient is RMSNorm's, row by
          row: with g = dy * w and xhat = x * r,
          dx_ht = r_ht * (g_ht - xhat_ht * mean_j(g_htj * xhat_htj))
          (d r_ht / d x_htj = -r_ht^3 x_htj / D, so d/dx of sum_j g_j x_j r = r g - (r^3 / D) x sum_j g_j x_j,
          which is the line above). w is frozen (not adapted): no weight gradient.
Saved: x [H, T, D] (the pre-norm heads) and a reference to w. Recomputed: r [H, T, 1].
"""

from __future__ import annotations

from torch import Tensor

from toolchain.mesp.ops.rmsnorm import RmsNormSaved, rmsnorm_backward, rmsnorm_forward

__all__ = ["head_norm_forward", "head_norm_backward"]


def head_norm_forward(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, RmsNormSaved]:
    """y = w * x / rms(x) over each head's row. Args: x [H, T, D], w [D]. Returns y [H, T, D] and what backward
    needs."""
    if x.dim() != 3 or w.shape != (x.shape[-1],):
        raise ValueError(f"head_norm_forward wants x [H, T, D] and w [D], got {list(x.shape)} and {list(w.shape)}")
    return rmsnorm_forward(x, w, eps)       # rmsnorm_forward reduces over the last dim: one row per (head, token)


def head_norm_backward(dy: Tensor, saved: RmsNormSaved) -> Tensor:
    """dx [H, T, D] for dy [H, T, D]."""
    return rmsnorm_backward(dy, saved)
