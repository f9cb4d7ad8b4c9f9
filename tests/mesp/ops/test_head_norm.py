"""Per-head q/k RMSNorm primitive: backward vs autograd, forward vs Qwen3RMSNorm on the heads, exact rows."""

from __future__ import annotations

import pytest
import torch

from toolchain.mesp.ops import head_norm_backward, head_norm_forward

SHAPES = [(1, 1, 2), (3, 5, 4), (7, 2, 6), (2, 17, 16)]
IDS = [f"H{h}-T{t}-D{d}" for h, t, d in SHAPES]


def _inputs(h, t, d, gen, dtype=torch.float64):
    x = torch.randn(h, t, d, generator=gen, dtype=dtype) * 3
    w = 1 + 0.3 * torch.randn(d, generator=gen, dtype=dtype)
    return x, w


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize(("h", "t", "d"), SHAPES, ids=IDS)
def test_backward_matches_autograd(h, t, d, eps, gen):
    x, w = _inputs(h, t, d, gen)
    x.requires_grad_()
    y, saved = head_norm_forward(x, w, eps)
    dy = torch.randn(h, t, d, generator=gen, dtype=torch.float64)
    (expected,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(head_norm_backward(dy, saved), expected)


@pytest.mark.parametrize(("h", "t", "d"), SHAPES, ids=IDS)
def test_forward_matches_qwen3_q_norm(h, t, d, gen):
    """Qwen3Attention: q_norm(q_proj(x).view(B, T, H, D)) then transpose to [B, H, T, D]."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x, w = _inputs(h, t, d, gen, torch.float32)
    module = Qwen3RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(w)
        expected = module(x.transpose(0, 1)[None])[0].transpose(0, 1)        # [T, H, D] -> [H, T, D]
    assert torch.equal(head_norm_forward(x, w, 1e-6)[0], expected)


def test_rows_are_independent(gen):
    """Changing one (head, token) row changes that output row only (the norm is per head, not over heads)."""
    x, w = _inputs(3, 4, 8, gen)
    y = head_norm_forward(x, w, 1e-6)[0]
    x2 = x.clone()
    x2[1, 2] *= 5.0
    y2 = head_norm_forward(x2, w, 1e-6)[0]
    changed = (y2 != y).any(-1)
    assert changed[1, 2] and int(changed.sum()) == 1


def test_wrong_weight_shape_is_refused(gen):
    x, w = _inputs(2, 3, 4, gen)
    with pytest.raises(ValueError, match=r"x \[H, T, D\] and w \[D\]"):
        head_norm_forward(x, torch.ones(8, dtype=x.dtype), 1e-6)
