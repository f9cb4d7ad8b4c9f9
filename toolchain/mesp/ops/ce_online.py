"""LM head + mean next-token cross-entropy over vocabulary chunks, with an online softmax.

The token-chunked form (`ce_chunked`) keeps [C, V] logits and, to keep them small, multiplies few
rows at a time by the whole head, which makes the two head matmuls slow (the head is re-read for
every token chunk). Here the rows stay together and the vocabulary is cut instead: for token rows
h [C, d], head chunks E_j [Vc, d] (j over V / Vc chunks), targets y, weights w = valid / N:
  z_j = h E_j^T                                      [C, Vc]   (the only [C, Vc] buffer)
  m'  = max(m, rowmax z_j);  a = exp(m - m')         [C, 1]    (m starts at -inf)
  S  <- a S + rowsum exp(z_j - m')                   [C, 1]    running sum of exp(z - m)
  A  <- a A + exp(z_j - m') E_j                      [C, d]    running sum of exp(z - m) E
  lse = m + log S,   z[y] = h . E[y],   loss = sum_rows w (lse - z[y])
  dh  = w (A / S - E[y])      since  softmax(z) E = A / S  and  onehot(y) E = E[y]
One pass, two matmuls per chunk: the FLOPs of full-logits forward + backward, no [C, V] tensor.
Rescaling by `a` is flash-attention's online softmax; the result equals `ce_chunked`'s up to float
rounding. Targets follow Hugging Face (`shift_labels`); IGNORE_INDEX rows give 0 loss and 0 dh.
"""

from __future__ import annotations

import torch
from torch import Tensor

from toolchain.mesp.ops.ce_chunked import IGNORE_INDEX, CeResult
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.half import compute_weight, linear, matmul, to_compute
from toolchain.mesp.ops.quant import QuantWeight, dense, embedding_rows, matmul_dyw, matmul_xwt, quant_rows

__all__ = ["ce_online_forward_backward", "ce_online_loss", "head_chunks", "online_softmax_stats_reference",
           "exp_sub_rows_reference"]


def online_softmax_stats_reference(z: Tensor, m: Tensor, s: Tensor) -> Tensor:
    """The definition of `toolchain::online_softmax_stats` (mesp/kernels.py; the `--compute int8` head_loss): for
    logits z [C, V] and the running max m and sum s [C, 1], [C, 3] = (m' = max(m, rowmax z), s' = a s +
    rowsum exp(z - m'), a = exp(m - m')) (a = 0 where m is -inf)."""
    m_new = torch.maximum(m, z.amax(dim=-1, keepdim=True))
    a = torch.exp(m - m_new)
    return torch.cat([m_new, a * s + torch.exp(z - m_new).sum(dim=-1, keepdim=True), a], dim=1)


def exp_sub_rows_reference(z: Tensor, m: Tensor) -> Tensor:
    """The definition of `toolchain::exp_sub_rows`: exp(z - m) for z [C, V], m [C, 1]."""
    return torch.exp(z - m)


def head_chunks(head: Tensor | QuantWeight, vocab_chunk: int) -> list[Tensor | QuantWeight]:
    """The vocabulary chunks E_j [Vc, d] (views; the last may be shorter; quantized heads stay quantized).
    Exported programs take them as separate inputs, views of the memory-mapped head, because a slice inside
    an ExecuTorch program is a copy (`slice_copy`)."""
    rows = head.scale.shape[0] if isinstance(head, QuantWeight) else head.shape[0]
    return [quant_rows(head, start, min(rows, start + vocab_chunk)) for start in range(0, rows, vocab_chunk)]


def _rows(h: Tensor, head: Tensor | QuantWeight, targets: Tensor, chunks: list[Tensor | QuantWeight],
          with_grad: bool, compute: Compute) -> tuple[Tensor, Tensor, Tensor | None]:
    """For rows h [C, d]: (lse [C], z[y] [C], A / S - E[y] [C, d] or None). A quantized head is dequantized
    one vocabulary chunk at a time ([Vc, d], shared by the chunk's two matmuls) and at the target rows; the
    head's two matmuls compute as `compute` says (fp16: float16 operands and products, ops/half.py; int8: an int4
    chunk is multiplied in place by the W4A8 ops, ops/quant.py; z[y] stays the float32 dot with the looked-up row)."""
    valid = targets != IGNORE_INDEX                                  # [C]
    tgt = torch.where(valid, targets, torch.zeros_like(targets))    # [C] safe gather index
    e_y = embedding_rows(head, tgt)                                  # [C, d] E[y]
    picked = (h * e_y).sum(-1)                                       # [C] z[y]
    m = torch.full((h.shape[0], 1), float("-inf"), dtype=h.dtype, device=h.device)
    s = torch.zeros_like(m)                                          # [C, 1]
    acc = torch.zeros_like(h) if with_grad else None                 # [C, d]
    hc = to_compute(h, compute)                                      # --compute fp16: scaled float16 (ops/half.py)
    for chunk in chunks:
        int8 = compute.int8 and isinstance(chunk, QuantWeight) and chunk.bits == 4
        if int8:   # --compute int8 (ops/quant.py): both matmuls on the int4 chunk in place, int8 activations
            e_j = chunk
            z = matmul_xwt(h, chunk, compute)                        # [C, Vc] = h E_j^T (toolchain::int4_linear_a8)
        else:
            e_j = dense(compute_weight(chunk, compute))              # [Vc, d] (the stored rows, or dequantized)
            z = linear(hc, e_j, compute)                             # [C, Vc] = h E_j^T; E_j read in place
        if int8 and compute.train_kernels and acc is not None:     # --compute int8: the softmax's steps as 2 native ops
            st = torch.ops.toolchain.online_softmax_stats(z, m, s)   # [C, 3]: m', s', a
            m_new, s, a = st[:, 0:1], st[:, 1:2], st[:, 2:3]
            p = torch.ops.toolchain.exp_sub_rows(z, m_new)           # exp(z_j - m')
            acc = matmul_dyw(p, e_j, compute, acc=acc * a)           # a A + p E_j (toolchain::int4_dyw_a8_acc)
            m = m_new
            del z, p, e_j
            continue
        m_new = torch.maximum(m, z.detach().amax(dim=-1, keepdim=True))  # [C, 1] (a constant: lse does not depend on m)
        a = torch.exp(m - m_new)                                     # [C, 1] (0 on the first chunk)
        p = z.sub_(m_new).exp_()                                     # exp(z_j - m'), in z's buffer
        s = a * s + p.sum(dim=-1, keepdim=True)
        if acc is not None:
            # A <- a A + p E_j. Not `acc.mul_(a).addmm_(p, e_j)`: ExecuTorch runs addmm with its portable
            # naive loop (~1 GFLOP/s, 89% of a v2 step); mm has an optimized kernel (~25 GFLOP/s).
            # p E_j (toolchain::int4_dyw_a8 under int8), computed after acc * a: the graph's order (and so the
            # program's memory plan) of the fp32 and fp16 steps stays what it was before int8
            acc = acc * a + (matmul_dyw(p, e_j, compute) if int8 else matmul(to_compute(p, compute), e_j, compute))
        m = m_new
        del z, p, e_j
    lse = (m + s.log()).squeeze(1)                                   # [C]
    dh = None if acc is None else acc / s - e_y
    return lse, picked, dh


def _n_valid(targets: Tensor, dtype: torch.dtype) -> Tensor:
    # A row with no target gives loss 0 and zero gradients instead of HF's 0/0 = nan.
    return (targets != IGNORE_INDEX).sum().clamp(min=1).to(dtype)


def ce_online_forward_backward(h: Tensor, head: Tensor | QuantWeight, targets: Tensor, token_chunk: int,
                               vocab_chunk: int, *, chunks: list[Tensor] | None = None,
                               compute: Compute = FP32) -> CeResult:
    """Loss and dh in one pass over token chunks x vocabulary chunks.

    Args:
        h: [T, d] final-normed hidden states.
        head: [V, d] LM head (the embedding matrix when tied); frozen; float or quantized.
        targets: [T] already shifted (see `shift_labels`), IGNORE_INDEX where there is none.
        token_chunk: rows per chunk (static).
        vocab_chunk: vocabulary entries per chunk (static): peak transient [token_chunk, vocab_chunk].
        chunks: `head_chunks(head, vocab_chunk)` given by the caller (the same tensors, passed separately).
        compute: the head matmuls' precision (ops/compute.py). Default: float32.
    """
    chunks = head_chunks(head, vocab_chunk) if chunks is None else chunks
    n = _n_valid(targets, h.dtype)
    losses, dhs = [], []
    for start in range(0, h.shape[0], token_chunk):
        rows = slice(start, start + token_chunk)
        lse, picked, dh = _rows(h[rows], head, targets[rows], chunks, with_grad=True, compute=compute)
        w = (targets[rows] != IGNORE_INDEX).to(h.dtype) / n          # [C]
        losses.append(((lse - picked) * w).sum())
        dhs.append(dh * w[:, None])                                  # [C, d]
    return CeResult(torch.stack(losses).sum(), torch.cat(dhs))


def ce_online_loss(h: Tensor, head: Tensor | QuantWeight, targets: Tensor, token_chunk: int, vocab_chunk: int, *,
                   chunks: list[Tensor] | None = None, compute: Compute = FP32) -> Tensor:
    """The loss alone (evaluation, MeZO), same chunking; one matmul per chunk."""
    chunks = head_chunks(head, vocab_chunk) if chunks is None else chunks
    n = _n_valid(targets, h.dtype)
    total = h.new_zeros(())
    for start in range(0, h.shape[0], token_chunk):
        rows = slice(start, start + token_chunk)
        lse, picked, _ = _rows(h[rows], head, targets[rows], chunks, with_grad=False, compute=compute)
        total = total + ((lse - picked) * (targets[rows] != IGNORE_INDEX).to(h.dtype)).sum()
    return total / n
