"""Group-wise quantized frozen weights (mesp/ops/quant.py): the grid, the interleaved int4 packing, the
chunk choice, and the chunked matmuls and LoRA-linear backward against dense float64 references
(autograd through the dequantized matrix)."""

from __future__ import annotations

import pytest
import torch

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
    """Traced for ExecuTorch, int4 dequantization is quantized_decomposed::embedding_4bit (its reference
    implementation here, its C++ kernel on the runtime: tests/export); whole matrices and column chunks
    equal the unpacking the other targets use, bit for bit."""
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401

    from toolchain.mesp.ops.quant import dense_cols, executorch_kernels

    w = torch.randn(o, i, generator=torch.Generator().manual_seed(o * i))
    qw = quantize(w, "int4", group)
    plain = dequantize(qw)
    with executorch_kernels():
        fused = dequantize(qw)
        cols = dense_cols(qw, group, min(3 * group, i))
    assert torch.equal(fused, plain)
    assert torch.equal(cols, plain[:, group:min(3 * group, i)])
    from toolchain.mesp.ops import quant

    assert quant._EXECUTORCH_KERNELS is False   # the context is left as found


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
