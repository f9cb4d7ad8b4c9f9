"""Chunked LM head + cross-entropy: loss and dh vs F.cross_entropy on the full logits (autograd),
peak transient = one chunk's logits, export."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import max_op_output_numel

from toolchain.mesp.ops import IGNORE_INDEX, ce_chunked_forward_backward, ce_chunked_loss, shift_labels

# (T, d, V, chunk): chunk 1, dividing T, not dividing T, = T, > T.
SHAPES = [(2, 3, 5, 1), (9, 8, 31, 3), (10, 6, 17, 4), (7, 12, 50, 7), (5, 4, 11, 64), (1, 5, 7, 2)]
IDS = [f"T{t}-d{d}-V{v}-C{c}" for t, d, v, c in SHAPES]


def _inputs(t, d, v, gen, dtype=torch.float64, ignore_frac=0.3):
    h = 2 * torch.randn(t, d, generator=gen, dtype=dtype)
    head = torch.randn(v, d, generator=gen, dtype=dtype)
    labels = torch.randint(0, v, (t,), generator=gen)
    labels[torch.rand(t, generator=gen) < ignore_frac] = IGNORE_INDEX
    labels[0] = 0  # keep >= 1 target once shifted (unless T = 1)
    if t > 1:
        labels[1] = 1
    return h, head, labels


def test_shift_labels_follows_hf():
    assert shift_labels(torch.tensor([5, 6, -100, 8])).tolist() == [6, -100, 8, -100]
    assert shift_labels(torch.tensor([5])).tolist() == [-100]


@pytest.mark.parametrize(("t", "d", "v", "c"), SHAPES, ids=IDS)
def test_loss_and_dh_match_autograd_of_full_cross_entropy(t, d, v, c, gen):
    h, head, labels = _inputs(t, d, v, gen)
    targets = shift_labels(labels)
    hr = h.clone().requires_grad_()
    res = ce_chunked_forward_backward(h, head, targets, c)
    if t == 1:  # nothing to predict: loss 0 and dh 0 (F.cross_entropy would give nan)
        assert float(res.loss) == 0.0 and not res.dh.any()
        return
    # The op F.cross_entropy replaces: HF's loss is this on [T-1, V] logits (computed here in float64).
    expected = F.cross_entropy((hr @ head.T)[:-1], labels[1:], ignore_index=IGNORE_INDEX)
    (dh,) = torch.autograd.grad(expected, hr)
    torch.testing.assert_close(res.loss, expected.detach())
    torch.testing.assert_close(res.dh, dh)
    torch.testing.assert_close(ce_chunked_loss(h, head, targets, c), expected.detach())


@pytest.mark.parametrize(("t", "d", "v", "c"), SHAPES, ids=IDS)
def test_dh_matches_autograd_through_chunked_loss(t, d, v, c, gen):
    h, head, labels = _inputs(t, d, v, gen)
    targets = shift_labels(labels)
    hr = h.clone().requires_grad_()
    loss = ce_chunked_loss(hr, head, targets, c)
    (expected,) = torch.autograd.grad(loss, hr)
    torch.testing.assert_close(ce_chunked_forward_backward(h, head, targets, c).dh, expected)


@pytest.mark.parametrize(("t", "c"), [(40, 8), (37, 5), (16, 1)])
def test_peak_transient_is_one_chunk_of_logits(t, c, gen):
    """Docstring: each chunk's [C, V] logits exist once; [T, V] is never formed. Nothing is saved
    across the pass: the op returns only the loss and dh [T, d]."""
    d, v = 6, 211
    h, head, labels = _inputs(t, d, v, gen, torch.float32)
    largest, shapes, res = max_op_output_numel(ce_chunked_forward_backward, h, head, shift_labels(labels), c)
    assert largest == c * v < t * v
    assert {(c, v), (v, c)} & {s for _, s in shapes}  # the chunk's logits (either layout)
    assert set(res._fields) == {"loss", "dh"} and res.dh.shape == (t, d)


class _CeStep(torch.nn.Module):
    def forward(self, h, head, labels):
        return ce_chunked_forward_backward(h, head, shift_labels(labels), 4)


def test_exports(gen):
    args = _inputs(10, 6, 17, gen, torch.float32)
    ep = torch.export.export(_CeStep(), args)
    torch.testing.assert_close(ep.module()(*args), _CeStep()(*args))
