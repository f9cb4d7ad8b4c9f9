"""The native int4 kernel (toolchain/native/kernels.cpp, W4A8) against its definition on random shapes
and groups: odd row counts and widths, partial last groups, T = 1 (decode) and prefill tiles with a remainder.

The definition (quant.int4_linear_a8_reference): x quantized per row and group (`quantize_activations`),
exact integer sums isum_g = sum_k a_k (n_k - 8) per group, y = sum_g isum_g sw_g sa_g. The exact value is
computed here in float64 from the exact isum; the kernel's only rounding is in the float32 sum of the ng
group terms (one product sw * sa, one fused multiply-add per group, the 16-lane tree), bounded by
|err| <= gamma_(ng+6) * sum_g |isum_g sw_g sa_g|, gamma_k = k u / (1 - k u), u = 2^-24 (Higham, Accuracy
and Stability of Numerical Algorithms, 2nd ed., eq. 3.5; ng + 6 covers the chain, the tree and the
product). The integer part leaves no slack: a wrong nibble, column or activation shifts isum by a whole
sw * sa. The ExecuTorch registration is tested through the fused generation methods
(tests/export/test_generate_eval.py)."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

from toolchain.mesp.ops.quant import _unpack_int4, int4_linear_a8_reference, quantize, quantize_activations
from toolchain.mesp.kernels import load_native_kernels as load_kernels  # the table's C signatures set

U = 2.0 ** -24


def _quantize_partial(w: torch.Tensor, group: int):
    """int4 weights whose last group may be partial (i % group != 0): scales [o, ceil(i / group)]."""
    o, i = w.shape
    ng = -(-i // group)
    pad = torch.cat([w, torch.zeros(o, ng * group - i, dtype=w.dtype)], dim=1)
    qw = quantize(pad, "int4", group)
    return qw.q[:, :i // 2].contiguous(), qw.scale.contiguous()


def _call(lib, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    t, i = x.shape
    y = torch.empty(t, q.shape[0], dtype=torch.float32)
    rc = lib.toolchain_int4_linear_a8(ctypes.c_void_p(x.data_ptr()), t, i, ctypes.c_void_p(q.data_ptr()),
                                      ctypes.c_void_p(scales.data_ptr()), q.shape[0], scales.shape[1], group,
                                      ctypes.c_void_p(y.data_ptr()))
    assert rc == 0
    return y


def _kernel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    return _call(load_kernels(), x, q, scales, group)


def _exact(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int):
    """(y in float64 from the exact integer sums, the bound's sum of |terms|, ng)."""
    a, sa = quantize_activations(x, group)                                   # [T, ng, G], [T, ng]
    o, half = q.shape
    ng = scales.shape[1]
    n = F.pad(_unpack_int4(q, torch.float64) - 8, (0, ng * group - 2 * half)).reshape(o, ng, group)
    isum = torch.einsum("tgk,ogk->tog", a.double(), n)                       # exact integers
    terms = isum * scales.double()[None] * sa.double()[:, None, :]
    return terms.sum(-1), terms.abs().sum(-1), ng


SHAPES = [  # (T, o, i, group); groups of 32, 64 and 128 take the AVX-512 VNNI path where the host has it
    (1, 1, 2, 2), (1, 7, 10, 2), (2, 5, 34, 34), (3, 33, 128, 64), (5, 17, 96, 32), (1, 13, 100, 64),
    (4, 9, 70, 6), (7, 31, 258, 64), (9, 3, 64, 66), (1, 65, 896, 64), (6, 40, 200, 30), (32, 11, 130, 128),
    (1, 50, 2080, 32), (5, 19, 1030, 128), (2, 7, 4864, 64), (1, 3, 70, 64), (16, 21, 896, 64), (11, 5, 100, 32),
]


@pytest.mark.parametrize("t,o,i,group", SHAPES, ids=[f"T{t}-o{o}-i{i}-g{g}" for t, o, i, g in SHAPES])
def test_kernel_equals_the_definition_within_the_float32_summation_bound(t, o, i, group):
    gen = torch.Generator().manual_seed(o * 1000 + i + t)
    q, scales = _quantize_partial(torch.randn(o, i, generator=gen), group)
    x = torch.randn(t, i, generator=gen) * torch.exp2(torch.randint(-6, 7, (1, i), generator=gen).float())
    y = _kernel(x, q, scales, group)
    exact, magnitude, ng = _exact(x, q, scales, group)
    gamma = (ng + 6) * U / (1 - (ng + 6) * U)
    err = (y.double() - exact).abs()
    assert bool((err <= gamma * magnitude).all()), f"max err {float(err.max()):.3g}"
    # and the PyTorch op eager generation runs (the reference) agrees to the same bound
    ref = int4_linear_a8_reference(x, q, scales, group).double()
    assert bool(((ref - exact).abs() <= gamma * magnitude).all())


def test_activation_quantization_rounds_ties_to_even_and_keeps_zero_groups_zero():
    x = torch.tensor([[127.0, 0.5, 1.5, -2.5, 0.0, 0.0, 0.0, 0.0]])          # group 4: sa = 1, then 0
    a, sa = quantize_activations(x, 4)
    assert sa.tolist() == [[1.0, 0.0]]
    assert a.reshape(-1).tolist() == [127.0, 0.0, 2.0, -2.0, 0.0, 0.0, 0.0, 0.0]
    q = torch.full((3, 4), 0x9A, dtype=torch.uint8)                          # nibbles 9, 10: weights 1, 2
    y = _kernel(x, q, torch.ones(3, 2), 4)
    assert torch.equal(y, torch.full((1, 3), 127.0 * 1 + 0 * 2 + 2 * 1 + -2 * 2))


def test_rows_of_x_do_not_interact():
    """Each row of a prefill tile equals the same row alone (T = 1), bit for bit: tiles share the
    loaded weights, not the sums."""
    gen = torch.Generator().manual_seed(3)
    for group in (64, 30):
        q, scales = _quantize_partial(torch.randn(21, 192, generator=gen), group)
        x = torch.randn(11, 192, generator=gen)
        whole = _kernel(x, q, scales, group)
        for r in range(11):
            assert torch.equal(whole[r], _kernel(x[r:r + 1].clone(), q, scales, group)[0])


def test_the_vector_path_equals_the_generic_path_bit_for_bit(tmp_path):
    """The same source built separately without AVX-512 VNNI and run on its generic path (what a CPU without
    vector kernels runs) gives the same bits as this host's build on every path it has (the groups the vector
    paths take: 32, 64, 128, and a partial last group); tests/native/test_kernel_paths.py compares the paths
    within one library on more shapes."""
    from toolchain.native.build import KERNEL_SOURCE, compile_flags

    flags = [f for f in compile_flags() if f != "-march=native"]
    out = tmp_path / "libgeneric.so"
    done = subprocess.run(["g++", *flags, "-march=native", "-mno-avx512vnni", "-DTOOLCHAIN_NO_EXECUTORCH",
                           str(KERNEL_SOURCE), "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    generic = ctypes.CDLL(str(out))
    generic.toolchain_int4_linear_a8.restype = ctypes.c_int
    assert generic.toolchain_select_kernel_path(b"generic") == 0
    lib = load_kernels()
    before = lib.toolchain_kernel_path()
    try:
        for path in (b"generic", b"avx2", b"avx_vnni", b"avx512_vnni"):
            if lib.toolchain_select_kernel_path(path) == 0:
                _compare_with(generic)
    finally:
        assert lib.toolchain_select_kernel_path(before) == 0


def _compare_with(generic) -> None:
    gen = torch.Generator().manual_seed(11)
    # T >= 10 (groups of 32 / 64) and T >= 2 (groups of 128) take the broadcast path (rows in lanes)
    for t, o, i, group in [(1, 37, 896, 64), (6, 29, 4864, 64), (5, 23, 1024, 32), (3, 17, 1152, 128),
                           (2, 9, 1000, 64), (1, 5, 130, 32), (12, 37, 896, 64), (33, 21, 4864, 64),
                           (10, 19, 1000, 32), (2, 5, 130, 128), (17, 48, 1000, 128), (1, 520, 896, 64),
                           (3, 300, 2048, 32)]:   # (the last: rows split over the thread pool, where it has 2)
        q, scales = _quantize_partial(torch.randn(o, i, generator=gen), group)
        x = torch.randn(t, i, generator=gen)
        assert torch.equal(_kernel(x, q, scales, group), _call(generic, x, q, scales, group)), (t, o, i, group)
    # the activations' quantization on special values (the vector path quantizes whole groups of 16
    # columns 16 at a time): zero groups, a NaN or an inf in a group, subnormals, ties at the rounding
    q, scales = _quantize_partial(torch.randn(7, 256, generator=gen), 64)
    x = torch.randn(6, 256, generator=gen)
    x[0, :64] = 0.0
    x[1, 70] = float("nan")
    x[2, 130] = float("inf")
    x[3, 200:256] = 1e-42
    x[4, :64] = torch.arange(64) * 0.5 - 16                             # x / s lands on .5 ties
    x[5, 64:128] = -x[5, 64:128].abs() * 1e30
    for rows in (x, x.repeat(2, 1)):                                     # T = 6: tiles; T = 12: broadcast
        got, want = _kernel(rows, q, scales, 64), _call(generic, rows, q, scales, 64)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))        # bits: NaN rows too
        assert got[1].isnan().all() and not got[[0, 3, 4, 5]].isnan().any()


@pytest.mark.parametrize("i,ng,group", [(9, 1, 10), (10, 1, 3), (10, 2, 10), (10, 1, 0), (0, 0, 2)])
def test_bad_arguments_are_refused(i, ng, group):
    lib = load_kernels()
    x, y = torch.zeros(max(i, 1)), torch.zeros(4)
    q, s = torch.zeros(4, max(i // 2, 1), dtype=torch.uint8), torch.zeros(4, max(ng, 1))
    assert lib.toolchain_int4_linear_a8(x.data_ptr(), 1, i, q.data_ptr(), s.data_ptr(), 4, ng, group, y.data_ptr()) == -1


def test_the_library_is_cached_per_source_and_flags(tmp_path, monkeypatch):
    from toolchain.native import build

    monkeypatch.setenv("TOOLCHAIN_KERNEL_CACHE", str(tmp_path))
    first = build.kernel_library()
    assert first.is_file() and first.is_relative_to(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build.kernel_library() == first and first.stat().st_mtime_ns == mtime     # not rebuilt
    assert first.read_bytes()[:4] == b"\x7fELF"   # (not loaded: a second copy would register its kernel twice)
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".build-")]  # no temp file left
    import hashlib

    record = first.with_name(first.name + ".sha256")   # the build's sha256, recorded beside it
    assert record.read_text().strip() == hashlib.sha256(first.read_bytes()).hexdigest()


@pytest.mark.slow   # two real compiles (~25 s on this shared 2-core machine)
def test_a_damaged_cache_entry_is_rebuilt_by_the_compiler(tmp_path, monkeypatch):
    """tests/hostile/kernel_cases.py tries the damaged entries with the compiler replaced by a copy; here the
    real compiler runs again for a truncated entry and for a directory in its place."""
    import hashlib

    from toolchain.native import build

    monkeypatch.setenv("TOOLCHAIN_KERNEL_CACHE", str(tmp_path))
    lib = build.kernel_library()
    good = lib.read_bytes()
    os.truncate(lib, 4096)
    assert build.kernel_library() == lib and lib.read_bytes()[:4] == b"\x7fELF" and len(lib.read_bytes()) > 4096
    lib.unlink()
    lib.mkdir()
    assert build.kernel_library() == lib and lib.is_file()
    assert hashlib.sha256(lib.read_bytes()).hexdigest() == lib.with_name(lib.name + ".sha256").read_text().strip()
    assert len(lib.read_bytes()) == len(good)


def test_no_compiler_is_a_clear_error(tmp_path, monkeypatch):
    from toolchain.native import KernelUnavailable, build

    monkeypatch.setenv("TOOLCHAIN_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(KernelUnavailable, match="does not run"):
        build.kernel_library()


ATTENTION_SHAPES = [  # (H, Hk, C, S, D, pos): decode and prefill chunks, GQA / MQA / MHA, an empty cache,
    (14, 2, 1, 256, 64, 40), (4, 2, 5, 24, 8, 0), (3, 1, 3, 24, 12, 20), (14, 2, 32, 256, 64, 100),   # odd D
    (6, 3, 2, 10, 20, 9), (2, 2, 4, 16, 16, 14), (2, 1, 1, 8, 40, 8),                                 # a full cache
]


@pytest.mark.parametrize("h,hk,c,s,d,pos", ATTENTION_SHAPES, ids=[f"H{a[0]}-Hk{a[1]}-C{a[2]}-S{a[3]}-D{a[4]}-p{a[5]}"
                                                              for a in ATTENTION_SHAPES])
def test_attention_kernel_equals_the_reference(h, hk, c, s, d, pos):
    """toolchain_attention_decode against `attention_with_cache` (the stock methods' graph, its reference) in
    float64: both within float32 rounding of it. The kernel's cache rows >= pos are NaN: it never reads them
    (the stock graph masks their scores, so it gets finite stale rows there)."""
    from toolchain.mesp.decode import attention_with_cache

    gen = torch.Generator().manual_seed(h * 100 + c * 10 + d)
    q, k, v = torch.randn(h, c, d, generator=gen), torch.randn(hk, c, d, generator=gen), torch.randn(hk, c, d, generator=gen)
    kc, vc = torch.randn(hk, s, d, generator=gen), torch.randn(hk, s, d, generator=gen)
    kn, vn = kc.clone(), vc.clone()
    kn[:, pos:], vn[:, pos:] = float("nan"), float("nan")
    lib, out, scale = load_kernels(), torch.empty(c, h * d), d ** -0.5
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    assert lib.toolchain_attention_decode(ptr(q), ptr(k), ptr(v), ptr(kn), ptr(vn), h, hk, c, s, d, pos,
                                          ctypes.c_float(scale), ptr(out)) == 0
    exact = attention_with_cache(*(t.double() for t in (q, k, v, kc, vc)),
                                 torch.tensor([pos]), scale)
    ref = attention_with_cache(q, k, v, kc, vc, torch.tensor([pos]), scale)
    assert not out.isnan().any() and not ref.isnan().any()
    torch.testing.assert_close(out.double(), exact, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ref.double(), exact, rtol=2e-6, atol=2e-6)


# The small ops of the fused methods (mesp/decode_ops.py) against their references in float64: each kernel is
# within float32 rounding of the exact value, as the PyTorch reference eager generation runs is.
_ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731


def _close(got: torch.Tensor, exact: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert not got.isnan().any()
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol)
    torch.testing.assert_close(ref.double(), exact, rtol=tol, atol=tol)


@pytest.mark.parametrize("t,d", [(1, 896), (5, 37), (32, 64), (3, 1)])
def test_rms_norm_kernel_equals_the_reference(t, d):
    from toolchain.mesp.decode_ops import rms_norm_reference

    gen = torch.Generator().manual_seed(t * 100 + d)
    x, w = torch.randn(t, d, generator=gen) * 3, torch.randn(d, generator=gen)
    y = torch.empty(t, d)
    assert load_kernels().toolchain_rms_norm(_ptr(x), t, d, _ptr(w), ctypes.c_float(1e-6), _ptr(y)) == 0
    _close(y, rms_norm_reference(x.double(), w.double(), 1e-6), rms_norm_reference(x, w, 1e-6), 2e-6)


LORA_CASES = [  # (T, o, i, group, r, bias, lora, residual)
    (1, 65, 896, 64, 8, True, True, False), (3, 33, 128, 64, 5, False, True, True), (32, 40, 200, 30, 16, True, True, True),
    (2, 7, 70, 64, 1, True, False, True), (4, 9, 96, 32, 8, False, False, False), (1, 3, 4864, 64, 64, False, True, True),
]


@pytest.mark.parametrize("t,o,i,group,r,bias,lora,residual", LORA_CASES, ids=[f"case{n}" for n in range(len(LORA_CASES))])
def test_lora_linear_kernel_is_the_int4_kernel_plus_bias_lora_and_residual(t, o, i, group, r, bias, lora, residual):
    """residual + ((x W^T + bias) + s (x A^T) B^T): the W4A8 part is the int4 kernel's own bits (tested above
    against its definition), the rest within float32 rounding of float64, absent terms skipped."""
    from toolchain.mesp.decode_ops import lora_linear_a8_reference

    gen = torch.Generator().manual_seed(t * 1000 + o + i + r)
    q, scales = _quantize_partial(torch.randn(o, i, generator=gen), group)
    x = torch.randn(t, i, generator=gen)
    b_ = torch.randn(o, generator=gen) if bias else None
    a, b = (torch.randn(r, i, generator=gen) / i ** 0.5, torch.randn(o, r, generator=gen)) if lora else (None, None)
    res = torch.randn(t, o, generator=gen) if residual else None
    s = 2.0
    y = torch.empty(t, o)
    opt = lambda v: None if v is None else _ptr(v)  # noqa: E731
    assert load_kernels().toolchain_lora_linear_a8(_ptr(x), t, i, _ptr(q), _ptr(scales), o, scales.shape[1], group,
                                                   opt(b_), opt(a), opt(b), r if lora else 0, ctypes.c_float(s),
                                                   opt(res), _ptr(y)) == 0
    base = _kernel(x, q, scales, group).double()
    exact = base + (0 if b_ is None else b_.double())
    if lora:
        exact = exact + s * (x.double() @ a.double().T) @ b.double().T
    if res is not None:
        exact = res.double() + exact
    ref = lora_linear_a8_reference(x, q, scales, group, b_, a, b, s, res)
    _close(y, exact, ref, 1e-5)
    if not (bias or lora or residual):
        assert torch.equal(y, base.float())


@pytest.mark.parametrize("c,n,d,pos", [(1, 14, 64, 40), (32, 2, 64, 0), (3, 3, 12, 250), (2, 1, 2, 7)])
def test_rope_heads_kernel_equals_the_reference(c, n, d, pos):
    """Split into heads [n, C, D] and rotated at pos .. pos + C - 1, against `rope_forward` of the float32
    tables (transformers' rounding of cos / sin) in float64."""
    from toolchain.mesp.decode_ops import rope_heads_reference

    gen = torch.Generator().manual_seed(c * 100 + n + d)
    x = torch.randn(c, n * d, generator=gen)
    out = torch.empty(n, c, d)
    assert load_kernels().toolchain_rope_heads(_ptr(x), c, n, d, pos, ctypes.c_float(1e6), _ptr(out)) == 0
    p = torch.tensor([pos])
    _close(out, rope_heads_reference(x.double(), p, n, 1e6), rope_heads_reference(x, p, n, 1e6), 2e-6)


def test_swiglu_kernel_equals_the_reference():
    from toolchain.mesp.decode_ops import swiglu_reference

    gen = torch.Generator().manual_seed(5)
    g, u = torch.randn(3, 4864, generator=gen) * 4, torch.randn(3, 4864, generator=gen)
    out = torch.empty(3, 4864)
    assert load_kernels().toolchain_swiglu(_ptr(g), _ptr(u), g.numel(), _ptr(out)) == 0
    _close(out, swiglu_reference(g.double(), u.double()), swiglu_reference(g, u), 2e-6)


def test_the_small_kernels_refuse_bad_arguments():
    lib, z = load_kernels(), torch.zeros(64)
    assert lib.toolchain_rope_heads(_ptr(z), 1, 2, 3, 0, ctypes.c_float(1e4), _ptr(z)) == -1        # odd D
    assert lib.toolchain_rms_norm(_ptr(z), 1, 0, _ptr(z), ctypes.c_float(1e-6), _ptr(z)) == -1
    q, s = torch.zeros(2, 4, dtype=torch.uint8), torch.ones(2, 1)
    assert lib.toolchain_lora_linear_a8(_ptr(z), 1, 8, _ptr(q), _ptr(s), 2, 1, 8, None, _ptr(z), None, 4,
                                        ctypes.c_float(1.0), None, _ptr(z)) == -1                     # a without b


def test_lora_linear_rows_of_x_do_not_interact():
    """A tile's rows (B^T transposed, 16 outputs at a time) equal each row alone (T = 1, one output at a time)
    bit for bit: the same multiply-adds in the same order."""
    gen = torch.Generator().manual_seed(8)
    o, i, r = 37, 130, 7
    q, scales = _quantize_partial(torch.randn(o, i, generator=gen), 64)
    x, a, b = torch.randn(5, i, generator=gen), torch.randn(r, i, generator=gen), torch.randn(o, r, generator=gen)
    lib = load_kernels()

    def call(xs):
        y = torch.empty(xs.shape[0], o)
        assert lib.toolchain_lora_linear_a8(_ptr(xs), xs.shape[0], i, _ptr(q), _ptr(scales), o, scales.shape[1], 64,
                                            None, _ptr(a), _ptr(b), r, ctypes.c_float(0.5), None, _ptr(y)) == 0
        return y

    whole = call(x)
    for t in range(5):
        assert torch.equal(whole[t], call(x[t:t + 1].clone())[0])


def test_the_block_kernels_split_over_threads_without_changing_the_bits():
    """Attention (its heads) and SwiGLU (blocks of 1024 elements) run on ExecuTorch's thread pool when it has 2
    threads (portable_lib._unsafe_reset_threadpool, what --threads sets) and the call is large enough (2^20
    multiply-adds or elements); RMSNorm and the LoRA epilogue (rows of x), RoPE (tokens) and the LoRA's transposed
    copy of B (blocks of outputs) from 2^14 when the call has more than one row (a prefill chunk): a 0.5B prefill
    chunk's shapes, and decode / small ones that stay on the calling thread; the bits equal the 1-thread run's."""
    from executorch.extension.pybindings import portable_lib

    lib = load_kernels()
    before = lib.toolchain_kernel_threads()
    if before < 1:
        pytest.skip("no thread pool in this build")
    gen = torch.Generator().manual_seed(11)
    bits = lambda t: t.view(torch.int32).clone()  # noqa: E731

    def attention(h, hk, c, s, d, pos):
        q, k, v = torch.randn(h, c, d, generator=gen), torch.randn(hk, c, d, generator=gen), torch.randn(hk, c, d, generator=gen)
        kc, vc = torch.randn(hk, s, d, generator=gen), torch.randn(hk, s, d, generator=gen)
        out = torch.empty(c, h * d)

        def run():
            assert lib.toolchain_attention_decode(_ptr(q), _ptr(k), _ptr(v), _ptr(kc), _ptr(vc), h, hk, c, s, d, pos,
                                                  ctypes.c_float(d ** -0.5), _ptr(out)) == 0
            return bits(out)
        return run

    def rms(t, d):
        x, w, y = torch.randn(t, d, generator=gen), torch.randn(d, generator=gen), torch.empty(t, d)

        def run():
            assert lib.toolchain_rms_norm(_ptr(x), t, d, _ptr(w), ctypes.c_float(1e-6), _ptr(y)) == 0
            return bits(y)
        return run

    def swiglu(n):
        g, u, out = torch.randn(n, generator=gen) * 4, torch.randn(n, generator=gen), torch.empty(n)
        g[7] = float("nan")

        def run():
            assert lib.toolchain_swiglu(_ptr(g), _ptr(u), n, _ptr(out)) == 0
            return bits(out)
        return run

    def lora(t, o, i, r, bias, residual):
        q, scales = _quantize_partial(torch.randn(o, i, generator=gen), 64)
        x, a, b = torch.randn(t, i, generator=gen), torch.randn(r, i, generator=gen) / i ** 0.5, torch.randn(o, r, generator=gen)
        bb = torch.randn(o, generator=gen) if bias else None
        res = torch.randn(t, o, generator=gen) if residual else None
        y = torch.empty(t, o)
        opt = lambda v: None if v is None else _ptr(v)  # noqa: E731

        def run():
            assert lib.toolchain_lora_linear_a8(_ptr(x), t, i, _ptr(q), _ptr(scales), o, scales.shape[1], 64, opt(bb),
                                                _ptr(a), _ptr(b), r, ctypes.c_float(2.0), opt(res), _ptr(y)) == 0
            return bits(y)
        return run

    def rope(c, n, d, pos):
        x, out = torch.randn(c, n * d, generator=gen), torch.empty(n, c, d)

        def run():
            assert lib.toolchain_rope_heads(_ptr(x), c, n, d, pos, ctypes.c_float(1e6), _ptr(out)) == 0
            return bits(out)
        return run

    cases = {"attention prefill": attention(14, 2, 32, 256, 64, 32), "attention decode": attention(14, 2, 1, 256, 64, 200),
             "attention small": attention(3, 1, 3, 24, 12, 20), "rms_norm large": rms(1200, 896),
             "rms_norm prefill": rms(32, 896), "rms_norm small": rms(5, 37), "swiglu prefill": swiglu(32 * 4864 + 5),
             "swiglu small": swiglu(300), "rope q prefill": rope(32, 14, 64, 32), "rope k prefill": rope(32, 2, 64, 32),
             "rope odd": rope(37, 3, 128, 100), "rope decode": rope(1, 14, 64, 200),
             "lora prefill": lora(32, 4864, 896, 8, False, False), "lora q": lora(32, 896, 896, 8, True, False),
             "lora k": lora(32, 128, 896, 8, True, False), "lora 4 rows": lora(4, 896, 896, 8, True, True),
             "lora down": lora(32, 896, 4864, 16, False, True), "lora decode": lora(1, 4864, 896, 8, False, True),
             "lora decode rank 16": lora(1, 4864, 896, 16, True, True)}
    try:
        for name, run in cases.items():
            got = []
            for n in (1, 2, 1):
                portable_lib._unsafe_reset_threadpool(n)
                assert lib.toolchain_kernel_threads() == n
                got.append(run())
            assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2]), name
    finally:
        portable_lib._unsafe_reset_threadpool(before)
