"""Vocabulary-chunked LM head + cross-entropy (online softmax): loss and dh vs F.cross_entropy on the
full logits (autograd, float64), vs the token-chunked op, peak transient = one [C, Vc] block, export."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import max_op_output_numel

from toolchain.mesp.ops import (IGNORE_INDEX, ce_chunked_forward_backward, ce_online_forward_backward, ce_online_loss,
                                shift_labels)

# (T, d, V, token chunk, vocab chunk): chunks of 1, dividing, not dividing, = and > the whole.
SHAPES = [(2, 3, 5, 1, 1), (9, 8, 31, 3, 7), (10, 6, 17, 4, 17), (7, 12, 50, 7, 64), (5, 4, 11, 64, 4),
          (1, 5, 7, 2, 3), (20, 4, 101, 6, 10)]
IDS = [f"T{t}-d{d}-V{v}-C{c}-Vc{vc}" for t, d, v, c, vc in SHAPES]


def _inputs(t, d, v, gen, dtype=torch.float64, ignore_frac=0.3):
    h = 2 * torch.randn(t, d, generator=gen, dtype=dtype)
    head = torch.randn(v, d, generator=gen, dtype=dtype)
    labels = torch.randint(0, v, (t,), generator=gen)
    labels[torch.rand(t, generator=gen) < ignore_frac] = IGNORE_INDEX
    labels[0] = 0
    if t > 1:
        labels[1] = 1
    return h, head, labels


@pytest.mark.parametrize(("t", "d", "v", "c", "vc"), SHAPES, ids=IDS)
def test_loss_and_dh_match_autograd_of_full_cross_entropy(t, d, v, c, vc, gen):
    h, head, labels = _inputs(t, d, v, gen)
    targets = shift_labels(labels)
    res = ce_online_forward_backward(h, head, targets, c, vc)
    if t == 1:  # nothing to predict: loss 0 and dh 0 (F.cross_entropy would give nan)
        assert float(res.loss) == 0.0 and not res.dh.any()
        return
    hr = h.clone().requires_grad_()
    expected = F.cross_entropy((hr @ head.T)[:-1], labels[1:], ignore_index=IGNORE_INDEX)
    (dh,) = torch.autograd.grad(expected, hr)
    torch.testing.assert_close(res.loss, expected.detach())
    torch.testing.assert_close(res.dh, dh)
    torch.testing.assert_close(ce_online_loss(h, head, targets, c, vc), expected.detach())


@pytest.mark.parametrize(("t", "d", "v", "c", "vc"), SHAPES, ids=IDS)
def test_dh_matches_autograd_through_the_loss_only_path(t, d, v, c, vc, gen):
    h, head, labels = _inputs(t, d, v, gen)
    targets = shift_labels(labels)
    hr = h.clone().requires_grad_()
    (expected,) = torch.autograd.grad(ce_online_loss(hr, head, targets, c, vc), hr, allow_unused=True)
    if expected is None:  # T = 1: the loss is a constant 0
        expected = torch.zeros_like(h)
    torch.testing.assert_close(ce_online_forward_backward(h, head, targets, c, vc).dh, expected)


def test_equals_the_token_chunked_op_in_float32(gen):
    h, head, labels = _inputs(33, 16, 300, gen, torch.float32)
    targets = shift_labels(labels)
    a = ce_chunked_forward_backward(h, head, targets, 8)
    b = ce_online_forward_backward(h, head, targets, 16, 64)
    torch.testing.assert_close(b.loss, a.loss)
    torch.testing.assert_close(b.dh, a.dh)


def test_large_logits_do_not_overflow(gen):
    """The running max keeps exp() in range: logits ~ 1e3 would overflow a plain exp in float32."""
    h, head, labels = _inputs(6, 4, 40, gen, torch.float32)
    h = h * 300
    targets = shift_labels(labels)
    res = ce_online_forward_backward(h, head, targets, 4, 9)
    expected = F.cross_entropy((h @ head.T)[:-1], labels[1:], ignore_index=IGNORE_INDEX)
    assert torch.isfinite(res.loss) and torch.isfinite(res.dh).all()
    torch.testing.assert_close(res.loss, expected)


@pytest.mark.parametrize(("t", "c", "vc"), [(40, 8, 16), (37, 40, 50), (16, 1, 211)])
def test_peak_transient_is_one_block_of_logits(t, c, vc, gen):
    """Docstring: the only vocabulary-sized tensors are [C, Vc] blocks; nothing else is as large."""
    d, v = 6, 211
    h, head, labels = _inputs(t, d, v, gen, torch.float32)
    largest, shapes, res = max_op_output_numel(ce_online_forward_backward, h, head, shift_labels(labels), c, vc)
    block = min(c, t) * min(vc, v)
    assert largest == max(block, t * d)  # a logits block, or the returned dh [T, d]
    assert {(min(c, t), min(vc, v)), (min(vc, v), min(c, t))} & {s for _, s in shapes}
    assert set(res._fields) == {"loss", "dh"} and res.dh.shape == (t, d)


class _CeStep(torch.nn.Module):
    def forward(self, h, head, labels):
        return ce_online_forward_backward(h, head, shift_labels(labels), 4, 5)


def test_exports(gen):
    args = _inputs(10, 6, 17, gen, torch.float32)
    ep = torch.export.export(_CeStep(), args)
    torch.testing.assert_close(ep.module()(*args), _CeStep()(*args))
