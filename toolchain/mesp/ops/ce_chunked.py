"""Chunked LM head + mean next-token cross-entropy that never materializes [T, V] logits.

For token chunk c with hidden states h_c [C, d], head E [V, d], targets y_c, N valid targets:
  z = h_c E^T,  loss = (1/N) sum_valid (logsumexp(z) - z[y]),
  dz = (softmax(z) - onehot(y)) * valid / N,   dh_c = dz E
dz depends on the loss only through N, which the labels give up front, so loss and dh are
computed in ONE pass over the chunks: each chunk's logits [C, V] exist once and are dropped before
the next chunk (peak C*V floats instead of T*V; no recompute pass is needed at all).
Targets follow Hugging Face: position t predicts labels[t+1]; -100 is ignored.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["IGNORE_INDEX", "shift_labels", "CeResult", "ce_chunked_forward_backward", "ce_chunked_loss"]

IGNORE_INDEX = -100


class CeResult(NamedTuple):
    loss: Tensor  # [] mean over valid targets
    dh: Tensor    # [T, d] gradient of the loss with respect to the hidden states


def shift_labels(labels: Tensor) -> Tensor:
    """HF convention: targets[t] = labels[t+1], the last position has no target. [T] -> [T]."""
    pad = torch.full((1,), IGNORE_INDEX, dtype=labels.dtype, device=labels.device)
    return torch.cat((labels[1:], pad))


def _chunk_terms(h: Tensor, head: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    z = h @ head.T                                                   # [C, V] transient
    lse = torch.logsumexp(z, dim=-1)                                 # [C]
    valid = targets != IGNORE_INDEX                                  # [C]
    tgt = torch.where(valid, targets, torch.zeros_like(targets))    # [C] safe gather index
    picked = z.gather(1, tgt[:, None]).squeeze(1)                    # [C]
    return z, lse, valid, tgt, picked


def _n_valid(targets: Tensor, dtype: torch.dtype) -> Tensor:
    # A row with no target gives loss 0 and zero gradients instead of HF's 0/0 = nan.
    return (targets != IGNORE_INDEX).sum().clamp(min=1).to(dtype)


def ce_chunked_forward_backward(h: Tensor, head: Tensor, targets: Tensor, chunk: int) -> CeResult:
    """Loss and dh in one pass.

    Args:
        h: [T, d] final-normed hidden states.
        head: [V, d] LM head (the embedding matrix when tied); frozen.
        targets: [T] already shifted (see `shift_labels`), IGNORE_INDEX where there is none.
        chunk: tokens per chunk (static; the last chunk may be shorter).
    """
    n = _n_valid(targets, h.dtype)
    losses, dhs = [], []
    for start in range(0, h.shape[0], chunk):
        z, lse, valid, tgt, picked = _chunk_terms(h[start:start + chunk], head, targets[start:start + chunk])
        w = valid.to(h.dtype) / n                                    # [C]
        losses.append(((lse - picked) * w).sum())
        dz = torch.exp(z - lse[:, None])                             # softmax, [C, V]
        del z
        dz = dz.scatter_add(1, tgt[:, None], -torch.ones_like(picked)[:, None])  # - onehot(y)
        dhs.append((dz * w[:, None]) @ head)                         # [C, d]
        del dz
    return CeResult(torch.stack(losses).sum(), torch.cat(dhs))


def ce_chunked_loss(h: Tensor, head: Tensor, targets: Tensor, chunk: int) -> Tensor:
    """The loss alone (evaluation, MeZO), same chunking."""
    n = _n_valid(targets, h.dtype)
    total = h.new_zeros(())
    for start in range(0, h.shape[0], chunk):
        _, lse, valid, _, picked = _chunk_terms(h[start:start + chunk], head, targets[start:start + chunk])
        total = total + ((lse - picked) * valid.to(h.dtype)).sum()
    return total / n
