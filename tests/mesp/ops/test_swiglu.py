"""SwiGLU primitive: backward vs autograd, forward vs Qwen2MLP, saved bytes, export."""

from __future__ import annotations

import pytest
import torch
from helpers import saved_activation_nbytes

from toolchain.mesp.ops import linear_forward, swiglu_backward, swiglu_forward
from toolchain.models import ModelArch

SHAPES = [(1, 1), (1, 9), (4, 37), (19, 64)]
IDS = [f"T{t}-f{f}" for t, f in SHAPES]


def _gu(t, f, gen, dtype=torch.float64):
    # Spread of 4: the sigmoid's saturated tails and its middle are both exercised.
    return (4 * torch.randn(t, f, generator=gen, dtype=dtype), torch.randn(t, f, generator=gen, dtype=dtype))


@pytest.mark.parametrize(("t", "f"), SHAPES, ids=IDS)
def test_backward_matches_autograd(t, f, gen):
    g, u = (x.requires_grad_() for x in _gu(t, f, gen))
    a, saved = swiglu_forward(g, u)
    da = torch.randn(t, f, generator=gen, dtype=torch.float64)
    dg, du = torch.autograd.grad(a, (g, u), da)
    grads = swiglu_backward(da, saved)
    torch.testing.assert_close(grads.dg, dg)
    torch.testing.assert_close(grads.du, du)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_matches_qwen2_mlp(dtype, gen):
    """act_fn(gate) * up, and the whole Qwen2MLP built from linear_forward + swiglu_forward."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    arch = ModelArch(hidden=10, layers=1, heads=1, kv_heads=1, intermediate=23, vocab=5)
    mlp = Qwen2MLP(arch.to_hf_config()).to(dtype)
    x = torch.randn(7, 10, generator=gen, dtype=dtype)
    g, u = _gu(7, 23, gen, dtype)
    with torch.no_grad():
        torch.testing.assert_close(swiglu_forward(g, u)[0], mlp.act_fn(g) * u)
        expected = mlp(x[None])[0]
    gate = linear_forward(x, mlp.gate_proj.weight.detach(), None, None, 1.0)[0]
    up = linear_forward(x, mlp.up_proj.weight.detach(), None, None, 1.0)[0]
    out = linear_forward(swiglu_forward(gate, up)[0], mlp.down_proj.weight.detach(), None, None, 1.0)[0]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(("t", "f"), SHAPES, ids=IDS)
def test_saved_is_g_and_u_only(t, f, gen):
    """Docstring: saved g, u [T, f]; sigma(g) and silu(g) are recomputed."""
    g, u = _gu(t, f, gen, torch.float32)
    _, saved = swiglu_forward(g, u)
    assert saved.g is g and saved.u is u
    assert saved_activation_nbytes(saved, []) == 2 * t * f * 4


class _SwigluStep(torch.nn.Module):
    def forward(self, g, u, da):
        a, saved = swiglu_forward(g, u)
        return a, swiglu_backward(da, saved)


def test_exports(gen):
    args = (*_gu(5, 11, gen, torch.float32), torch.randn(5, 11, generator=gen))
    ep = torch.export.export(_SwigluStep(), args)
    torch.testing.assert_close(ep.module()(*args), _SwigluStep()(*args))
