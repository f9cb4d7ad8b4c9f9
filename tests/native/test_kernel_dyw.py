"""The transposed W4A8 kernel dX = dY W (`toolchain::int4_dyw_a8`, toolchain/native/kernels.cpp, "dX for
training"): its PyTorch reference (quant.int4_dyw_a8_reference) against an independent float64 formula, the C
entry against both, every x86 kernel path this CPU has bit-equal to the generic path, 1 and 2 threads bit-equal,
and the ExecuTorch op (a program calling it, run on the ExecuTorch runtime) equal to the C entry.

The definition (G = group; k-group g of column k: k // G; block b of n: n // G, nb = ceil(o / G)): W^T is
requantized to int8 with one scale per (k-group, block), swt[g, b] = max_{n in b} |scales[n, g]| / 15.875 (float32),
e[n, g] = scales[n, g] / swt[g, b] (float32; 0 where swt is 0), Wt8[n, k] = round-half-even(e[n, g] (nib[n, k] - 8))
in [-127, 127] (the product exact); dy is rounded once per row t and block b (sa = max |dy| / 127 in float32, NaN
where the block holds a NaN or an infinity, a = round-half-even(dy / sa) in [-127, 127], 0 where sa is 0 or dy / sa
is not a number); isum[t, b, k] = sum_{n in b} a[t, n] Wt8[n, k] exactly, c = sa[t, b] swt[g, b] (float32),
dX[t, k] = sum_b isum[t, b, k] c. The exact value is computed here with numpy: float32 quantization written out
element by element, the integer sums as int64 matrix products (no dequantized weight, no einsum), the block sum
in float64. The kernel rounds only in that block sum (one fused multiply-add per block, blocks in increasing
order): |err| <= gamma_(nb+6) sum_b |isum c|, gamma_k = k u / (1 - k u), u = 2^-24 (plus (nb + 6) 2^-150 for
subnormal results: tiny rows of dy). With one block (o <= G) there is no sum: kernel, reference and exact value
are equal. A wrong nibble, column, block or scale moves isum by a whole integer times sa, far outside the bound."""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest
import torch

from toolchain.mesp.kernels import load_native_kernels
from toolchain.mesp.ops.quant import int4_dyw_a8_reference
from x86_cpu import X86_PATHS, has_path

U = 2.0 ** -24
_ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731


def _weights(o: int, i: int, group: int, gen: torch.Generator, zero_scales: bool = False):
    """Random int4 bytes [o, i / 2] (every nibble) and scales [o, ceil(i / group)] of mixed magnitude and sign."""
    ng = -(-i // group)
    q = torch.randint(0, 256, (o, i // 2), generator=gen, dtype=torch.uint8)
    s = torch.randn(o, ng, generator=gen) * torch.exp2(torch.randint(-8, 4, (o, ng), generator=gen).float())
    if zero_scales:
        s[:, 0] = 0.0                                 # a whole k-group of zero scales: dX = 0 there
        s[o // 2, :] = 0.0                            # one output row n of W with zero scales
    return q, s


def _dy(t: int, o: int, gen: torch.Generator, special: bool) -> torch.Tensor:
    dy = torch.randn(t, o, generator=gen) * torch.exp2(torch.randint(-6, 7, (1, o), generator=gen).float())
    if special and t >= 4:
        dy[0, o // 3] = float("nan")                  # a NaN in a row: that row of dX is NaN
        dy[1, -1] = float("inf")                      # an infinity: inf / inf and 0 * inf make the row NaN
        dy[2] = 0.0                                   # a zero row: dX = 0
    if special and t >= 5:
        dy[4, 0], dy[4, -1] = -float("inf"), float("nan")   # both in one row: still one NaN (the same bits)
    return dy


def _call(lib, dy: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    t, o = dy.shape
    i = 2 * q.shape[1]
    dx = torch.full((t, i), 7.0)
    assert lib.toolchain_int4_dyw_a8(_ptr(dy), t, o, _ptr(q), _ptr(s), i, s.shape[1], group, _ptr(dx)) == 0
    return dx


def _exact(dy: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int):
    """(dX in float64 from the exact integer sums, sum_b |isum c| per output, nb), written from the definition."""
    dyn, qn, sn = dy.numpy(), q.numpy(), s.numpy()
    t, o = dyn.shape
    i = 2 * qn.shape[1]
    nib = np.empty((o, i), dtype=np.int64)
    nib[:, 0::2] = qn >> 4
    nib[:, 1::2] = qn & 15
    w = nib - 8                                                               # W's integers [o, i]
    kg = np.arange(i) // group                                                # the k-group of each column
    nb = -(-o // group)
    exact = np.zeros((t, i))
    mag = np.zeros((t, i))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for b in range(nb):
            n0, n1 = b * group, min(o, (b + 1) * group)
            swt = (np.max(np.abs(sn[n0:n1]), axis=0) / np.float32(15.875)).astype(np.float32)     # [ng]
            e = np.where(swt > 0, sn[n0:n1] / np.where(swt > 0, swt, np.float32(1)), np.float32(0))
            assert e.dtype == np.float32
            wt8 = np.clip(np.rint(e[:, kg].astype(np.float64) * w[n0:n1]), -127, 127).astype(np.int64)  # [nb', i]
            ub = dyn[:, n0:n1]
            sa = np.max(np.abs(ub), axis=1) / np.float32(127)                 # float32 [T]
            sa = np.where((~np.isfinite(ub)).any(axis=1), np.float32(np.nan), sa).astype(np.float32)
            r = np.rint(ub / sa[:, None])                                     # float32 division, ties to even
            a = np.where((sa[:, None] > 0) & ~np.isnan(r), np.clip(r, -127, 127), 0).astype(np.int64)
            isum = a @ wt8                                                    # exact int64 [T, i]
            c = (sa[:, None] * swt[kg][None, :]).astype(np.float32)           # float32 products
            assert c.dtype == np.float32
            term = isum.astype(np.float64) * c.astype(np.float64)
            exact += term
            mag += np.abs(term)
    return torch.from_numpy(exact), torch.from_numpy(mag), nb


def _within_bound(got: torch.Tensor, exact: torch.Tensor, mag: torch.Tensor, nb: int) -> None:
    gamma = (nb + 6) * U / (1 - (nb + 6) * U)
    finite = exact.isfinite()
    assert torch.equal(got.isnan(), ~finite), "NaN exactly where the definition has one"
    err = (got.double() - exact).abs()[finite]
    bound = (gamma * mag + (nb + 6) * 2.0 ** -150)[finite]   # + the absolute error of subnormal results
    assert bool((err <= bound).all()), f"max err {float((err - bound).max()):.3g} over the bound"


# (T, o, i, group): one block (o <= group), odd o, partial last k-groups and blocks, groups of 32 / 64 / 128 and
# others, T = 1, 2..9, >= 10.
SHAPES = [(1, 8, 16, 16), (3, 64, 64, 64), (4, 33, 70, 64), (2, 30, 100, 32), (5, 130, 96, 32), (7, 33, 70, 64),
          (1, 200, 256, 128), (12, 77, 130, 32), (17, 300, 192, 64), (9, 45, 34, 6), (6, 129, 258, 128),
          (10, 7, 12, 2), (11, 500, 200, 64)]


@pytest.mark.parametrize("t,o,i,group", SHAPES, ids=[f"T{t}-o{o}-i{i}-g{g}" for t, o, i, g in SHAPES])
def test_the_reference_and_the_kernel_equal_the_definition(t, o, i, group):
    gen = torch.Generator().manual_seed(31 * o + i + t)
    q, s = _weights(o, i, group, gen, zero_scales=o > 4)
    dy = _dy(t, o, gen, special=True)
    exact, mag, nb = _exact(dy, q, s, group)
    ref = int4_dyw_a8_reference(dy, q, s, group)
    if t >= 6:
        dy[5] *= 1e-38                                # tiny values: subnormal block scales sa (clamped rounding)
        exact, mag, nb = _exact(dy, q, s, group)
        ref = int4_dyw_a8_reference(dy, q, s, group)
    got = _call(load_native_kernels(), dy, q, s, group)
    _within_bound(ref, exact, mag, nb)
    _within_bound(got, exact, mag, nb)
    if t >= 4:
        assert got[:2].isnan().all() and (got[2] == 0).all()
    if t >= 5:
        assert got[4].isnan().all()
    finite = [r for r in range(t) if dy[r].isfinite().all()]
    if o > 4:
        assert (got[finite, :group] == 0).all()       # the k-group of zero scales (rows without NaN / inf)
    if nb == 1:                                       # no float sum: every result is one rounded product
        assert torch.equal(got.view(torch.int32)[finite], ref.view(torch.int32)[finite])
        assert torch.equal(got[finite].double(), exact[finite].float().double())


@pytest.mark.parametrize("o,i,group", [(96, 128, 32), (77, 130, 64), (130, 96, 128), (45, 34, 6)])
def test_a_one_hot_row_gives_w_within_half_a_step_of_its_requantization(lib, o, i, group):
    """dy = the identity (row n: 1 at n) gives row n of dX = W's row n requantized (Wt8 swt): within half an int8
    step swt[g, b] / 2 of the dequantized int4 W (plus float32 rounding), on every path this CPU has; a wrong
    nibble, column, scale, block or table is a whole int4 step off."""
    from toolchain.mesp.ops.quant import QuantWeight, dequantize

    gen = torch.Generator().manual_seed(o + i)
    q, s = _weights(o, i, group, gen)
    w = dequantize(QuantWeight(q, s, 4)) if i % group == 0 else None
    if w is None:                                     # a partial last k-group: dequantized by hand
        from toolchain.mesp.ops.quant import _unpack_int4
        w = (_unpack_int4(q, torch.float32) - 8) * s.repeat_interleave(group, 1)[:, :i]
    nb = -(-o // group)
    swt = torch.nn.functional.pad(s.abs(), (0, 0, 0, nb * group - o)).reshape(nb, group, -1).amax(1) / 15.875
    step = swt.repeat_interleave(group, 0)[:o].repeat_interleave(group, 1)[:, :i]       # [o, i]: swt of (n, k)
    for path in ("generic", *X86_PATHS):
        if not has_path(path):
            continue
        assert lib.toolchain_select_kernel_path(path.encode()) == 0
        got = _call(lib, torch.eye(o), q, s, group)
        assert bool(((got - w).abs() <= step * (0.5 + 1e-5) + 1e-30).all()), path
        assert float((got - w).abs().max()) > 0 or o < 8   # the requantization is not the identity
    lib.toolchain_select_kernel_path(b"generic")


def test_bad_arguments_are_refused(lib):
    dy, q, s, dx = torch.zeros(2, 4), torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 1), torch.zeros(2, 16)
    for i, ng, group in [(15, 1, 16), (16, 2, 16), (16, 1, 15), (16, 16, 1), (0, 0, 16)]:
        assert lib.toolchain_int4_dyw_a8(_ptr(dy), 2, 4, _ptr(q), _ptr(s), i, ng, group, _ptr(dx)) == -1
    assert lib.toolchain_int4_dyw_a8(_ptr(dy), -1, 4, _ptr(q), _ptr(s), 16, 1, 16, _ptr(dx)) == -1
    assert lib.toolchain_int4_dyw_a8(_ptr(dy), 2, 0, _ptr(q), _ptr(s), 16, 1, 16, _ptr(dx)) == 0
    assert (dx == 0).all()                            # an empty reduction (o = 0)


# (T, o, i, group) for the kernel paths: T = 1, 2..9 (the row tiles), >= 10 and 256 (the broadcast kernels, row
# tiles of dy); groups of 32 / 64 / 128 (the vector paths' fused rounding and row kernels) and others (the generic
# rows); odd o (a padded last n), partial last blocks (o % group) and k-groups (i % group), i / 2 odd; large enough
# calls to split over threads.
PATH_SHAPES = [(1, 65, 896, 64), (1, 7, 130, 32), (1, 300, 70, 128), (2, 33, 128, 64), (3, 64, 64, 64),
               (4, 17, 96, 32), (5, 129, 258, 128), (6, 97, 1000, 64), (7, 31, 130, 32), (8, 200, 192, 128),
               (9, 45, 66, 64), (10, 19, 100, 32), (11, 130, 70, 64), (12, 256, 384, 128), (16, 896, 128, 64),
               (17, 77, 30, 6), (23, 33, 34, 2), (33, 500, 200, 64), (64, 128, 896, 64), (256, 160, 192, 64),
               (256, 33, 258, 32), (40, 1000, 130, 128), (5, 9, 12, 10)]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 paths (arm64: check_kernel_arm64.sh)")
@pytest.mark.parametrize("path", X86_PATHS)
def test_every_x86_path_gives_the_generic_bits(lib, path):
    """int4_dyw_a8 through `path` equals the generic path bit for bit on every shape above, with NaN / inf / zero
    rows of dy and zero scales; a path this CPU lacks is refused (-2) instead."""
    if not has_path(path):
        assert lib.toolchain_select_kernel_path(path.encode()) == -2
        assert path in lib.toolchain_kernel_path_error().decode()
        return
    for n, (t, o, i, group) in enumerate(PATH_SHAPES):
        gen = torch.Generator().manual_seed(100 * n + t)
        q, s = _weights(o, i, group, gen, zero_scales=n % 3 == 0 and o > 4)
        dy = _dy(t, o, gen, special=n % 2 == 0)
        if n % 4 == 1:                                # a row of exact ties: |u| / sa = k + 1/2 (scales of 1)
            s = torch.ones_like(s)
            dy[0] = torch.randint(-253, 254, (o,), generator=gen).float() / 2
            dy[0, ::group] = 127.0
        if n % 4 == 3:                                # a row of tiny values: subnormal block scales sa
            dy[-1] = dy[-1] * 1e-38
        got = {}
        for p in ("generic", path):
            assert lib.toolchain_select_kernel_path(p.encode()) == 0 and lib.toolchain_kernel_path().decode() == p
            got[p] = _call(lib, dy, q, s, group)
        assert torch.equal(got[path].view(torch.int32), got["generic"].view(torch.int32)), (path, t, o, i, group)
        if n % 2 == 0 and t >= 4:
            nan_rows = [0, 1, 4] if t >= 5 else [0, 1]
            assert got[path].isnan().all(1).nonzero().flatten().tolist() == nan_rows
            assert not got[path][[r for r in range(t) if r not in nan_rows]].isnan().any()


@pytest.mark.parametrize("path", ("generic", *X86_PATHS))
def test_threads_and_row_tiles_do_not_change_the_bits(lib, path):
    """With ExecuTorch's thread pool at 2 threads the (row tile, k-groups) tasks are split over it; the bits equal
    the 1-thread run's; and a row of dy gives the same bits alone as inside a call of 256 rows."""
    from executorch.extension.pybindings import portable_lib

    if not has_path(path):
        assert lib.toolchain_select_kernel_path(path.encode()) == -2
        return
    assert lib.toolchain_select_kernel_path(path.encode()) == 0
    before = lib.toolchain_kernel_threads()
    gen = torch.Generator().manual_seed(9)
    try:
        for t, o, i, group in [(256, 896, 256, 64), (12, 1000, 640, 32), (3, 300, 2048, 128), (64, 77, 896, 64),
                               (2, 4864, 128, 64), (100, 128, 896, 64)]:
            q, s = _weights(o, i, group, gen)
            dy = _dy(t, o, gen, special=True)
            got = []
            for n in (1, 2):
                portable_lib._unsafe_reset_threadpool(n)
                assert lib.toolchain_kernel_threads() == n
                got.append(_call(lib, dy, q, s, group))
            assert torch.equal(got[0].view(torch.int32), got[1].view(torch.int32)), (path, t, o, i, group)
            for r in (0, t // 2, t - 1):
                alone = _call(lib, dy[r:r + 1].clone(), q, s, group)
                assert torch.equal(alone.view(torch.int32)[0], got[0].view(torch.int32)[r]), (path, t, o, i, r)
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def test_the_executorch_op_equals_the_c_entry(tmp_path):
    """A program calling `toolchain::int4_dyw_a8` (torch.export -> to_edge -> to_executorch), run on the ExecuTorch
    runtime with the native kernels registered, gives the C entry's bits (dy of 3 dims: leading dims flattened)."""
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    import toolchain.mesp  # noqa: F401  (registers the toolchain ops with PyTorch)

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(4)
    o, i, group = 200, 130, 64
    q, s = _weights(o, i, group, gen, zero_scales=True)
    dy = _dy(12, o, gen, special=True).reshape(3, 4, o)

    class Dyw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("q", q)
            self.register_buffer("s", s)

        def forward(self, d):
            return torch.ops.toolchain.int4_dyw_a8(d, self.q, self.s, group)

    program = to_edge(torch.export.export(Dyw(), (dy,))).to_executorch()
    pte = tmp_path / "dyw.pte"
    pte.write_bytes(program.buffer)
    method = Runtime.get().load_program(pte).load_method("forward")
    got = method.execute([dy])[0]
    want = _call(lib, dy.reshape(12, o), q, s, group).reshape(3, 4, i)
    assert got.shape == (3, 4, i)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # and eager (the reference, what the op runs in PyTorch) is within the bound of the same values
    exact, mag, nb = _exact(dy.reshape(12, o), q, s, group)
    _within_bound(torch.ops.toolchain.int4_dyw_a8(dy, q, s, group).reshape(12, i), exact, mag, nb)


# toolchain::int4_dyw_a8_acc (out = acc + dy W, one float32 addition per element after the block chain, acc the first
# operand): the bits of acc + int4_dyw_a8's result, the addition written here as torch's float32 add.

def _call_acc(lib, dy: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int, acc: torch.Tensor | None,
              in_place: bool = False, row0: int = 0) -> torch.Tensor:
    """toolchain_int4_dyw_a8_acc on rows row0 .. row0 + o - 1 of (q, s) (o = dy's width), in place: acc is dx."""
    t, o = dy.shape
    i = 2 * q.shape[1]
    assert row0 + o <= q.shape[0]
    dx = acc.clone() if in_place else torch.full((t, i), 7.0)
    add = None if acc is None else _ptr(dx if in_place else acc)
    assert lib.toolchain_int4_dyw_a8_acc(_ptr(dy), t, o, _ptr(q), _ptr(s), i, s.shape[1], group, row0, add,
                                         _ptr(dx)) == 0
    return dx


def _acc(t: int, i: int, gen: torch.Generator, special: bool) -> torch.Tensor:
    """A gradient already held [T, i] of mixed magnitudes (with a NaN, an infinity and a negative zero: their sums
    with dy W are what IEEE addition makes of them)."""
    acc = torch.randn(t, i, generator=gen) * torch.exp2(torch.randint(-10, 8, (t, i), generator=gen).float())
    if special and t >= 3:
        acc[t - 1, 0], acc[t - 1, i // 2], acc[t - 2, -1] = float("nan"), float("inf"), -0.0
    return acc


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits, any NaN counted equal to any NaN (which of two NaN operands an addition keeps is the
    compiler's choice; NaN positions still have to agree)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(torch.int32)[~nan], b.view(torch.int32)[~nan])


@pytest.mark.parametrize("t,o,i,group", SHAPES, ids=[f"T{t}-o{o}-i{i}-g{g}" for t, o, i, g in SHAPES])
def test_the_acc_variant_and_its_reference_equal_acc_plus_the_definition(t, o, i, group):
    """int4_dyw_a8_acc = acc + dy W within the product's bound plus one rounding of the addition (against the float64
    exact value), its reference too; and the kernel's bits are acc + int4_dyw_a8's, in place (acc = dx) too."""
    from toolchain.mesp.ops.quant import int4_dyw_a8_acc_reference

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(7 * o + i + t)
    q, s = _weights(o, i, group, gen, zero_scales=o > 4)
    dy = _dy(t, o, gen, special=True)
    acc = _acc(t, i, gen, special=True)
    exact, mag, nb = _exact(dy, q, s, group)
    want = acc.double() + exact
    gamma = (nb + 6) * U / (1 - (nb + 6) * U)
    bound = gamma * mag + (nb + 6) * 2.0 ** -150 + 2 * U * want.abs()
    for got in (_call_acc(lib, dy, q, s, group, acc), int4_dyw_a8_acc_reference(dy, q, s, group, 0, acc)):
        assert torch.equal(got.isnan(), want.isnan())
        finite = want.isfinite()
        assert torch.equal(got[~finite & ~want.isnan()], want[~finite & ~want.isnan()].float())   # inf + finite
        assert bool(((got.double() - want).abs()[finite] <= bound[finite]).all())
    plain = _call(lib, dy, q, s, group)
    assert _bits_equal(_call_acc(lib, dy, q, s, group, acc), acc + plain)
    assert _bits_equal(_call_acc(lib, dy, q, s, group, acc, in_place=True), acc + plain)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 paths (arm64: check_kernel_arm64.sh)")
@pytest.mark.parametrize("path", ("generic", *X86_PATHS))
def test_the_acc_variant_is_acc_plus_the_plain_bits_on_every_path_and_thread_count(lib, path):
    """On every x86 path this CPU has and at 1 and 2 threads, int4_dyw_a8_acc's bits are acc + int4_dyw_a8's (the
    path's own, which test_every_x86_path_gives_the_generic_bits ties to the generic ones), on every shape of
    PATH_SHAPES (partial panels nk < 16 included) with NaN / inf / zero rows of dy and of acc."""
    from executorch.extension.pybindings import portable_lib

    if not has_path(path):
        assert lib.toolchain_select_kernel_path(path.encode()) == -2
        return
    assert lib.toolchain_select_kernel_path(path.encode()) == 0
    before = lib.toolchain_kernel_threads()
    try:
        for n, (t, o, i, group) in enumerate(PATH_SHAPES + [(256, 896, 256, 64), (2, 4864, 128, 64)]):
            gen = torch.Generator().manual_seed(300 + n)
            q, s = _weights(o, i, group, gen, zero_scales=n % 3 == 0 and o > 4)
            dy = _dy(t, o, gen, special=n % 2 == 0)
            acc = _acc(t, i, gen, special=n % 2 == 1)
            got = []
            for threads in (1, 2):
                portable_lib._unsafe_reset_threadpool(threads)
                plain = _call(lib, dy, q, s, group)
                got.append(_call_acc(lib, dy, q, s, group, acc))
                assert _bits_equal(got[-1], acc + plain), (path, threads, t, o, i, group)
                assert _bits_equal(_call_acc(lib, dy, q, s, group, acc, in_place=True), got[-1])
                # rows read in place: W's rows [row0, row0 + o) inside a taller W give the bits of a copy of them
                qe, se = _weights(5, i, group, gen)                  # 3 rows above W's, 2 below
                qt, st = torch.cat([qe[:3], q, qe[3:]]), torch.cat([se[:3] * 9, s, se[3:]])
                assert _bits_equal(_call_acc(lib, dy, qt, st, group, acc, row0=3), got[-1])
                assert torch.equal(_call_acc(lib, dy, qt, st, group, None, row0=3).view(torch.int32),
                                   plain.view(torch.int32))
            assert torch.equal(got[0].view(torch.int32), got[1].view(torch.int32)), (path, t, o, i, group)
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def test_the_acc_variant_refuses_bad_arguments(lib):
    dy, q, s, dx = torch.zeros(2, 4), torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 1), torch.zeros(2, 16)
    acc = torch.full((2, 16), -3.0)
    assert lib.toolchain_int4_dyw_a8_acc(_ptr(dy), 2, 4, _ptr(q), _ptr(s), 16, 1, 16, -1, _ptr(acc), _ptr(dx)) == -1
    assert lib.toolchain_int4_dyw_a8_acc(_ptr(dy), 2, 4, _ptr(q), _ptr(s), 15, 1, 16, 0, _ptr(acc), _ptr(dx)) == -1
    assert lib.toolchain_int4_dyw_a8_acc(_ptr(dy), 2, 0, _ptr(q), _ptr(s), 16, 1, 16, 0, _ptr(acc), _ptr(dx)) == 0
    assert (dx == -3.0).all()                         # an empty reduction (o = 0): acc + 0


def test_the_executorch_acc_op_equals_the_c_entry(tmp_path):
    """A program calling `toolchain::int4_dyw_a8_acc` (dy of 3 dims, acc of dy W's shape), run on the ExecuTorch
    runtime, gives the C entry's bits, W's rows read at an offset (row0) and without acc too."""
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    import toolchain.mesp  # noqa: F401  (registers the toolchain ops with PyTorch)

    lib = load_native_kernels()
    gen = torch.Generator().manual_seed(5)
    o, i, group = 200, 130, 64
    q, s = _weights(o, i, group, gen, zero_scales=True)
    qe, se = _weights(5, i, group, gen)
    qt, st = torch.cat([qe[:3], q, qe[3:]]), torch.cat([se[:3], s, se[3:]])
    dy = _dy(12, o, gen, special=True).reshape(3, 4, o)
    acc = _acc(12, i, gen, special=True).reshape(3, 4, i)

    class Dyw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("q", qt)
            self.register_buffer("s", st)

        def forward(self, d, a):   # rows 3 .. 3 + o - 1 of a taller W: in place; with acc and without
            return (torch.ops.toolchain.int4_dyw_a8_acc(d, self.q, self.s, group, 3, a),
                    torch.ops.toolchain.int4_dyw_a8_acc(d, self.q, self.s, group, 3, None))

    program = to_edge(torch.export.export(Dyw(), (dy, acc))).to_executorch()
    pte = tmp_path / "dyw_acc.pte"
    pte.write_bytes(program.buffer)
    method = Runtime.get().load_program(pte).load_method("forward")
    got, got_plain = method.execute([dy, acc])
    want = _call_acc(lib, dy.reshape(12, o), q, s, group, acc.reshape(12, i)).reshape(3, 4, i)
    assert got.shape == (3, 4, i)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(got_plain.view(torch.int32), _call(lib, dy.reshape(12, o), q, s, group).reshape(3, 4, i)
                       .view(torch.int32))
    # eager (the reference, what the op runs in PyTorch) is within the bound of acc + the exact value, as the kernel
    ref = torch.ops.toolchain.int4_dyw_a8_acc(dy, qt, st, group, 3, acc).reshape(12, i)
    exact, mag, nb = _exact(dy.reshape(12, o), q, s, group)
    want = acc.reshape(12, i).double() + exact
    bound = (nb + 6) * U / (1 - (nb + 6) * U) * mag + (nb + 6) * 2.0 ** -150 + 2 * U * want.abs()
    for r in (ref, got.reshape(12, i)):
        assert torch.equal(r.isnan(), want.isnan())
        fin = want.isfinite()
        assert bool(((r.double() - want).abs()[fin] <= bound[fin]).all())
