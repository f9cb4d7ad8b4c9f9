"""Rotary position embedding (Qwen2 / Llama "rotate_half" convention).

Forward:  y = x * cos + rot(x) * sin,   rot([x1, x2]) = [-x2, x1]   (halves of the head dim)
Backward: rot is linear with transpose rot^T([z1, z2]) = [z2, -z1], so
          dx = dy * cos + rot^T(dy * sin)
Saved: nothing per layer; the tables cos/sin [T, D] are built once per step from the positions.

Scaled RoPE (Llama 3's `rope_type: llama3`) changes only the inverse frequencies w_i of the tables
(cos(p w_i), sin(p w_i)); the tables are constants of the step, so forward and backward above are unchanged:
rope_tables takes the scaled frequencies as `inv_freq` (`ModelArch.rope_inv_freq`, computed by transformers).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["RopeTables", "rope_tables", "rope_forward", "rope_backward", "rope_train_reference",
           "rope_train_backward_reference"]


class RopeTables(NamedTuple):
    cos: Tensor  # [T, D]
    sin: Tensor  # [T, D]


def rope_tables(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                inv_freq: Tensor | None = None) -> RopeTables:
    """cos/sin tables for integer `positions` [T].

    Computed in float32 and then cast, exactly as transformers' rotary embeddings (Qwen2, Qwen3, Llama) do,
    so that float64 runs agree with Hugging Face to float64 precision rather than to float32 precision.
    `inv_freq` [head_dim / 2] float32: scaled frequencies (None: plain RoPE's, theta^(-2i / head_dim)).
    """
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]   # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)                             # [T, D]
    return RopeTables(emb.cos().to(dtype), emb.sin().to(dtype))


def _rot(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rot_t(z: Tensor) -> Tensor:
    half = z.shape[-1] // 2
    return torch.cat((z[..., half:], -z[..., :half]), dim=-1)


def rope_forward(x: Tensor, tables: RopeTables) -> Tensor:
    """Args: x [H, T, D]. Returns [H, T, D]."""
    return x * tables.cos + _rot(x) * tables.sin


def rope_backward(dy: Tensor, tables: RopeTables) -> Tensor:
    """dx [H, T, D] for dy [H, T, D]."""
    return dy * tables.cos + _rot_t(dy * tables.sin)


def rope_train_reference(x: Tensor, cos: Tensor, sin: Tensor, heads: int) -> Tensor:
    """The definition of `toolchain::rope_train` (mesp/kernels.py; the native kernel in toolchain/native/kernels.cpp),
    a `--compute int8` block's q or k projection [T, n D] split into `heads` heads [n, T, D] and rotated by the
    step's tables cos / sin [T, D] (rope_forward of the heads: the block's `_qk_heads` without q/k norms)."""
    t = x.shape[0]
    return rope_forward(x.reshape(t, heads, -1).transpose(0, 1), RopeTables(cos, sin))


def rope_train_backward_reference(dy: Tensor, cos: Tensor, sin: Tensor, start: int, heads: int) -> Tensor:
    """The definition of `toolchain::rope_train_backward`: for the gradients dy [N, T, D] of post-RoPE heads (the
    attention backward's stacked dq, dk, dv), heads start .. start + heads - 1 rotated back (rope_backward) and laid
    out token-major, [T, heads D]: the gradient of the projection output whose rope_train they were."""
    g = rope_backward(dy[start:start + heads], RopeTables(cos, sin))
    return g.transpose(0, 1).reshape(dy.shape[1], heads * dy.shape[2])
