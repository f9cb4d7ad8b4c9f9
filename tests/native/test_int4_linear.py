"""The native int4 kernel (toolchain/native/int4_linear.cpp) against the reference on random shapes and
groups: odd row counts and widths, partial last groups, T = 1 (decode) and prefill tiles with a remainder.

The reference is the float32 dequantized weight (w = float(n - 8) * s, what `quant.dequantize` and the
kernel both compute per element) multiplied into x in float64, so the only difference left is the float32
summation, bounded by the classic dot-product bound |err| <= gamma_k * sum_k |x_k w_k|, gamma_k = k u /
(1 - k u), u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5).
The ExecuTorch registration is tested through the fused generation methods (tests/export/test_generate_eval.py)."""

from __future__ import annotations

import pytest
import torch

from toolchain.mesp.ops.quant import _unpack_int4, int4_linear_reference, quantize
from toolchain.native import load_kernels

U = 2.0 ** -24


def _quantize_partial(w: torch.Tensor, group: int):
    """int4 weights whose last group may be partial (i % group != 0): scales [o, ceil(i / group)]."""
    o, i = w.shape
    ng = -(-i // group)
    pad = torch.cat([w, torch.zeros(o, ng * group - i, dtype=w.dtype)], dim=1)
    qw = quantize(pad, "int4", group)
    return qw.q[:, :i // 2].contiguous(), qw.scale.contiguous()


def _kernel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    lib = load_kernels()
    t, i = x.shape
    y = torch.empty(t, q.shape[0], dtype=torch.float32)
    rc = lib.toolchain_int4_linear(x.data_ptr(), t, i, q.data_ptr(), scales.data_ptr(), q.shape[0], scales.shape[1],
                                   group, y.data_ptr())
    assert rc == 0
    return y


def _dequantized(q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    n = _unpack_int4(q, torch.float32) - 8
    return n * scales.repeat_interleave(group, dim=1)[:, :n.shape[1]]        # float32 [o, i]


SHAPES = [  # (T, o, i, group)
    (1, 1, 2, 2), (1, 7, 10, 2), (2, 5, 34, 34), (3, 33, 128, 64), (5, 17, 96, 32), (1, 13, 100, 64),
    (4, 9, 70, 6), (7, 31, 258, 64), (9, 3, 64, 66), (1, 65, 896, 64), (6, 40, 200, 30), (32, 11, 130, 128),
]


@pytest.mark.parametrize("t,o,i,group", SHAPES, ids=[f"T{t}-o{o}-i{i}-g{g}" for t, o, i, g in SHAPES])
def test_kernel_equals_the_reference_within_the_float32_summation_bound(t, o, i, group):
    gen = torch.Generator().manual_seed(o * 1000 + i + t)
    q, scales = _quantize_partial(torch.randn(o, i, generator=gen), group)
    x = torch.randn(t, i, generator=gen)
    y = _kernel(x, q, scales, group)
    w = _dequantized(q, scales, group).double()
    exact = x.double() @ w.T
    gamma = i * U / (1 - i * U)
    bound = gamma * (x.double().abs() @ w.abs().T)
    err = (y.double() - exact).abs()
    assert bool((err <= bound).all()), f"max err {float(err.max()):.3g}, bound there {float(bound.flatten()[err.argmax()]):.3g}"
    # and the PyTorch op the programs trace (dequantize + linear) agrees to the same bound
    ref = int4_linear_reference(x, q, scales, group).double()
    assert bool(((ref - exact).abs() <= bound).all())


def test_rows_of_x_do_not_interact():
    """Each row of a prefill tile equals the same row alone (T = 1), bit for bit: tiles share the
    decoded weights, not the sums."""
    gen = torch.Generator().manual_seed(3)
    q, scales = _quantize_partial(torch.randn(21, 192, generator=gen), 64)
    x = torch.randn(11, 192, generator=gen)
    whole = _kernel(x, q, scales, 64)
    for r in range(11):
        assert torch.equal(whole[r], _kernel(x[r:r + 1].clone(), q, scales, 64)[0])


@pytest.mark.parametrize("i,ng,group", [(9, 1, 10), (10, 1, 3), (10, 2, 10), (10, 1, 0), (0, 0, 2)])
def test_bad_arguments_are_refused(i, ng, group):
    lib = load_kernels()
    x, y = torch.zeros(max(i, 1)), torch.zeros(4)
    q, s = torch.zeros(4, max(i // 2, 1), dtype=torch.uint8), torch.zeros(4, max(ng, 1))
    assert lib.toolchain_int4_linear(x.data_ptr(), 1, i, q.data_ptr(), s.data_ptr(), 4, ng, group, y.data_ptr()) == -1


def test_the_library_is_cached_per_source_and_flags(tmp_path, monkeypatch):
    from toolchain.native import build

    monkeypatch.setenv("TOOLCHAIN_KERNEL_CACHE", str(tmp_path))
    first = build.kernel_library()
    assert first.is_file() and first.is_relative_to(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build.kernel_library() == first and first.stat().st_mtime_ns == mtime     # not rebuilt
    assert first.read_bytes()[:4] == b"\x7fELF"   # (not loaded: a second copy would register its kernel twice)
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".build-")]  # no temp file left


def test_no_compiler_is_a_clear_error(tmp_path, monkeypatch):
    from toolchain.native import KernelUnavailable, build

    monkeypatch.setenv("TOOLCHAIN_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(KernelUnavailable, match="does not run"):
        build.kernel_library()
