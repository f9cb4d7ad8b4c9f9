"""Chunked LM head + mean next-token cross-entropy that never materializes [T, V] logits.

For token chunk c with hidden states h_c [C, d], head E [V, d], targets y_c, N valid targets:
  z = h_c E^T,  loss = (1/N) sum_valid (logsumexp(z) - z[y]),
  dz = (softmax(z) - onehot(y)) * valid / N,   dh_c = dz E
dz depends on the loss only through N, which the labels give up front, so loss and dh are
computed in ONE pass over the chunks: each chunk's logits [C, V] exist once and are dropped before
the next chunk (peak C*V floats instead of T*V; no recompute pass is needed at all).
Within a chunk the [C, V] buffer of z is the only one: with m = max(z) (a constant: d lse / dz is
softmax(z) for any m), it is overwritten by e = exp(z - m), lse = m + log(sum e), then
dz = e / sum(e) - onehot(y), scaled by valid / N, all in place. z[y] is read as the dot product
h_c . E[y] (no gather from z, so autograd through the loss-only path stays valid).
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


def _chunk_terms(h: Tensor, head: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """e = exp(z - m) [C, V] (in z's buffer), its row sums s [C, 1], lse, valid, tgt, picked = z[y]."""
    valid = targets != IGNORE_INDEX                                  # [C]
    tgt = torch.where(valid, targets, torch.zeros_like(targets))    # [C] safe gather index
    picked = (h * head[tgt]).sum(-1)                                 # [C] z[y] = h . E[y]
    z = (head @ h.T).T                                               # [C, V]; (E h^T)^T: never transpose E

    m = z.detach().amax(dim=-1, keepdim=True)                        # [C, 1]
    # e = exp(z - m), in place: z is not needed afterwards
    e = z.sub_(m).exp_()                                             # [C, V]
    s = e.sum(dim=-1, keepdim=True)                                  # [C, 1]
    lse = (m + s.log()).squeeze(1)                                   # [C] logsumexp(z)
    return e, s, lse, valid, tgt, picked


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
        e, s, lse, valid, tgt, picked = _chunk_terms(h[start:start + chunk], head, targets[start:start + chunk])
        w = valid.to(h.dtype) / n                                    # [C]
        losses.append(((lse - picked) * w).sum())
        # dz = (softmax(z) - onehot(y)) * w[:, None], in e's buffer
        dz = e.div_(s)                                               # softmax, [C, V]
        dz.scatter_add_(1, tgt[:, None], -torch.ones_like(picked)[:, None])
        dz.mul_(w[:, None])
        dhs.append(dz @ head)                                        # [C, d]
        del e, dz
    return CeResult(torch.stack(losses).sum(), torch.cat(dhs))


def ce_chunked_loss(h: Tensor, head: Tensor, targets: Tensor, chunk: int) -> Tensor:
    """The loss alone (evaluation, MeZO), same chunking."""
    n = _n_valid(targets, h.dtype)
    total = h.new_zeros(())
    for start in range(0, h.shape[0], chunk):
        _, _, lse, valid, _, picked = _chunk_terms(h[start:start + chunk], head, targets[start:start + chunk])
        total = total + ((lse - picked) * valid.to(h.dtype)).sum()
    return total / n
