"""Causal GQA attention primitive: backward vs autograd, forward vs HF eager attention, saved bytes
(q, k, v; never the [H, T, T] probabilities), export."""

from __future__ import annotations

import types

import pytest
import torch
from helpers import saved_activation_nbytes

from toolchain.mesp.ops import attention_backward, attention_forward

# (H, Hk, T, D): GQA ratios 1, 2, 3, 4 and H (kv_heads = 1), T = 1, odd head counts.
SHAPES = [(1, 1, 1, 2), (3, 1, 5, 4), (4, 2, 7, 6), (6, 3, 1, 8), (5, 5, 9, 2), (8, 2, 33, 16), (7, 1, 12, 10)]
IDS = [f"H{h}-kv{hk}-T{t}-D{d}" for h, hk, t, d in SHAPES]


def _qkv(h, hk, t, d, gen, dtype=torch.float64):
    # Scale 2: attention rows range from nearly one-hot to nearly uniform.
    return tuple(2 * torch.randn(n, t, d, generator=gen, dtype=dtype) for n in (h, hk, hk))


@pytest.mark.parametrize(("h", "hk", "t", "d"), SHAPES, ids=IDS)
def test_backward_matches_autograd(h, hk, t, d, gen):
    q, k, v = (x.requires_grad_() for x in _qkv(h, hk, t, d, gen))
    o, saved = attention_forward(q, k, v)
    do = torch.randn(h, t, d, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad(o, (q, k, v), do)
    grads = attention_backward(do, saved)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("h", "hk", "t", "d"), SHAPES, ids=IDS)
def test_forward_matches_hf_eager_attention(h, hk, t, d, dtype, gen):
    """transformers' eager_attention_forward with Qwen2's causal additive mask; and torch's SDPA."""
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    q, k, v = _qkv(h, hk, t, d, gen, dtype)
    mask = torch.full((t, t), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]
    module = types.SimpleNamespace(num_key_value_groups=h // hk, training=False)
    expected, _ = eager_attention_forward(module, q[None], k[None], v[None], mask, scaling=d ** -0.5)
    out, _ = attention_forward(q, k, v)
    # HF's softmax runs in float32 whatever the dtype: compare at float32's default tolerances.
    torch.testing.assert_close(out.transpose(0, 1), expected[0].to(dtype), rtol=1.3e-6, atol=1e-5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                                            enable_gqa=True)[0]
    torch.testing.assert_close(out, sdpa)


@pytest.mark.parametrize(("h", "hk", "t", "d"), SHAPES, ids=IDS)
def test_saved_is_qkv_never_probabilities(h, hk, t, d, gen):
    """Docstring: saved q [H, T, D], k, v [Hk, T, D] and the output o [H, T, D]; P [H, T, T] is recomputed
    in backward."""
    q, k, v = _qkv(h, hk, t, d, gen, torch.float32)
    o, saved = attention_forward(q, k, v)
    assert saved.q is q and saved.k is k and saved.v is v and saved.o is o
    assert saved_activation_nbytes(saved, [o]) == (h + 2 * hk) * t * d * 4
    assert all(x.shape[-1] == d for x in saved)  # nothing [.., T, T]


class _AttentionStep(torch.nn.Module):
    def forward(self, q, k, v, do):
        o, saved = attention_forward(q, k, v)
        return o, attention_backward(do, saved)


def test_exports(gen):
    q, k, v = _qkv(6, 2, 9, 4, gen, torch.float32)
    args = (q, k, v, torch.randn(6, 9, 4, generator=gen))
    ep = torch.export.export(_AttentionStep(), args)
    torch.testing.assert_close(ep.module()(*args), _AttentionStep()(*args))
