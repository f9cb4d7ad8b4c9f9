"""RoPE primitive: backward vs autograd, forward vs HF apply_rotary_pos_emb, saved bytes, export."""

from __future__ import annotations

import pytest
import torch
from helpers import saved_activation_nbytes

from toolchain.mesp.ops import rope_backward, rope_forward, rope_tables
from toolchain.models import ModelArch

SHAPES = [(1, 1, 2), (3, 1, 4), (2, 5, 6), (5, 17, 8), (1, 33, 64)]  # (heads, T, head_dim)
IDS = [f"H{h}-T{t}-D{d}" for h, t, d in SHAPES]


@pytest.mark.parametrize("theta", [10_000.0, 1_000_000.0])
@pytest.mark.parametrize(("h", "t", "d"), SHAPES, ids=IDS)
def test_backward_matches_autograd(h, t, d, theta, gen):
    tables = rope_tables(torch.arange(t), d, theta, torch.float64)
    x = torch.randn(h, t, d, generator=gen, dtype=torch.float64, requires_grad=True)
    y = rope_forward(x, tables)
    dy = torch.randn(h, t, d, generator=gen, dtype=torch.float64)
    (expected,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(rope_backward(dy, tables), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("h", "t", "d"), SHAPES, ids=IDS)
def test_forward_matches_hf(h, t, d, dtype, gen):
    """Tables equal Qwen2RotaryEmbedding's (bit for bit); rotation equals apply_rotary_pos_emb."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

    arch = ModelArch(hidden=h * d, layers=1, heads=h, kv_heads=1, intermediate=3, vocab=5, max_positions=64)
    q = torch.randn(1, h, t, d, generator=gen, dtype=dtype)
    k = torch.randn(1, 1, t, d, generator=gen, dtype=dtype)
    cos, sin = Qwen2RotaryEmbedding(arch.to_hf_config())(q, torch.arange(t)[None])
    tables = rope_tables(torch.arange(t), d, arch.rope_theta, dtype)
    assert torch.equal(tables.cos, cos[0]) and torch.equal(tables.sin, sin[0])
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(rope_forward(q[0], tables), q_hf[0])
    torch.testing.assert_close(rope_forward(k[0], tables), k_hf[0])


@pytest.mark.parametrize(("h", "t", "d"), SHAPES, ids=IDS)
def test_saves_nothing_per_layer(h, t, d, gen):
    """Docstring: nothing saved per layer; the [T, D] cos/sin tables are built once per step."""
    tables = rope_tables(torch.arange(t), d, 1e6, torch.float32)
    out = rope_forward(torch.randn(h, t, d, generator=gen), tables)
    assert isinstance(out, torch.Tensor)  # no saved bundle at all
    assert saved_activation_nbytes(tables, []) == 2 * t * d * 4


class _RopeStep(torch.nn.Module):
    def forward(self, positions, x, dy):
        tables = rope_tables(positions, x.shape[-1], 1e6, x.dtype)
        return rope_forward(x, tables), rope_backward(dy, tables)


def test_exports(gen):
    args = (torch.arange(7), torch.randn(3, 7, 8, generator=gen), torch.randn(3, 7, 8, generator=gen))
    ep = torch.export.export(_RopeStep(), args)
    torch.testing.assert_close(ep.module()(*args), _RopeStep()(*args))


@pytest.mark.parametrize(("factor", "low", "high", "original"), [(8.0, 1.0, 4.0, 8), (32.0, 1.0, 4.0, 16),
                                                                  (2.0, 2.0, 4.0, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_llama3_scaled_tables_equal_llama_rotary_embedding(factor, low, high, original, dtype, gen):
    """With rope scaling the tables are LlamaRotaryEmbedding's bit for bit (scaled inverse frequencies from
    transformers' ROPE_INIT_FUNCTIONS), and differ from plain RoPE's; the rotation and its backward are the same."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from toolchain.mesp.block import block_rope
    from toolchain.models import RopeScaling

    arch = ModelArch(family="llama", hidden=12, layers=1, heads=3, kv_heads=1, head_dim=16, intermediate=3,
                     vocab=5, max_positions=64, rope_theta=500_000.0,
                     rope_scaling=RopeScaling(factor, low, high, original))
    t = 40
    q = torch.randn(1, 3, t, 16, generator=gen, dtype=dtype)
    cos, sin = LlamaRotaryEmbedding(arch.to_hf_config())(q, torch.arange(t)[None])
    tables = block_rope(arch, torch.arange(t), dtype)
    assert torch.equal(tables.cos, cos[0]) and torch.equal(tables.sin, sin[0])
    plain = rope_tables(torch.arange(t), 16, arch.rope_theta, dtype)
    assert not torch.equal(plain.cos, tables.cos)
