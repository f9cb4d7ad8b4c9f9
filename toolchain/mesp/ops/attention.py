"""Causal grouped-query attention (no dropout), the core of Qwen2's self-attention.

Forward, per kv head with its G = H / Hk query heads, c = 1/sqrt(D):
  S = c * Q K^T + M (M = -inf above the diagonal),  P = softmax(S),  O = P V
Backward:
  dV = sum_G P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O)),
  dQ = c * dS K,       dK = c * sum_G dS^T Q
Saved: q [H, T, D], k, v [Hk, T, D] (post-rope), o [H, T, D]. P [H, T, T] is NOT saved: backward recomputes it
(one [T, D] x [D, T] matmul and a softmax per head, 2*H*T^2*D FLOPs), saving H*T^2 floats.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["AttentionSaved", "AttentionGrads", "attention_forward", "attention_backward", "causal_mask"]


class AttentionSaved(NamedTuple):
    q: Tensor  # [H, T, D]
    k: Tensor  # [Hk, T, D]
    v: Tensor  # [Hk, T, D]
    o: Tensor  # [H, T, D] the output: rowsum(dP * P) = rowsum(dO * O) in backward


class AttentionGrads(NamedTuple):
    dq: Tensor  # [H, T, D]
    dk: Tensor  # [Hk, T, D]
    dv: Tensor  # [Hk, T, D]


def causal_mask(t: int, device=None) -> Tensor:
    """[T, T] bool, True above the diagonal (the future). Built once per block and shared by its heads."""
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


def _probs(qc: Tensor, k: Tensor, mask: Tensor) -> Tensor:
    """Causal softmax probabilities [Hk, G, T, T] for qc = c * q [Hk, G, T, D] (scaled first: [T, D] work
    instead of [T, T]), k [Hk, T, D]."""
    s = qc @ k.unsqueeze(1).transpose(-1, -2)                        # [Hk, G, T, T]
    s.masked_fill_(mask, float("-inf"))
    return torch.softmax(s, dim=-1)


def attention_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, AttentionSaved]:
    """Args: q [H, T, D], k and v [Hk, T, D]; mask: `causal_mask(T)` (built here if None). Returns o [H, T, D]."""
    h, t, d = q.shape
    hk = k.shape[0]
    mask = causal_mask(t, q.device) if mask is None else mask
    qc = (q * d ** -0.5).reshape(hk, h // hk, t, d)                 # [Hk, G, T, D]
    o = (_probs(qc, k, mask) @ v.unsqueeze(1)).reshape(h, t, d)      # [H, T, D]
    return o, AttentionSaved(q, k, v, o)


def attention_backward(do: Tensor, saved: AttentionSaved, mask: Tensor | None = None) -> AttentionGrads:
    """Gradients of q, k, v for do [H, T, D]. rowsum(dP * P) is taken as rowsum(dO * O) ([T, D] work, one
    [T, T] buffer fewer): sum_j (dO_i . V_j) P_ij = dO_i . sum_j P_ij V_j = dO_i . O_i."""
    q, k, v, o = saved
    h, t, d = q.shape
    hk = k.shape[0]
    mask = causal_mask(t, q.device) if mask is None else mask
    c = d ** -0.5
    qc = (q * c).reshape(hk, h // hk, t, d)                          # [Hk, G, T, D]
    dog = do.reshape(hk, h // hk, t, d)                              # [Hk, G, T, D]
    rows = (do * o).sum(-1, keepdim=True).reshape(hk, h // hk, t, 1)  # [Hk, G, T, 1]
    p = _probs(qc, k, mask)                                          # [Hk, G, T, T] recomputed
    # P^T dO written as (dO^T P)^T (and dS^T Q as (Q^T dS)^T below): only [D, T]-sized operands are
    # transposed; ExecuTorch materializes every transpose (`permute_copy`), a [T, T] one is T^2 floats.
    dv = (dog.transpose(-1, -2) @ p).transpose(-1, -2).sum(1)        # [Hk, T, D]
    ds = (dog @ v.unsqueeze(1).transpose(-1, -2)).sub_(rows).mul_(p)  # dS = P * (dP - rowsum) [Hk, G, T, T]
    del p
    dq = (ds @ k.unsqueeze(1)) * c                                   # [Hk, G, T, D]
    dk = (qc.transpose(-1, -2) @ ds).transpose(-1, -2).sum(1)        # [Hk, T, D]: c dS^T Q = dS^T (c Q)
    return AttentionGrads(dq.reshape(h, t, d), dk, dv)


def _unheads(x: Tensor) -> Tensor:
    n, t, dh = x.shape
    return x.transpose(0, 1).reshape(t, n * dh)                      # [n, T, D] -> [T, n*D]


def attention_train_reference(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """The definition of `toolchain::attention_train` (mesp/kernels.py; the native kernel in
    toolchain/native/kernels.cpp): causal attention of the whole sequence, q [H, T, D], k and v [Hk, T, D], scores
    scaled by `scale`; returns o [T, H*D] (the o projection's input). `attention_forward` with c = `scale`, one query
    head at a time as the block computes it (mesp/block.py)."""
    h, t, d = q.shape
    g = h // k.shape[0]
    mask = causal_mask(t, q.device)
    out = []
    for i in range(h):
        s = (q[i] * scale) @ k[i // g].T
        s = s.masked_fill(mask, float("-inf"))
        out.append(torch.softmax(s, dim=-1) @ v[i // g])
    return _unheads(torch.stack(out))


def attention_train_backward_reference(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor,
                                       scale: float) -> Tensor:
    """The definition of `toolchain::attention_train_backward`: the gradients of `attention_train_reference` for
    dout [T, H*D] (o [T, H*D]: its output), as `attention_backward` computes them with c = `scale`, one query head
    at a time (a shared kv head's dK, dV summed over its query heads in increasing order). Returns
    [H + 2 Hk, T, D]: dq, dk, dv stacked."""
    h, t, d = q.shape
    hk = k.shape[0]
    g = h // hk
    mask = causal_mask(t, q.device)
    do = dout.reshape(t, h, d).transpose(0, 1)                       # [H, T, D]
    oh = o.reshape(t, h, d).transpose(0, 1)
    dq, dk, dv = [], [None] * hk, [None] * hk
    for i in range(h):
        j = i // g
        s = ((q[i] * scale) @ k[j].T).masked_fill(mask, float("-inf"))
        p = torch.softmax(s, dim=-1)                                 # [T, T]
        rows = (do[i] * oh[i]).sum(-1, keepdim=True)                 # [T, 1]
        ds = (do[i] @ v[j].T - rows) * p
        dq.append((ds @ k[j]) * scale)
        dki, dvi = (ds.T @ q[i]) * scale, p.T @ do[i]
        dk[j] = dki if dk[j] is None else dk[j] + dki
        dv[j] = dvi if dv[j] is None else dv[j] + dvi
    return torch.cat([torch.stack(dq), torch.stack(dk), torch.stack(dv)])
