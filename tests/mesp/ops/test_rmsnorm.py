"""RMSNorm primitive: backward vs autograd, forward vs Qwen2RMSNorm, saved bytes, export."""

from __future__ import annotations

import pytest
import torch
from helpers import saved_activation_nbytes

from toolchain.mesp.ops import rmsnorm_backward, rmsnorm_forward

SHAPES = [(1, 2), (1, 7), (5, 13), (17, 64), (3, 1)]
IDS = [f"T{t}-d{d}" for t, d in SHAPES]


def _inputs(t, d, gen, dtype=torch.float64):
    x = torch.randn(t, d, generator=gen, dtype=dtype) * 3
    w = 1 + 0.3 * torch.randn(d, generator=gen, dtype=dtype)
    return x, w


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize(("t", "d"), SHAPES, ids=IDS)
def test_backward_matches_autograd(t, d, eps, gen):
    x, w = _inputs(t, d, gen)
    x.requires_grad_()
    y, saved = rmsnorm_forward(x, w, eps)
    dy = torch.randn(t, d, generator=gen, dtype=torch.float64)
    (expected,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(rmsnorm_backward(dy, saved), expected)


@pytest.mark.parametrize(("t", "d"), SHAPES, ids=IDS)
def test_forward_matches_qwen2_rmsnorm(t, d, gen):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    x, w = _inputs(t, d, gen, torch.float32)
    module = Qwen2RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(w)
        expected = module(x[None])[0]
    torch.testing.assert_close(rmsnorm_forward(x, w, 1e-6)[0], expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("t", "d"), SHAPES, ids=IDS)
def test_saved_is_the_input_only(t, d, dtype, gen):
    """Docstring: saved x [T, d] and a reference to w; r is recomputed."""
    x, w = _inputs(t, d, gen, dtype)
    _, saved = rmsnorm_forward(x, w, 1e-6)
    assert saved.x is x and saved.w is w
    assert saved_activation_nbytes(saved, [w]) == t * d * x.element_size()


class _RmsNormStep(torch.nn.Module):
    def forward(self, x, w, dy):
        y, saved = rmsnorm_forward(x, w, 1e-6)
        return y, rmsnorm_backward(dy, saved)


def test_exports(gen):
    x, w = _inputs(6, 10, gen, torch.float32)
    dy = torch.randn(6, 10, generator=gen)
    ep = torch.export.export(_RmsNormStep(), (x, w, dy))
    torch.testing.assert_close(ep.module()(x, w, dy), _RmsNormStep()(x, w, dy))
