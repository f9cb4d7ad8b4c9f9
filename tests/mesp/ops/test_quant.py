"""Group-wise quantized frozen weights (mesp/ops/quant.py): the grid, the interleaved int4 packing, the
chunk choice, and the chunked matmuls and LoRA-linear backward against dense float64 references
(autograd through the dequantized matrix)."""

from __future__ import annotations

import pytest
import torch
from helpers import max_op_output_numel

from toolchain.lora import LoraPair
from toolchain.mesp.ops import linear_backward, linear_forward
from toolchain.mesp.ops.quant import dequantize, matmul_dyw, matmul_xwt, quantize, with_chunk_rows


@pytest.mark.parametrize("kind, qmax", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("o, i, group", [(5, 8, 4), (7, 24, 8), (3, 64, 64)])
def test_dequantized_weights_lie_on_the_grid_within_half_a_step(kind, qmax, o, i, group, gen):
    w = torch.randn(o, i, generator=gen, dtype=torch.float64)
    qw = quantize(w, kind, group)
    d = dequantize(qw)
    assert d.shape == w.shape and d.dtype == w.dtype
    step = qw.scale.repeat_interleave(group, dim=1)                                # [o, i]
    assert qw.scale.shape == (o, i // group)
    assert torch.all((d - w).abs() <= step / 2 + 1e-12)
    levels = d / step
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-9)
    assert levels.round().min() >= -qmax - (kind == "int4") and levels.round().max() <= qmax
    # each group's largest weight is represented exactly (+-qmax steps)
    assert torch.allclose((d.reshape(o, -1, group).abs().amax(-1)), w.reshape(o, -1, group).abs().amax(-1))


def test_int4_is_packed_interleaved_as_executorch_embedding_4bit_reads_it():
    """Byte j of a row: column 2j in the high nibble, column 2j + 1 in the low nibble (biased by 8)."""
    w = torch.tensor([[-7.0, -1, 0, 7, 3, -5, 1, 2]], dtype=torch.float64)          # one group, scale 7/7 = 1
    qw = quantize(w, "int4", 8)
    assert qw.scale.tolist() == [[1.0]] and qw.q.dtype == torch.uint8
    biased = [1, 7, 8, 15, 11, 3, 9, 10]
    assert qw.q.tolist() == [[16 * biased[2 * j] + biased[2 * j + 1] for j in range(4)]]
    assert torch.equal(dequantize(qw), w)


@pytest.mark.parametrize("o, i, group", [(7, 16, 4), (33, 64, 16), (5, 896, 64), (3, 10, 2)])
def test_executorch_kernel_dequantizes_to_the_same_bits(o, i, group):
    """An int4 weight marked `executorch` (the ExecuTorch methods' weights) is dequantized by
    quantized_decomposed::embedding_4bit (its reference implementation here, its C++ kernel on the runtime:
    tests/export) on every path, and a plain one never; whole matrices, row and column chunks and embedding
    rows equal the unpacking the other targets use, bit for bit."""
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401

    from toolchain.mesp.ops.quant import dense_cols, dense_rows, embedding_rows

    w = torch.randn(o, i, generator=torch.Generator().manual_seed(o * i))
    qw = quantize(w, "int4", group)
    et = qw._replace(executorch=True)
    plain = dequantize(qw)
    ids = torch.tensor([o - 1, 0, o // 2])

    def ops(fn, *args):   # the ATen / custom ops one call ran
        return {op for op, _ in max_op_output_numel(fn, *args)[1]}

    kernel = "quantized_decomposed.embedding_4bit.default"
    for fn, args in ((dequantize, ()), (dense_cols, (group, min(3 * group, i))), (dense_rows, (1, o)),
                     (embedding_rows, (ids,))):
        assert kernel in ops(fn, et, *args), fn.__name__          # every int4 path of an executorch weight
        assert kernel not in ops(fn, qw, *args), fn.__name__      # and none of a plain one
    fused = dequantize(et)
    cols = dense_cols(et, group, min(3 * group, i))
    rows = dense_rows(et, 1, o)
    emb = embedding_rows(et, ids)
    assert torch.equal(fused, plain)
    assert torch.equal(cols, plain[:, group:min(3 * group, i)])
    assert torch.equal(rows, plain[1:])
    assert torch.equal(emb, plain[ids])


def test_odd_widths_are_refused():
    with pytest.raises(ValueError, match="multiple of the quantization group"):
        quantize(torch.zeros(2, 6), "int8", 4)


@pytest.mark.parametrize("o, i, max_elems, rows", [
    (4864, 896, 1 << 22, 2432),      # Qwen2.5-0.5B gate/up: 2 equal chunks
    (896, 4864, 1 << 22, 448),       # down: 2 equal chunks, not 862 + 34
    (4864, 896, 1 << 20, 973),       # 5 chunks, the last one 972 rows
    (8, 16, 1 << 22, 8),             # everything at once
    (8, 16, 3, 1),                   # at least one row
    (10, 4, 12, 3),                  # 4 chunks of 3, 3, 3, 1 (12 // 4 = 3 rows fit)
])
def test_chunk_rows_are_the_fewest_equal_chunks_within_the_limit(o, i, max_elems, rows):
    qw = with_chunk_rows(quantize(torch.ones(o, i), "int8", 4), max_elems)
    assert qw.chunk_rows == rows
    assert rows * i <= max(max_elems, i)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("max_elems", [1 << 30, 40, 17, 1])
def test_chunked_matmuls_equal_the_dense_dequantized_matrix(kind, max_elems, gen):
    o, i, t = 11, 16, 5
    qw = with_chunk_rows(quantize(torch.randn(o, i, generator=gen, dtype=torch.float64), kind, 8), max_elems)
    dense = dequantize(qw)
    x, dy = torch.randn(t, i, generator=gen, dtype=torch.float64), torch.randn(t, o, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(matmul_xwt(x, qw), x @ dense.T, rtol=1e-14, atol=1e-13)
    torch.testing.assert_close(matmul_dyw(dy, qw), dy @ dense, rtol=1e-14, atol=1e-13)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_lora_linear_backward_on_a_quantized_weight_matches_autograd(kind, gen):
    t, i, o, r = 6, 32, 12, 3
    qw = with_chunk_rows(quantize(torch.randn(o, i, generator=gen, dtype=torch.float64), kind, 16), 5 * i)
    x = torch.randn(t, i, generator=gen, dtype=torch.float64, requires_grad=True)
    lora = LoraPair(torch.randn(r, i, generator=gen, dtype=torch.float64, requires_grad=True),
                    torch.randn(o, r, generator=gen, dtype=torch.float64, requires_grad=True))
    bias = torch.randn(o, generator=gen, dtype=torch.float64)
    y, saved = linear_forward(x, qw, bias, lora, 0.5)
    reference = x @ dequantize(qw).T + bias + 0.5 * (x @ lora.a.T) @ lora.b.T
    torch.testing.assert_close(y, reference)
    dy = torch.randn(t, o, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad(reference, [x, lora.a, lora.b], dy)
    grads = linear_backward(dy, saved)
    for got, want in zip((grads.dx, grads.lora.a, grads.lora.b), expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("t,o,i,group", [(1, 9, 64, 32), (3, 17, 130, 64), (5, 6, 96, 4), (2, 11, 200, 30)])
def test_w4a8_differs_from_float_activations_by_at_most_half_an_activation_step(t, o, i, group, gen):
    """The W4A8 op (generation's fused methods) against float activations on the same int4 weights (the
    stock methods, training): rounding each activation to its group's int8 grid moves it by at most half a
    step sa / 2, so |y_a8 - y| <= sum_g sa_g / 2 * sum_(k in g) |w_k| (exact values in float64: the
    bound has no float slack to hide an off-by-one step or a wrong scale); and the op's float32 result
    sits within float32 rounding of its exact value."""
    from toolchain.mesp.ops.quant import _unpack_int4, int4_linear_a8_reference, quantize_activations

    ng = -(-i // group)
    w = torch.randn(o, ng * group, generator=gen)
    qw = quantize(w, "int4", group)
    q, scales = qw.q[:, :i // 2].contiguous(), qw.scale
    x = torch.randn(t, i, generator=gen) * torch.exp2(torch.randint(-4, 5, (1, i), generator=gen).float())
    a, sa = quantize_activations(x, group)
    wf = (_unpack_int4(q, torch.float64) - 8) * scales.double().repeat_interleave(group, 1)[:, :i]   # [o, i]
    xa = (a.double() * sa.double()[..., None]).reshape(t, -1)[:, :i]                               # [t, i]
    assert bool(((xa - x.double()).abs() <= sa.double().repeat_interleave(group, 1)[:, :i] / 2 * (1 + 2 ** -20)).all())
    y_float, y_a8 = x.double() @ wf.T, xa @ wf.T
    w_abs = torch.nn.functional.pad(wf.abs(), (0, ng * group - i)).reshape(o, ng, group).sum(-1)   # [o, ng]
    bound = (sa.double() / 2 * (1 + 2 ** -20)) @ w_abs.T                                           # [t, o]
    assert bool(((y_a8 - y_float).abs() <= bound).all())
    assert bool((bound > 0).all()) and not torch.equal(y_a8, y_float)
    ref = int4_linear_a8_reference(x, q, scales, group).double()
    torch.testing.assert_close(ref, y_a8, rtol=1e-5, atol=1e-5 * float(y_a8.abs().max()))
