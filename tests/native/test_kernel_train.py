"""The training blocks' float32 kernels (toolchain/native/kernels.cpp: `toolchain_attention_train`, `..._backward`,
the `--compute int8` programs' causal attention of the whole sequence, forward and gradients; `toolchain_swiglu_train`,
an MLP chunk's SwiGLU recomputed with its gradients) against their references
(mesp/ops/attention.py) evaluated in float64, and against autograd through the reference: random odd shapes (T not a
multiple of 4 or 16, D not a multiple of 16, grouped and ungrouped heads), the block's shapes; the same bits at 1 and
2 threads and on every kernel path (one generic body); bad arguments refused; the ExecuTorch ops in a program.

Tolerance: the kernel's only differences from the float64 value are float32 roundings (scores, exp16 within 2 ulp,
the softmax's sum, products summed over T or D terms), a few 1e-7 relative to the outputs' scale; checked at
2e-5 x the output's largest magnitude, and the float32 PyTorch reference (what the eager step runs) must hold the
same bound, so the bound is not looser than PyTorch's own rounding needs."""

from __future__ import annotations

import ctypes

import pytest
import torch

from toolchain.mesp.kernels import load_native_kernels
from toolchain.mesp.ops.attention import attention_train_backward_reference, attention_train_reference
from toolchain.mesp.ops.lora_linear import lora_backward_reference, lora_rows_backward_reference
from toolchain.mesp.ops.swiglu import swiglu_train_reference

_ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
TOL = 2e-5


def _inputs(h, hk, t, d, seed, scale_qk=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(h, t, d, generator=gen) * scale_qk
    k = torch.randn(hk, t, d, generator=gen) * scale_qk
    v = torch.randn(hk, t, d, generator=gen)
    dout = torch.randn(t, h * d, generator=gen)
    return q, k, v, dout


def _forward(lib, q, k, v, scale):
    h, t, d = q.shape
    out = torch.full((t, h * d), float("nan"))
    assert lib.toolchain_attention_train(_ptr(q), _ptr(k), _ptr(v), h, k.shape[0], t, d, ctypes.c_float(scale),
                                         _ptr(out)) == 0
    return out


def _backward(lib, dout, q, k, v, o, scale):
    h, t, d = q.shape
    hk = k.shape[0]
    out = torch.full((h + 2 * hk, t, d), float("nan"))
    assert lib.toolchain_attention_train_backward(_ptr(dout), _ptr(q), _ptr(k), _ptr(v), _ptr(o), h, hk, t, d,
                                                  ctypes.c_float(scale), _ptr(out)) == 0
    return out


def _close(got, exact, ref, scale=None):
    """Within TOL x the output's largest magnitude (or `scale`: the magnitude of the terms it is a difference of)."""
    bound = TOL * float(exact.abs().max() if scale is None else scale)
    assert not got.isnan().any()
    assert float((got.double() - exact).abs().max()) <= bound
    assert float((ref.double() - exact).abs().max()) <= bound


SHAPES = [(14, 2, 256, 64), (3, 1, 37, 24), (4, 4, 5, 16), (2, 1, 1, 8), (6, 3, 19, 33), (16, 2, 70, 128)]


@pytest.mark.parametrize("h,hk,t,d", SHAPES)
def test_attention_train_equals_the_reference_in_float64(h, hk, t, d):
    lib = load_native_kernels()
    q, k, v, dout = _inputs(h, hk, t, d, seed=h * 1000 + t * 10 + d, scale_qk=2.0)
    scale = d ** -0.5
    o = _forward(lib, q, k, v, scale)
    exact = attention_train_reference(q.double(), k.double(), v.double(), scale)
    _close(o, exact, attention_train_reference(q, k, v, scale))
    g = _backward(lib, dout, q, k, v, o, scale)
    exact_g = attention_train_backward_reference(dout.double(), q.double(), k.double(), v.double(), exact, scale)
    ref_g = attention_train_backward_reference(dout, q, k, v, attention_train_reference(q, k, v, scale), scale)
    _close(g, exact_g, ref_g)   # dq, dk, dv at the gradient's scale (at T = 1, dq is 0 by cancellation: dP = rows)


@pytest.mark.parametrize("h,hk,t,d", [(4, 2, 13, 20), (3, 3, 33, 16)])
def test_the_backward_reference_is_autograd_of_the_forward(h, hk, t, d):
    """The backward's definition is the gradient of the forward's (float64 autograd through the reference)."""
    q, k, v, dout = (x.double() for x in _inputs(h, hk, t, d, seed=7 + t))
    scale = 0.3
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = attention_train_reference(*leaves, scale)
    o.backward(dout)
    g = attention_train_backward_reference(dout, q, k, v, o.detach(), scale)
    torch.testing.assert_close(g, torch.cat([x.grad for x in leaves]), rtol=1e-10, atol=1e-10)


def test_the_bits_do_not_depend_on_threads_or_the_kernel_path(lib):
    from executorch.extension.pybindings import portable_lib

    before = lib.toolchain_kernel_threads()
    if before < 1:
        pytest.skip("no thread pool in this build")
    cases = [(14, 2, 256, 64), (6, 3, 19, 33)]
    paths = [p for p in ("generic", "avx2", "avx_vnni", "avx512_vnni") if lib.toolchain_select_kernel_path(p.encode()) == 0]
    try:
        for shape in cases:
            q, k, v, dout = _inputs(*shape, seed=3)
            seen = []
            for n, path in [(1, p) for p in paths] + [(2, paths[0]), (2, paths[-1])]:
                portable_lib._unsafe_reset_threadpool(n)
                assert lib.toolchain_select_kernel_path(path.encode()) == 0
                o = _forward(lib, q, k, v, 0.125)
                seen.append(torch.cat([o.flatten(), _backward(lib, dout, q, k, v, o, 0.125).flatten()]))
            assert all(torch.equal(seen[0].view(torch.int32), s.view(torch.int32)) for s in seen[1:]), shape
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def test_bad_arguments_are_refused():
    lib = load_native_kernels()
    x = torch.zeros(64)
    for h, hk, t, d in [(3, 2, 4, 4), (0, 1, 4, 4), (2, 0, 4, 4), (2, 1, -1, 4), (2, 1, 4, 0)]:
        assert lib.toolchain_attention_train(_ptr(x), _ptr(x), _ptr(x), h, hk, t, d, ctypes.c_float(1.0), _ptr(x)) == -1
        assert lib.toolchain_attention_train_backward(_ptr(x), _ptr(x), _ptr(x), _ptr(x), _ptr(x), h, hk, t, d,
                                                      ctypes.c_float(1.0), _ptr(x)) == -1


def _swiglu_train(lib, g, u, da):
    out = torch.full((3, *g.shape), float("nan"))
    assert lib.toolchain_swiglu_train(_ptr(g), _ptr(u), _ptr(da), g.numel(), _ptr(out)) == 0
    return out


@pytest.mark.parametrize("shape", [(256, 256), (7, 13), (1, 1), (3, 1029)])
def test_swiglu_train_equals_the_reference_in_float64(shape):
    """a, dg, du within float32 rounding of the float64 values (exp16: 2 ulp; a handful of products), each at its
    own elements' scale: relative 2e-6 plus 2e-6 x the output's largest magnitude; the float32 reference too; a
    equals toolchain_swiglu's bits (the forward's op: the recompute sees the forward's a)."""
    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(shape[1])
    g, u, da = (torch.randn(*shape, generator=gen) * 4 for _ in range(3))
    got = _swiglu_train(lib, g, u, da)
    exact = swiglu_train_reference(g.double(), u.double(), da.double())
    ref = swiglu_train_reference(g, u, da)
    for i in range(3):
        tol = 2e-6 * float(exact[i].abs().max())
        torch.testing.assert_close(got[i].double(), exact[i], rtol=2e-6, atol=tol)
        torch.testing.assert_close(ref[i].double(), exact[i], rtol=2e-6, atol=tol)
    a = torch.empty_like(g)
    assert lib.toolchain_swiglu(_ptr(g), _ptr(u), g.numel(), _ptr(a)) == 0
    assert torch.equal(got[0], a)


def test_swiglu_train_bits_do_not_depend_on_threads_and_nan_stays_in_its_element(lib):
    from executorch.extension.pybindings import portable_lib

    before = lib.toolchain_kernel_threads()
    if before < 1:
        pytest.skip("no thread pool in this build")
    gen = torch.Generator().manual_seed(5)
    n = 256 * 256 + 5
    g, u, da = (torch.randn(n, generator=gen) * 4 for _ in range(3))
    g[7] = float("nan")
    try:
        seen = []
        for k in (1, 2, 1):
            portable_lib._unsafe_reset_threadpool(k)
            seen.append(_swiglu_train(lib, g, u, da).view(torch.int32).clone())
        assert torch.equal(seen[0], seen[1]) and torch.equal(seen[0], seen[2])
    finally:
        portable_lib._unsafe_reset_threadpool(before)
    out = _swiglu_train(lib, g, u, da)
    assert out[:, 7].isnan().all() and not out[:, :7].isnan().any() and not out[:, 8:].isnan().any()
    assert lib.toolchain_swiglu_train(_ptr(g), _ptr(u), _ptr(da), -1, _ptr(out)) == -1


@pytest.mark.parametrize("c,v,first", [(256, 1024, False), (5, 37, True), (3, 16, False), (1, 1, True)])
def test_online_softmax_kernels_equal_the_references_in_float64(c, v, first):
    """The head chunk's online softmax: m' exact (a max), a and s' and exp(z - m') within float32 rounding: the
    float32 difference z - m' is off by up to |z - m'| u (u = 2^-24), which exp turns into a relative error of as
    much, plus exp16's 2 ulp: |err| <= (|z - m'| + 3) 2u exp(z - m') per element (the float32 PyTorch reference
    holds the same bound); s' sums V such terms (relative 1e-5 at these shapes); a = 0 on the first chunk
    (m = -inf)."""
    from toolchain.mesp.ops.ce_online import exp_sub_rows_reference, online_softmax_stats_reference

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(c * 7 + v)
    z = torch.randn(c, v, generator=gen) * 5
    m = torch.full((c, 1), float("-inf")) if first else torch.randn(c, 1, generator=gen) * 5
    s = torch.zeros(c, 1) if first else torch.rand(c, 1, generator=gen) * 100
    st = torch.full((c, 3), float("nan"))
    assert lib.toolchain_online_softmax_stats(_ptr(z), _ptr(m), _ptr(s), c, v, _ptr(st)) == 0
    exact = online_softmax_stats_reference(z.double(), m.double(), s.double())
    ref = online_softmax_stats_reference(z, m, s)
    assert torch.equal(st[:, 0], ref[:, 0])
    for got_, r in ((st, exact), (ref, exact)):
        torch.testing.assert_close(got_.double(), r, rtol=1e-5, atol=0.0)
    if first:
        assert (st[:, 2] == 0).all()
    p = torch.full((c, v), float("nan"))
    mn = st[:, 0:1].contiguous()
    assert lib.toolchain_exp_sub_rows(_ptr(z), _ptr(mn), c, v, _ptr(p)) == 0
    exact_p = exp_sub_rows_reference(z.double(), mn.double())
    bound = ((z.double() - mn.double()).abs() + 3) * 2.0 ** -23 * exact_p
    assert ((p.double() - exact_p).abs() <= bound).all()
    assert ((exp_sub_rows_reference(z, mn).double() - exact_p).abs() <= bound).all()
    # the stats' sum is the sum of exactly these exp values (the same exp16), in float64 within the V-term bound
    torch.testing.assert_close(st[:, 1].double() - st[:, 2].double() * s[:, 0].double(),
                               p.double().sum(-1), rtol=1e-5, atol=0.0)
    assert lib.toolchain_exp_sub_rows(_ptr(z), _ptr(mn), c, 0, _ptr(p)) == -1
    assert lib.toolchain_online_softmax_stats(_ptr(z), _ptr(m), _ptr(s), -1, v, _ptr(st)) == -1


def _lora_inputs(t, i, o, r, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(t, o, generator=gen), torch.randn(t, i, generator=gen), torch.randn(r, i, generator=gen),
            torch.randn(o, r, generator=gen), torch.randn(t, i, generator=gen))


def _lora_backward(lib, dy, x, a, b, s, dx):
    (t, i), o, r = x.shape, dy.shape[1], a.shape[0]
    out = torch.full(((t + r) * i + o * r,), float("nan"))
    assert lib.toolchain_lora_backward(_ptr(dy), _ptr(x), _ptr(a), _ptr(b), _ptr(dx), t, i, o, r, ctypes.c_float(s),
                                       _ptr(out)) == 0
    return out


def _lora_rows(lib, dy, h, b, s):
    (t, c), r = dy.shape, h.shape[1]
    out = torch.full((c + t, r), float("nan"))
    assert lib.toolchain_lora_rows_backward(_ptr(dy), _ptr(h), _ptr(b), t, c, r, ctypes.c_float(s), _ptr(out)) == 0
    return out


def _close_parts(got, exact, ref, sizes):
    """Each part (dx, dA, dB) at its own scale: the parts' magnitudes differ by sqrt(T) and more."""
    for g_, e_, r_ in zip(got.split(sizes), exact.split(sizes), ref.split(sizes)):
        _close(g_, e_, r_)


LORA_SHAPES = [(256, 896, 896, 8), (256, 896, 128, 8), (37, 33, 19, 3), (1, 5, 7, 1), (70, 130, 65, 16)]


@pytest.mark.parametrize("t,i,o,r", LORA_SHAPES)
def test_lora_backward_equals_the_reference_in_float64(t, i, o, r):
    lib = load_native_kernels()
    dy, x, a, b, dx = _lora_inputs(t, i, o, r, seed=t + i + o + r)
    s = 2.0 / r
    got = _lora_backward(lib, dy, x, a, b, s, dx)
    exact = lora_backward_reference(dy.double(), x.double(), a.double(), b.double(), s, dx.double())
    _close_parts(got, exact, lora_backward_reference(dy, x, a, b, s, dx), [t * i, r * i, o * r])
    rows = _lora_rows(lib, dy, x[:, :r].contiguous(), b, s)      # dy [T, o], h [T, r], b [o, r]
    exact_rows = lora_rows_backward_reference(dy.double(), x[:, :r].double(), b.double(), s)
    _close_parts(rows.flatten(), exact_rows.flatten(), lora_rows_backward_reference(dy, x[:, :r], b, s).flatten(),
                 [o * r, t * r])


@pytest.mark.parametrize("t,i,o,r", [(13, 20, 9, 4), (33, 16, 40, 8)])
def test_the_lora_backward_reference_is_autograd_of_the_projection(t, i, o, r):
    """dx + dh A, dA, dB of y = s (x A^T) B^T (float64 autograd); the rows op is its dB and dh."""
    dy, x, a, b, dx = (v.double() for v in _lora_inputs(t, i, o, r, seed=5 + t))
    s = 0.7
    leaves = [v.clone().requires_grad_() for v in (x, a, b)]
    (s * (leaves[0] @ leaves[1].T) @ leaves[2].T).backward(dy)
    want = torch.cat([(dx + leaves[0].grad).flatten(), leaves[1].grad.flatten(), leaves[2].grad.flatten()])
    torch.testing.assert_close(lora_backward_reference(dy, x, a, b, s, dx), want, rtol=1e-10, atol=1e-10)
    h = (x @ a.T).requires_grad_()
    bb = b.clone().requires_grad_()
    (s * h @ bb.T).backward(dy)
    torch.testing.assert_close(lora_rows_backward_reference(dy, h.detach(), b, s), torch.cat([bb.grad, h.grad]),
                               rtol=1e-10, atol=1e-10)


def test_lora_backward_bits_do_not_depend_on_threads_or_the_kernel_path(lib):
    from executorch.extension.pybindings import portable_lib

    before = lib.toolchain_kernel_threads()
    if before < 1:
        pytest.skip("no thread pool in this build")
    paths = [p for p in ("generic", "avx2", "avx_vnni", "avx512_vnni") if lib.toolchain_select_kernel_path(p.encode()) == 0]
    try:
        for shape in [(256, 896, 128, 8), (37, 200, 70, 3)]:
            dy, x, a, b, dx = _lora_inputs(*shape, seed=11)
            seen = []
            for n, path in [(1, p) for p in paths] + [(2, paths[0]), (2, paths[-1])]:
                portable_lib._unsafe_reset_threadpool(n)
                assert lib.toolchain_select_kernel_path(path.encode()) == 0
                got = torch.cat([_lora_backward(lib, dy, x, a, b, 0.25, dx),
                                 _lora_rows(lib, dy, dx[:, :shape[3]].contiguous(), b, 0.25).flatten()])
                seen.append(got.view(torch.int32).clone())
            assert all(torch.equal(seen[0], s_) for s_ in seen[1:]), shape
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def test_lora_backward_bad_arguments_are_refused():
    lib = load_native_kernels()
    z = torch.zeros(64)
    for t, i, o, r in [(0, 4, 4, 2), (4, 0, 4, 2), (4, 4, 0, 2), (4, 4, 4, 0), (-1, 4, 4, 2)]:
        assert lib.toolchain_lora_backward(_ptr(z), _ptr(z), _ptr(z), _ptr(z), _ptr(z), t, i, o, r,
                                           ctypes.c_float(1.0), _ptr(z)) == -1
        if i > 0:                                                # the rows op has no i
            assert lib.toolchain_lora_rows_backward(_ptr(z), _ptr(z), _ptr(z), t, o, r, ctypes.c_float(1.0),
                                                    _ptr(z)) == -1


# toolchain::lora_linear_a8_rows: an MLP chunk's gate / up product (--compute int8 training), rows [row0, row0 + rows)
# of W (int4 q, scales) and of B read in place: the bits of toolchain::lora_linear_a8 on copies of those rows.

def _int4(o, i, group, gen):
    q = torch.randint(0, 256, (o, i // 2), generator=gen, dtype=torch.uint8)
    s = torch.rand(o, -(-i // group), generator=gen) * 0.02 + 1e-3
    return q, s


def _lora_linear(lib, x, q, s, group, a, b, scale):
    (t, i), o = x.shape, q.shape[0]
    y = torch.full((t, o), float("nan"))
    r = 0 if a is None else a.shape[0]
    p = (lambda v: None if v is None else _ptr(v))
    assert lib.toolchain_lora_linear_a8(_ptr(x), t, i, _ptr(q), _ptr(s), o, s.shape[1], group, None, p(a), p(b), r,
                                        ctypes.c_float(scale), None, _ptr(y)) == 0
    return y


def _lora_linear_rows(lib, x, q, s, group, row0, rows, a, b, scale):
    (t, i), o = x.shape, q.shape[0]
    y = torch.full((t, rows), float("nan"))
    r = 0 if a is None else a.shape[0]
    p = (lambda v: None if v is None else _ptr(v))
    assert lib.toolchain_lora_linear_a8_rows(_ptr(x), t, i, _ptr(q), _ptr(s), o, s.shape[1], group, row0, rows, p(a),
                                             p(b), r, ctypes.c_float(scale), _ptr(y)) == 0
    return y


# (T, i, o, group, row0, rows, r): a decode-sized row with rank 8 (B read in place), prefill / training sizes, odd row
# counts and offsets, the last rows of W, no LoRA (r = 0)
ROWS_SHAPES = [(1, 128, 300, 64, 37, 100, 8), (256, 896, 1024, 64, 256, 256, 8), (37, 130, 77, 32, 5, 71, 3),
               (9, 64, 40, 64, 0, 40, 0), (70, 96, 50, 32, 49, 1, 16), (3, 200, 129, 128, 64, 65, 8)]


def test_lora_linear_a8_rows_is_lora_linear_a8_on_the_rows_on_every_path_and_thread_count(lib):
    """Bits equal to toolchain_lora_linear_a8 on copies of the rows (W's and B's), on every x86 path this CPU has at 1
    thread and on the first and last at 2 threads; and within float32 rounding of the reference (decode_ops)."""
    from executorch.extension.pybindings import portable_lib

    from toolchain.mesp.decode_ops import lora_linear_a8_rows_reference

    before = lib.toolchain_kernel_threads()
    paths = [p for p in ("generic", "avx2", "avx_vnni", "avx512_vnni") if lib.toolchain_select_kernel_path(p.encode()) == 0]
    try:
        for n, (t, i, o, group, row0, rows, r) in enumerate(ROWS_SHAPES):
            gen = torch.Generator().manual_seed(40 + n)
            x = torch.randn(t, i, generator=gen)
            if t > 2:
                x[1] = 0.0                                   # a zero row: y = 0
            q, s = _int4(o, i, group, gen)
            a = None if r == 0 else torch.randn(r, i, generator=gen) * 0.1
            b = None if r == 0 else torch.randn(o, r, generator=gen) * 0.1
            sl = slice(row0, row0 + rows)
            bs = None if b is None else b[sl].contiguous()
            seen = []
            for threads, path in [(1, p) for p in paths] + [(2, paths[0]), (2, paths[-1])]:
                portable_lib._unsafe_reset_threadpool(threads)
                assert lib.toolchain_select_kernel_path(path.encode()) == 0
                got = _lora_linear_rows(lib, x, q, s, group, row0, rows, a, b, 0.5)
                want = _lora_linear(lib, x, q[sl].contiguous(), s[sl].contiguous(), group, a, bs, 0.5)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (path, threads, t, i, o, row0)
                seen.append(got)
            assert all(torch.equal(seen[0].view(torch.int32), g.view(torch.int32)) for g in seen[1:])
            ref = lora_linear_a8_rows_reference(x, q, s, group, row0, rows, a, b, 0.5)
            torch.testing.assert_close(seen[0], ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
            if t > 2:
                assert (seen[0][1] == 0).all()
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def test_lora_linear_a8_rows_refuses_rows_outside_w():
    lib = load_native_kernels()
    x, q, s, y = torch.zeros(2, 8), torch.zeros(6, 4, dtype=torch.uint8), torch.ones(6, 1), torch.zeros(64)
    for row0, rows in [(-1, 2), (5, 2), (0, 7), (2, -1)]:
        assert lib.toolchain_lora_linear_a8_rows(_ptr(x), 2, 8, _ptr(q), _ptr(s), 6, 1, 8, row0, rows, None, None, 0,
                                                 ctypes.c_float(1.0), _ptr(y)) == -1
    with pytest.raises(ValueError, match="outside"):
        from toolchain.mesp.decode_ops import lora_linear_a8_rows_reference
        lora_linear_a8_rows_reference(x, q, s, 8, 5, 2, None, None, 1.0)


def test_the_executorch_rows_op_equals_the_c_entry(tmp_path):
    """A program calling `toolchain::lora_linear_a8_rows` on the ExecuTorch runtime gives the C entry's bits."""
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    import toolchain.mesp  # noqa: F401  (registers the toolchain ops with PyTorch)

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(8)
    t, i, o, group, r = 20, 96, 70, 32, 4
    x = torch.randn(t, i, generator=gen)
    q, s = _int4(o, i, group, gen)
    a, b = torch.randn(r, i, generator=gen), torch.randn(o, r, generator=gen)

    class Rows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, v in (("q", q), ("s", s), ("a", a), ("b", b)):
                self.register_buffer(name, v)

        def forward(self, x_):
            return (torch.ops.toolchain.lora_linear_a8_rows(x_, self.q, self.s, group, 13, 30, self.a, self.b, 0.25),
                    torch.ops.toolchain.lora_linear_a8_rows(x_, self.q, self.s, group, 64, 6, None, None, 0.25))

    program = to_edge(torch.export.export(Rows(), (x,))).to_executorch()
    pte = tmp_path / "rows.pte"
    pte.write_bytes(program.buffer)
    got = Runtime.get().load_program(pte).load_method("forward").execute([x])
    assert torch.equal(got[0].view(torch.int32),
                       _lora_linear_rows(lib, x, q, s, group, 13, 30, a, b, 0.25).view(torch.int32))
    assert torch.equal(got[1].view(torch.int32),
                       _lora_linear_rows(lib, x, q, s, group, 64, 6, None, None, 0.25).view(torch.int32))


# The attention half's RoPE and RMSNorm backward (`toolchain_rope_train`, `..._backward`, `toolchain_rms_norm_backward`).

def _tables(t, d, seed):
    from toolchain.mesp.ops.rope import rope_tables

    pos = torch.randperm(4 * t + 3, generator=torch.Generator().manual_seed(seed))[:t]   # any positions, any order
    return rope_tables(pos, d, 1e6, torch.float32)


def _rope(lib, x, cos, sin, n):
    t, d = x.shape[0], x.shape[1] // n
    out = torch.full((n, t, d), float("nan"))
    assert lib.toolchain_rope_train(_ptr(x), _ptr(cos), _ptr(sin), t, n, d, _ptr(out)) == 0
    return out


def _rope_back(lib, dy, cos, sin, start, n):
    big_n, t, d = dy.shape
    out = torch.full((t, n * d), float("nan"))
    assert lib.toolchain_rope_train_backward(_ptr(dy), _ptr(cos), _ptr(sin), big_n, start, t, n, d, _ptr(out)) == 0
    return out


def _rms_back(lib, x, w, eps, dy, dy2=None, dy3=None, residual=None):
    out = torch.full_like(x, float("nan"))
    opt = lambda v: None if v is None else _ptr(v)  # noqa: E731
    assert lib.toolchain_rms_norm_backward(_ptr(x), _ptr(w), _ptr(dy), opt(dy2), opt(dy3), opt(residual), x.shape[0],
                                           x.shape[1], ctypes.c_float(eps), _ptr(out)) == 0
    return out


ROPE_SHAPES = [(256, 14, 64), (256, 2, 64), (37, 3, 24), (1, 1, 2), (19, 5, 130), (70, 4, 128)]


@pytest.mark.parametrize("t,n,d", ROPE_SHAPES)
def test_rope_train_equals_the_reference_in_float64(t, n, d):
    from toolchain.mesp.ops.rope import rope_train_backward_reference, rope_train_reference

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(t * 31 + n * 7 + d)
    x = torch.randn(t, n * d, generator=gen) * 3
    cos, sin = _tables(t, d, seed=t + d)
    got = _rope(lib, x, cos, sin, n)
    exact = rope_train_reference(x.double(), cos.double(), sin.double(), n)
    _close(got, exact, rope_train_reference(x, cos, sin, n))
    big = torch.randn(n + 3, t, d, generator=gen)               # the stacked gradients: heads 2 .. 2 + n - 1 of n + 3
    got_b = _rope_back(lib, big, cos, sin, 2, n)
    exact_b = rope_train_backward_reference(big.double(), cos.double(), sin.double(), 2, n)
    _close(got_b, exact_b, rope_train_backward_reference(big, cos, sin, 2, n))


@pytest.mark.parametrize("t,n,d", [(13, 3, 20), (5, 2, 8)])
def test_the_rope_backward_reference_is_autograd_of_the_forward(t, n, d):
    """rope_train_backward of the stacked gradients is the vector-Jacobian product of rope_train (float64)."""
    from toolchain.mesp.ops.rope import rope_train_backward_reference, rope_train_reference

    gen = torch.Generator().manual_seed(t)
    cos, sin = (v.double() for v in _tables(t, d, seed=1))
    x = torch.randn(t, n * d, generator=gen, dtype=torch.float64, requires_grad=True)
    big = torch.randn(n + 2, t, d, generator=gen, dtype=torch.float64)
    rope_train_reference(x, cos, sin, n).backward(big[1:1 + n])
    torch.testing.assert_close(rope_train_backward_reference(big, cos, sin, 1, n), x.grad, rtol=1e-12, atol=1e-12)


RMS_SHAPES = [(256, 896), (37, 33), (1, 1), (5, 16), (70, 130)]


@pytest.mark.parametrize("t,d", RMS_SHAPES)
@pytest.mark.parametrize("parts", ["dy", "dy+dy2+dy3+residual", "dy+residual", "dy+dy2"])
def test_rms_norm_backward_equals_the_reference_in_float64(t, d, parts):
    from toolchain.mesp.ops.rmsnorm import rms_norm_backward_reference

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(t * 3 + d)
    x = torch.randn(t, d, generator=gen) * 2
    w = torch.randn(d, generator=gen)
    dy, dy2, dy3, res = (torch.randn(t, d, generator=gen) for _ in range(4))
    dy2, dy3 = (dy2 if "dy2" in parts else None), (dy3 if "dy3" in parts else None)
    res = res if "residual" in parts else None
    dbl = lambda v: None if v is None else v.double()  # noqa: E731
    got = _rms_back(lib, x, w, 1e-6, dy, dy2, dy3, res)
    exact = rms_norm_backward_reference(x.double(), w.double(), 1e-6, dy.double(), dbl(dy2), dbl(dy3), dbl(res))
    # dx = r (g - xhat mean(g xhat)) cancels (exactly at d = 1): the bound is at the scale of its terms r g
    g = sum(v.double() for v in (dy, dy2, dy3) if v is not None) * w.double()
    r = torch.rsqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6)
    scale = float((r * g).abs().max()) + (0.0 if res is None else float(res.abs().max()))
    _close(got, exact, rms_norm_backward_reference(x, w, 1e-6, dy, dy2, dy3, res), scale)


def test_the_rms_norm_backward_reference_is_autograd_of_the_norm():
    """residual + d rmsnorm(x) / dx applied to dy + dy2 + dy3 (float64 autograd through rmsnorm_forward)."""
    from toolchain.mesp.ops.rmsnorm import rms_norm_backward_reference, rmsnorm_forward

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(11, 24, generator=gen, dtype=torch.float64, requires_grad=True)
    w, dy, dy2, dy3, res = (torch.randn(*s, generator=gen, dtype=torch.float64)
                            for s in [(24,), (11, 24), (11, 24), (11, 24), (11, 24)])
    rmsnorm_forward(x, w, 1e-6)[0].backward(dy + dy2 + dy3)
    torch.testing.assert_close(rms_norm_backward_reference(x.detach(), w, 1e-6, dy, dy2, dy3, res), res + x.grad,
                               rtol=1e-12, atol=1e-12)


def test_rope_and_rms_norm_backward_nan_and_inf_stay_in_their_rows():
    """A NaN / inf of token t reaches token t's outputs only (RoPE: its head's pair (i, i + D/2); the norm's backward:
    its row, through the row's sums); every other output is finite."""
    lib = load_native_kernels()
    t, n, d = 9, 3, 16
    gen = torch.Generator().manual_seed(2)
    cos, sin = _tables(t, d, seed=4)
    x = torch.randn(t, n * d, generator=gen)
    x[4, d + 3] = float("nan")                                 # token 4, head 1, i = 3
    got = _rope(lib, x, cos, sin, n)
    bad = torch.zeros_like(got, dtype=torch.bool)
    bad[1, 4, 3] = bad[1, 4, 3 + d // 2] = True
    assert torch.equal(got.isnan(), bad)
    dy = torch.randn(n, t, d, generator=gen)
    dy[2, 6, 10] = float("inf")                                # head 2, token 6, i = 10 = 2 + D/2
    gb = _rope_back(lib, dy, cos, sin, 1, 2)
    assert gb[:6].isfinite().all() and gb[7:].isfinite().all()
    assert (~gb[6].isfinite()).nonzero().flatten().tolist() == [d + 2, d + 10]
    xr = torch.randn(t, 33, generator=gen)
    w = torch.randn(33, generator=gen)
    dyr = torch.randn(t, 33, generator=gen)
    for row, col, v in ((2, 5, float("nan")), (7, 32, float("inf"))):
        xx = xr.clone()
        xx[row, col] = v
        out = _rms_back(lib, xx, w, 1e-6, dyr, residual=dyr)
        finite = out.isfinite()
        assert not finite[row].any() and finite[:row].all() and finite[row + 1:].all()


def test_rope_and_rms_norm_backward_bits_do_not_depend_on_threads_or_the_kernel_path(lib):
    from executorch.extension.pybindings import portable_lib

    before = lib.toolchain_kernel_threads()
    if before < 1:
        pytest.skip("no thread pool in this build")
    paths = [p for p in ("generic", "avx2", "avx_vnni", "avx512_vnni") if lib.toolchain_select_kernel_path(p.encode()) == 0]
    gen = torch.Generator().manual_seed(13)
    try:
        for t, n, d in [(256, 14, 64), (37, 3, 24)]:
            x = torch.randn(t, n * d, generator=gen)
            cos, sin = _tables(t, d, seed=t)
            dy = torch.randn(n + 2, t, d, generator=gen)
            xr, dyr, dy2, dy3, res = (torch.randn(t, 896, generator=gen) for _ in range(5))
            w = torch.randn(896, generator=gen)
            seen = []
            for k, path in [(1, p) for p in paths] + [(2, paths[0]), (2, paths[-1])]:
                portable_lib._unsafe_reset_threadpool(k)
                assert lib.toolchain_select_kernel_path(path.encode()) == 0
                got = torch.cat([_rope(lib, x, cos, sin, n).flatten(), _rope_back(lib, dy, cos, sin, 2, n).flatten(),
                                 _rms_back(lib, xr, w, 1e-6, dyr, dy2, dy3, res).flatten()])
                seen.append(got.view(torch.int32).clone())
            assert all(torch.equal(seen[0], s_) for s_ in seen[1:]), (t, n, d)
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def test_rope_and_rms_norm_backward_bad_arguments_are_refused():
    lib = load_native_kernels()
    z = torch.zeros(256)
    for t, n, d in [(0, 2, 4), (4, 0, 4), (4, 2, 3), (4, 2, 0)]:
        assert lib.toolchain_rope_train(_ptr(z), _ptr(z), _ptr(z), t, n, d, _ptr(z)) == -1
        assert lib.toolchain_rope_train_backward(_ptr(z), _ptr(z), _ptr(z), 4, 0, t, n, d, _ptr(z)) == -1
    for big_n, start, n in [(3, 2, 2), (3, -1, 2)]:                # the heads not within dy's N
        assert lib.toolchain_rope_train_backward(_ptr(z), _ptr(z), _ptr(z), big_n, start, 4, n, 4, _ptr(z)) == -1
    for t, d in [(0, 4), (4, 0), (-1, 4)]:
        assert lib.toolchain_rms_norm_backward(_ptr(z), _ptr(z), _ptr(z), None, None, None, t, d, ctypes.c_float(1e-6),
                                               _ptr(z)) == -1
