"""Test cases for the arm64 build of the int4 kernel (scripts/check_kernel_arm64.sh), with this host's
(x86-64) kernel output: `python tests/native/make_arm64_cases.py OUT [--seed S] [--cases N]`.

Shapes: the fixed ones of tests/native/test_kernels.py, ARM64_SHAPES (groups of 32, 64, 96 and 128 at
T = 1..10, 13, 32) and POOL_SHAPES (calls whose weight rows the kernel splits over a thread pool), then random ones: T = 1 (decode), 2..9 and >= 10, odd and even o, even i, groups of
32 / 64 / 96 / 128 / 256 (the arm64 vector paths) or any even 2..128 (the generic one) with partial last groups
(and groups wider than i). Every 7th case has rows of x with a NaN and / or an infinity (and one all-zero row);
every 5th a row of halves whose group scales are exactly 1, so x / sa ties (rounded to even). Half the
weights are the repo's `quantize` of a random matrix (padded to whole groups, as the x86 test does), half
uniformly random bytes (every nibble, -8 included) with random scales of both signs; x is N(0, 1) times a power of two per case, some cases with a per-column power of two.
y is computed by `toolchain_int4_linear_a8` of `toolchain.native.load_kernels()` (built here with
-march=native; the path it runs is named in the summary line).

Binary file, little-endian: b"TCI4CAS1", int64 count, then per case int64 T, o, i, group, ng, followed by
x f32 [T, i], q u8 [o, i/2], scales f32 [o, ng], y f32 [T, o] (row-major). Read by
tests/native/arm64_driver.cpp.

--dyw OUT2: cases of `toolchain_int4_dyw_a8` (dx = dy W, kernels.cpp's "dX for training") in b"TCDYCAS1" files of
the same form, dy f32 [T, o] in x's place and dx f32 [T, i] in y's: DYW_SHAPES (T = 1, 2..9, >= 10, groups of
32 / 64 / 96 / 128 and others, odd o, partial last blocks and k-groups, calls large enough for the thread pool)
and --dyw-cases random ones; every 7th with NaN / inf rows of dy (and a zero row), every 5th with a row of ties
(scales 1, |u| / sa = k + 1/2), every 4th with a k-group of zero scales.
"""

from __future__ import annotations

import argparse
import ctypes
import struct
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_kernels import SHAPES, _kernel, _quantize_partial  # noqa: E402

from toolchain.native import kernel_path  # noqa: E402

MAGIC = b"TCI4CAS1"


# Shapes for the arm64 vector paths (groups whose byte count is a multiple of 16: 32, 64, 96, 128 columns):
# T = 1 (decode), 2..9 (dotprod tiles of 3, i8mm pairs and an odd last row), >= 10 (the x86 broadcast path),
# whole and partial last groups, partial last 16 bytes, o odd and even (i8mm's pairs of weight rows).
ARM64_SHAPES = [
    (t, o, i, g)
    for g, i, o in ((32, 896, 7), (64, 200, 6), (128, 1030, 5), (32, 70, 3), (128, 130, 4), (96, 260, 9))
    for t in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 32)
] + [(1, 33, 4864, 64), (2, 2, 32, 32), (3, 1, 2, 32), (11, 16, 1024, 128), (1, 17, 2080, 32), (4, 9, 96, 32)]
# Calls large enough that kernels.cpp splits their weight rows over a thread pool (o >= 32 and T o i >= 2^18; the
# pooled build of scripts/check_kernel_arm64.sh): chunks of 16 rows, an odd or short last chunk, T odd and even.
POOL_SHAPES = [(1, 64, 4864, 64), (2, 40, 4864, 128), (9, 45, 896, 32), (32, 33, 640, 64), (13, 37, 1030, 128),
               (3, 48, 2080, 96)]


def random_shape(rng: np.random.Generator) -> tuple[int, int, int, int]:
    r = rng.random()
    if r < 0.3:
        t = 1
    elif r < 0.65:
        t = int(rng.integers(2, 10))          # 2..9: tiles, pairs and a remainder
    else:
        t = int(rng.integers(10, 41))         # >= 10
    o = int(rng.integers(1, 48)) | (1 if rng.random() < 0.5 else 0)   # odd half the time
    if rng.random() < 0.7:
        group = int(rng.choice([32, 64, 96, 128, 256]))              # the arm64 vector paths
    else:
        group = 2 * int(rng.integers(1, 65))  # 2..128, even (the generic path)
    r = rng.random()
    if r < 0.15:
        i = 2 * int(rng.integers(1, group // 2 + 1))                 # one group, maybe partial (i <= group)
    elif r < 0.4:
        i = group * int(rng.integers(1, max(2, 640 // group) + 1))   # whole groups
    else:
        i = 2 * int(rng.integers(1, 321))                            # anything even up to 640
    return t, o, i, group


def make_case(t: int, o: int, i: int, group: int, rng: np.random.Generator, quantized: bool,
              nonfinite: bool = False, ties: bool = False):
    ng = -(-i // group)
    if quantized:
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        q, scales = _quantize_partial(torch.randn(o, i, generator=gen), group)
    else:
        q = torch.from_numpy(rng.integers(0, 256, size=(o, i // 2), dtype=np.uint8))
        s = np.exp2(rng.uniform(-12, 2, size=(o, ng))) * rng.choice([-1.0, 1.0], size=(o, ng))
        scales = torch.from_numpy(s.astype(np.float32))
    x = rng.standard_normal((t, i)) * 2.0 ** int(rng.integers(-6, 7))
    if rng.random() < 0.3:
        x = x * np.exp2(rng.integers(-10, 11, size=(1, i)))
    if ties and t > 0:   # a row whose group scales are exactly 1 (127 in every group) and whose values are
        row = int(rng.integers(0, t))        # halves: x / sa = k + 1/2, rounding ties (to even)
        x[row] = rng.integers(-253, 254, size=i) / 2.0
        x[row, ::group] = 127.0
    if nonfinite:   # some rows of x with a NaN, an infinity or both; one all-zero row
        for t_ in rng.choice(t, size=max(1, t // 3), replace=False):
            k = rng.integers(0, i, size=int(rng.integers(1, 3)))
            x[t_, k] = rng.choice([np.nan, np.inf, -np.inf], size=k.size)
        if t > 1:
            x[int(rng.integers(0, t))] = 0.0
    x = torch.from_numpy(x.astype(np.float32))
    y = _kernel(x, q.contiguous(), scales.contiguous(), group)
    return t, o, i, group, ng, x, q, scales, y


DYW_MAGIC = b"TCDYCAS1"
# (T, o, i, group): the arm64 vector paths (groups of 32 / 64 / 96 / 128: NEON rounding, the int4 row kernels), the
# generic rows (others), odd o, partial last blocks of n and k-groups; the last ones large enough that kernels.cpp
# splits them over a thread pool (T o i >= 2^18).
DYW_SHAPES = [
    (t, o, i, g)
    for g, o, i in ((32, 70, 96), (64, 129, 130), (128, 300, 256), (96, 200, 192), (64, 64, 64))
    for t in (1, 2, 3, 5, 8, 9, 10, 13)
] + [(4, 33, 34, 2), (6, 45, 70, 6), (3, 7, 12, 10), (11, 31, 66, 30),
     (32, 300, 640, 64), (17, 257, 384, 128), (40, 96, 512, 32), (64, 130, 258, 64)]


def make_dyw_case(t: int, o: int, i: int, group: int, rng: np.random.Generator, nonfinite: bool, ties: bool,
                  zero_group: bool, lib):
    ng = -(-i // group)
    q = torch.from_numpy(rng.integers(0, 256, size=(o, i // 2), dtype=np.uint8))
    s = np.exp2(rng.uniform(-8, 2, size=(o, ng))) * rng.choice([-1.0, 1.0], size=(o, ng))
    dy = rng.standard_normal((t, o)) * 2.0 ** int(rng.integers(-6, 7))
    if ties:                                   # a row whose block scales are exactly 1 and whose values are halves
        s[:] = 1.0
        row = int(rng.integers(0, t))
        dy[row] = rng.integers(-253, 254, size=o) / 2.0
        dy[row, ::group] = 127.0
    if zero_group:
        s[:, int(rng.integers(0, ng))] = 0.0
    if nonfinite:
        for t_ in rng.choice(t, size=max(1, t // 3), replace=False):
            n = rng.integers(0, o, size=int(rng.integers(1, 3)))
            dy[t_, n] = rng.choice([np.nan, np.inf, -np.inf], size=n.size)
        if t > 1:
            dy[int(rng.integers(0, t))] = 0.0
    dy = torch.from_numpy(dy.astype(np.float32))
    scales = torch.from_numpy(s.astype(np.float32))
    dx = torch.empty(t, i)
    ptr = lambda x: ctypes.c_void_p(x.data_ptr())  # noqa: E731
    assert lib.toolchain_int4_dyw_a8(ptr(dy), t, o, ptr(q), ptr(scales), i, ng, group, ptr(dx)) == 0
    return t, o, i, group, ng, dy, q, scales, dx


def random_dyw_shape(rng: np.random.Generator) -> tuple[int, int, int, int]:
    r = rng.random()
    t = 1 if r < 0.2 else int(rng.integers(2, 10)) if r < 0.55 else int(rng.integers(10, 41))
    group = int(rng.choice([32, 64, 96, 128])) if rng.random() < 0.7 else 2 * int(rng.integers(1, 65))
    o = int(rng.integers(1, 400))
    i = 2 * int(rng.integers(1, 161))
    return t, o, i, group


def write_dyw(out: Path, shapes, rng: np.random.Generator) -> int:
    from toolchain.mesp.kernels import load_native_kernels

    lib = load_native_kernels()
    macs = 0
    with open(out, "wb") as f:
        f.write(DYW_MAGIC + struct.pack("<q", len(shapes)))
        for k, (t, o, i, group) in enumerate(shapes):
            t, o, i, group, ng, dy, q, scales, dx = make_dyw_case(t, o, i, group, rng, nonfinite=k % 7 == 3,
                                                                  ties=k % 5 == 1, zero_group=k % 4 == 2, lib=lib)
            f.write(struct.pack("<5q", t, o, i, group, ng))
            for a, dt in ((dy, np.float32), (q, np.uint8), (scales, np.float32), (dx, np.float32)):
                f.write(np.ascontiguousarray(a.numpy(), dtype=np.dtype(dt).newbyteorder("<")).tobytes())
            macs += t * o * i
    return macs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--cases", type=int, default=300, help="random cases besides the fixed shapes")
    ap.add_argument("--dyw", type=Path, default=None, help="also write int4_dyw_a8 cases here")
    ap.add_argument("--dyw-cases", type=int, default=100, help="random dyw cases besides DYW_SHAPES")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    fixed = list(SHAPES) + ARM64_SHAPES + POOL_SHAPES
    shapes = fixed + [random_shape(rng) for _ in range(args.cases)]
    macs = 0
    with open(args.out, "wb") as f:
        f.write(MAGIC + struct.pack("<q", len(shapes)))
        for k, (t, o, i, group) in enumerate(shapes):
            t, o, i, group, ng, x, q, scales, y = make_case(t, o, i, group, rng, quantized=k % 2 == 0,
                                                            nonfinite=k % 7 == 3, ties=k % 5 == 1)
            assert q.shape == (o, i // 2) and scales.shape == (o, ng) and y.shape == (t, o)
            f.write(struct.pack("<5q", t, o, i, group, ng))
            for a, dt in ((x, np.float32), (q, np.uint8), (scales, np.float32), (y, np.float32)):
                f.write(np.ascontiguousarray(a.numpy(), dtype=np.dtype(dt).newbyteorder("<")).tobytes())
            macs += t * o * i
    print(f"cases: {len(shapes)} ({len(fixed)} fixed + {args.cases} random, seed {args.seed}; every 7th with NaN / inf "
          f"rows, every 5th with a row of ties), "
          f"{macs / 1e6:.1f} M multiply-adds; x86 output from the host kernel ({kernel_path()} path)")
    if args.dyw is not None:
        drng = np.random.default_rng(args.seed + 1)
        dshapes = DYW_SHAPES + [random_dyw_shape(drng) for _ in range(args.dyw_cases)]
        dmacs = write_dyw(args.dyw, dshapes, drng)
        print(f"dyw cases: {len(dshapes)} ({len(DYW_SHAPES)} fixed + {args.dyw_cases} random, seed {args.seed + 1}; "
              f"every 7th with NaN / inf rows, every 5th with a row of ties, every 4th with a k-group of zero scales), "
              f"{dmacs / 1e6:.1f} M multiply-adds; x86 output from the host kernel ({kernel_path()} path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
