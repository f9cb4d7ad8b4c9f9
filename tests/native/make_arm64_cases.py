"""Test cases for the arm64 build of the int4 kernel (scripts/check_kernel_arm64.sh), with this host's
(x86-64) kernel output: `python tests/native/make_arm64_cases.py OUT [--seed S] [--cases N]`.

Shapes: the fixed ones of tests/native/test_kernels.py, then random ones: T = 1 (decode) and T > 4
with a remainder mod 4 (the prefill tiles), odd o, even i, even groups 2..128 with partial last groups
(and groups wider than i). Half the weights are the repo's `quantize` of a random matrix (padded to whole
groups, as the x86 test does), half uniformly random bytes (every nibble, -8 included) with random scales
of both signs; x is N(0, 1) times a power of two per case, some cases with a per-column power of two.
y is computed by `toolchain_int4_linear_a8` of `toolchain.native.load_kernels()` (built here with
-march=native).

Binary file, little-endian: b"TCI4CAS1", int64 count, then per case int64 T, o, i, group, ng, followed by
x f32 [T, i], q u8 [o, i/2], scales f32 [o, ng], y f32 [T, o] (row-major). Read by
tests/native/arm64_driver.cpp.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_kernels import SHAPES, _kernel, _quantize_partial  # noqa: E402

MAGIC = b"TCI4CAS1"


def random_shape(rng: np.random.Generator) -> tuple[int, int, int, int]:
    r = rng.random()
    if r < 0.35:
        t = 1
    elif r < 0.55:
        t = int(rng.integers(2, 5))
    else:
        t = int(rng.integers(5, 41))          # > 4: whole tiles of 4 and (mostly) a remainder
    o = int(rng.integers(1, 48)) | (1 if rng.random() < 0.6 else 0)   # mostly odd
    group = 2 * int(rng.integers(1, 65))  # 2..128, even
    r = rng.random()
    if r < 0.15:
        i = 2 * int(rng.integers(1, group // 2 + 1))                 # one group, maybe partial (i <= group)
    elif r < 0.4:
        i = group * int(rng.integers(1, max(2, 640 // group) + 1))   # whole groups
    else:
        i = 2 * int(rng.integers(1, 321))                            # anything even up to 640
    return t, o, i, group


def make_case(t: int, o: int, i: int, group: int, rng: np.random.Generator, quantized: bool):
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
    x = torch.from_numpy(x.astype(np.float32))
    y = _kernel(x, q.contiguous(), scales.contiguous(), group)
    return t, o, i, group, ng, x, q, scales, y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--cases", type=int, default=300, help="random cases besides the fixed shapes")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    shapes = list(SHAPES) + [random_shape(rng) for _ in range(args.cases)]
    macs = 0
    with open(args.out, "wb") as f:
        f.write(MAGIC + struct.pack("<q", len(shapes)))
        for k, (t, o, i, group) in enumerate(shapes):
            t, o, i, group, ng, x, q, scales, y = make_case(t, o, i, group, rng, quantized=k % 2 == 0)
            assert q.shape == (o, i // 2) and scales.shape == (o, ng) and y.shape == (t, o)
            f.write(struct.pack("<5q", t, o, i, group, ng))
            for a, dt in ((x, np.float32), (q, np.uint8), (scales, np.float32), (y, np.float32)):
                f.write(np.ascontiguousarray(a.numpy(), dtype=np.dtype(dt).newbyteorder("<")).tobytes())
            macs += t * o * i
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    isa = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "generic"
    print(f"cases: {len(shapes)} ({len(SHAPES)} fixed + {args.cases} random, seed {args.seed}), "
          f"{macs / 1e6:.1f} M multiply-adds; x86 output from the host kernel (-march=native, {isa} path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
