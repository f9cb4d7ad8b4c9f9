"""Causal grouped-query attention (no dropout), the core of Qwen2's self-attention.

Forward, per kv head with its G = H / Hk query heads, c = 1/sqrt(D):
  S = c * Q K^T + M (M = -inf above the diagonal),  P = softmax(S),  O = P V
Backward:
  dV = sum_G P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dP * P)),
  dQ = c * dS K,       dK = c * sum_G dS^T Q
Saved: q [H, T, D], k, v [Hk, T, D] (post-rope). P [H, T, T] is NOT saved: backward recomputes it
(one [T, D] x [D, T] matmul and a softmax per head, 2*H*T^2*D FLOPs), saving H*T^2 floats.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["AttentionSaved", "AttentionGrads", "attention_forward", "attention_backward"]


class AttentionSaved(NamedTuple):
    q: Tensor  # [H, T, D]
    k: Tensor  # [Hk, T, D]
    v: Tensor  # [Hk, T, D]


class AttentionGrads(NamedTuple):
    dq: Tensor  # [H, T, D]
    dk: Tensor  # [Hk, T, D]
    dv: Tensor  # [Hk, T, D]


def _probs(q: Tensor, k: Tensor) -> Tensor:
    """Causal softmax probabilities [Hk, G, T, T] for q [Hk, G, T, D], k [Hk, T, D]."""
    t, d = q.shape[-2], q.shape[-1]
    s = (q @ k.unsqueeze(1).transpose(-1, -2)) * (d ** -0.5)        # [Hk, G, T, T]
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, dim=-1)


def attention_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, AttentionSaved]:
    """Args: q [H, T, D], k and v [Hk, T, D]. Returns o [H, T, D]."""
    h, t, d = q.shape
    hk = k.shape[0]
    qg = q.reshape(hk, h // hk, t, d)                                # [Hk, G, T, D]
    o = _probs(qg, k) @ v.unsqueeze(1)                               # [Hk, G, T, D]
    return o.reshape(h, t, d), AttentionSaved(q, k, v)


def attention_backward(do: Tensor, saved: AttentionSaved) -> AttentionGrads:
    """Gradients of q, k, v for do [H, T, D]."""
    q, k, v = saved
    h, t, d = q.shape
    hk = k.shape[0]
    qg = q.reshape(hk, h // hk, t, d)                                # [Hk, G, T, D]
    dog = do.reshape(hk, h // hk, t, d)                              # [Hk, G, T, D]
    p = _probs(qg, k)                                                # [Hk, G, T, T] recomputed
    # P^T dO written as (dO^T P)^T (and dS^T Q as (Q^T dS)^T below): only [D, T]-sized operands are
    # transposed; ExecuTorch materializes every transpose (`permute_copy`), a [T, T] one is T^2 floats.
    dv = (dog.transpose(-1, -2) @ p).transpose(-1, -2).sum(1)        # [Hk, T, D]
    dp = dog @ v.unsqueeze(1).transpose(-1, -2)                      # [Hk, G, T, T]
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))                   # [Hk, G, T, T]
    del p, dp
    c = d ** -0.5
    dq = (ds @ k.unsqueeze(1)) * c                                   # [Hk, G, T, D]
    dk = (qg.transpose(-1, -2) @ ds).transpose(-1, -2).sum(1) * c    # [Hk, T, D]
    return AttentionGrads(dq.reshape(h, t, d), dk, dv)
