"""The kernel paths of toolchain/native/kernels.cpp (generic, avx2, avx_vnni, avx512_vnni; neon, dotprod, i8mm on
arm64): chosen at load, the best this CPU has, or forced by $TOOLCHAIN_KERNEL_PATH; every path gives the generic
path's bits.

Every x86 path this CPU has is run here, forced through the C entry `toolchain_select_kernel_path` (in this
process) and through the environment variable (in a child process); a path this CPU lacks is asserted to be
refused, never skipped. What the CPU has is read independently of the library, from /proc/cpuinfo's flags (the
kernel lists AVX-512 only when the OS saves its registers)."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from toolchain.native.build import kernel_library
from x86_cpu import X86_PATHS, has_path

REPO = Path(__file__).resolve().parents[2]
ALL_PATHS = ("generic", *X86_PATHS, "neon", "dotprod", "i8mm")
_ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731


def _best() -> str:
    return next(p for p in ("avx512_vnni", "avx_vnni", "avx2", "generic") if has_path(p))


pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the x86 paths (arm64: "
                                "tests/native/test_kernel_arm64.py)")


def _quantized(o: int, i: int, group: int, gen: torch.Generator):
    """Random int4 weights [o, i / 2] bytes (any nibble) and scales [o, ceil(i / group)] (the last group may be
    partial), scales of mixed magnitude and sign."""
    ng = -(-i // group)
    q = torch.randint(0, 256, (o, i // 2), generator=gen, dtype=torch.uint8)
    s = torch.randn(o, ng, generator=gen) * torch.exp2(torch.randint(-8, 4, (o, ng), generator=gen).float())
    return q, s


def _x(t: int, i: int, gen: torch.Generator, special: bool) -> torch.Tensor:
    x = torch.randn(t, i, generator=gen) * torch.exp2(torch.randint(-6, 7, (1, i), generator=gen).float())
    if special and t >= 4:
        x[0, i // 3] = float("nan")                         # a NaN row (its groups' scale is NaN)
        x[1, -1] = float("inf")
        x[2, : min(i, 64)] = 0.0                            # zero groups
        x[3, : min(i, 32)] = torch.arange(min(i, 32)) * 0.5 - 8   # ties at the rounding
    return x


def _int4(lib, x, q, s, group):
    t, i = x.shape
    y = torch.full((t, q.shape[0]), 7.0)
    assert lib.toolchain_int4_linear_a8(_ptr(x), t, i, _ptr(q), _ptr(s), q.shape[0], s.shape[1], group, _ptr(y)) == 0
    return y


def _lora(lib, x, q, s, group, bias, a, b, scale, residual):
    t, i = x.shape
    y = torch.full((t, q.shape[0]), 7.0)
    r = 0 if a is None else a.shape[0]
    assert lib.toolchain_lora_linear_a8(_ptr(x), t, i, _ptr(q), _ptr(s), q.shape[0], s.shape[1], group, _ptr(bias),
                                        _ptr(a), _ptr(b), r, ctypes.c_float(scale), _ptr(residual), _ptr(y)) == 0
    return y


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


# (T, o, i, group): decode T = 1, row tiles T = 2..9, broadcast T >= 10 (the 256-bit paths from T = 4); groups of
# 32 / 64 / 128 (the vector paths) and others (generic everywhere); odd o (a short last block of 16 / 8 rows),
# partial last groups, short last blocks of 16 groups, odd widths.
SHAPES = [(1, 65, 896, 64), (1, 7, 130, 32), (1, 50, 2080, 32), (1, 3, 70, 64), (1, 19, 1030, 128), (1, 33, 4864, 64),
          (2, 5, 130, 128), (2, 9, 1000, 64), (3, 33, 128, 64), (4, 17, 96, 32), (5, 23, 1024, 32), (6, 29, 4864, 64),
          (7, 31, 258, 64), (8, 13, 2000, 128), (9, 17, 160, 32), (10, 19, 1000, 32), (11, 5, 100, 32),
          (12, 37, 896, 64), (16, 21, 896, 64), (17, 48, 1000, 128), (33, 21, 4864, 64), (64, 24, 896, 32),
          (5, 9, 70, 6), (12, 7, 200, 30), (3, 11, 34, 2),
          (1, 200, 2048, 64), (12, 100, 1000, 32), (5, 70, 1030, 128)]   # large enough to split over threads


@pytest.mark.parametrize("path", X86_PATHS)
def test_every_x86_path_gives_the_generic_bits_for_int4_and_lora_linear(lib, path):
    """int4_linear_a8 and lora_linear_a8 through `path` equal the generic path bit for bit (NaN rows included) on
    every shape above; a path this CPU lacks is refused (-2) instead."""
    if not has_path(path):
        assert lib.toolchain_select_kernel_path(path.encode()) == -2
        assert path in lib.toolchain_kernel_path_error().decode()
        return
    for n, (t, o, i, group) in enumerate(SHAPES):
        gen = torch.Generator().manual_seed(1000 * n + t)
        q, s = _quantized(o, i, group, gen)
        x = _x(t, i, gen, special=n % 2 == 0)
        r = 1 + n % 9
        bias, a, b, res = torch.randn(o, generator=gen), torch.randn(r, i, generator=gen), \
            torch.randn(o, r, generator=gen), torch.randn(t, o, generator=gen)
        lora_args = [(bias, a, b, 0.5, res), (None, None, None, 0.0, None), (None, a, b, 2.0, None)][n % 3]
        got = {}
        for p in ("generic", path):
            assert lib.toolchain_select_kernel_path(p.encode()) == 0 and lib.toolchain_kernel_path().decode() == p
            got[p] = (_int4(lib, x, q, s, group), _lora(lib, x, q, s, group, *lora_args))
        assert torch.equal(_bits(got[path][0]), _bits(got["generic"][0])), (path, t, o, i, group)
        assert torch.equal(_bits(got[path][1]), _bits(got["generic"][1])), (path, t, o, i, group)
        if n % 2 == 0 and t >= 4:
            assert got[path][0][0].isnan().all() and not got[path][0][2:4].isnan().any()


@pytest.mark.parametrize("path", X86_PATHS)
def test_rows_of_x_do_not_interact_in_any_path(lib, path):
    """A row of x gives the same bits alone (decode) as inside a prefill chunk (tiles, broadcast)."""
    if not has_path(path):
        assert lib.toolchain_select_kernel_path(path.encode()) == -2
        return
    assert lib.toolchain_select_kernel_path(path.encode()) == 0
    gen = torch.Generator().manual_seed(5)
    for group in (32, 64, 128):
        q, s = _quantized(23, 640, group, gen)
        x = _x(13, 640, gen, special=False)
        whole = _int4(lib, x, q, s, group)
        for t in (5, 13):
            part = _int4(lib, x[:t].clone(), q, s, group)
            assert torch.equal(_bits(part), _bits(whole[:t]))
        for r in range(13):
            assert torch.equal(_bits(_int4(lib, x[r:r + 1].clone(), q, s, group)[0]), _bits(whole[r]))


@pytest.mark.parametrize("path", ("generic", *X86_PATHS))
def test_threads_split_the_rows_without_changing_the_bits(lib, path):
    """With ExecuTorch's thread pool at 2 threads the rows are split in chunks of 16 (a short last one), and where
    x has at least 2^14 elements its rows' quantization too (T = 64 and 32 below); the bits equal the 1-thread
    run's (the runtime's pool: portable_lib._unsafe_reset_threadpool, what --threads sets)."""
    from executorch.extension.pybindings import portable_lib

    if not has_path(path):
        assert lib.toolchain_select_kernel_path(path.encode()) == -2
        return
    assert lib.toolchain_select_kernel_path(path.encode()) == 0
    before = lib.toolchain_kernel_threads()
    gen = torch.Generator().manual_seed(9)
    try:
        for t, o, i, group in [(1, 520, 896, 64), (12, 100, 1000, 32), (3, 300, 2048, 128), (64, 77, 896, 64),
                               (2, 1000, 640, 64), (32, 128, 4864, 64)]:
            q, s = _quantized(o, i, group, gen)
            x = _x(t, i, gen, special=True)
            got = []
            for n in (1, 2):
                portable_lib._unsafe_reset_threadpool(n)
                assert lib.toolchain_kernel_threads() == n
                got.append(_int4(lib, x, q, s, group))
            assert torch.equal(_bits(got[0]), _bits(got[1])), (path, t, o, i, group)
    finally:
        portable_lib._unsafe_reset_threadpool(before)


_CHILD = """
import ctypes, hashlib, random
from toolchain.mesp.kernels import load_native_kernels
from toolchain.native import kernel_path
lib = load_native_kernels()
rng = random.Random(3)
out = []
for t, o, i, g in [(1, 37, 896, 64), (6, 29, 1000, 32), (12, 21, 4864, 128)]:
    q = (ctypes.c_uint8 * (o * i // 2))(*(rng.randrange(256) for _ in range(o * i // 2)))
    ng = -(-i // g)
    s = (ctypes.c_float * (o * ng))(*(rng.gauss(0, 1) for _ in range(o * ng)))
    x = (ctypes.c_float * (t * i))(*(rng.gauss(0, 1) for _ in range(t * i)))
    y = (ctypes.c_float * (t * o))()
    assert lib.toolchain_int4_linear_a8(x, t, i, q, s, o, ng, g, y) == 0
    out.append(bytes(y))
print(kernel_path(), hashlib.sha256(b"".join(out)).hexdigest())
"""


def _child(env_path: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TOOLCHAIN_KERNEL_PATH"}
    env["PYTHONPATH"] = str(REPO)
    if env_path is not None:
        env["TOOLCHAIN_KERNEL_PATH"] = env_path
    return subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPO)


def test_the_default_is_the_best_path_this_cpu_has_and_the_variable_forces_each():
    """Without the variable the library runs the best path /proc/cpuinfo allows; with it, each path this CPU has
    runs (the child reports it) and gives the same bits; a path it lacks is refused."""
    kernel_library()   # built once before the children (they would each build it otherwise)
    default = _child(None)
    assert default.returncode == 0, default.stderr[-2000:]
    name, digest = default.stdout.split()
    assert name == _best()
    for path in ("generic", *X86_PATHS):
        forced = _child(path)
        if has_path(path):
            assert forced.returncode == 0, forced.stderr[-2000:]
            assert forced.stdout.split() == [path, digest]
        else:
            assert forced.returncode != 0 and f"kernel path {path} is not available on this CPU" in forced.stderr


@pytest.mark.parametrize("name,message", [("neon", "kernel path neon is not available on this CPU: it lacks an arm64"),
                                          ("avx3", "unknown kernel path 'avx3' .*known: generic, avx2, avx_vnni"),
                                          ("AVX2", "unknown kernel path 'AVX2'")])
def test_forcing_an_unknown_or_unsupported_path_fails_clearly(name, message):
    """In a child: load_kernels raises KernelUnavailable naming the path and what the CPU lacks; the C entries
    return -2 (no silent fallback to another path)."""
    code = f"""
import ctypes, re, sys
from toolchain.native import KernelUnavailable, load_kernels, kernel_library
try:
    load_kernels()
except KernelUnavailable as e:
    assert re.search({message!r}, str(e)), str(e)
else:
    sys.exit("no error")
raw = ctypes.CDLL(str(kernel_library()))
y = (ctypes.c_float * 2)()
x = (ctypes.c_float * 4)(1, 2, 3, 4)
q = (ctypes.c_uint8 * 4)()
s = (ctypes.c_float * 2)(1, 1)
assert raw.toolchain_int4_linear_a8(x, ctypes.c_int64(1), ctypes.c_int64(4), q, s, ctypes.c_int64(2),
                                    ctypes.c_int64(1), ctypes.c_int64(4), y) == -2
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOOLCHAIN_KERNEL_PATH": name}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_select_refuses_unknown_and_lacking_paths_and_keeps_the_current_one(lib):
    current = lib.toolchain_kernel_path()
    assert lib.toolchain_select_kernel_path(b"sse9") == -1
    assert b"unknown kernel path 'sse9'" in lib.toolchain_kernel_path_error()
    assert lib.toolchain_kernel_path() == current
    for path in ALL_PATHS:
        rc = lib.toolchain_select_kernel_path(path.encode())
        assert rc == (0 if has_path(path) else -2), path
        if rc == 0:
            assert lib.toolchain_kernel_path().decode() == path and lib.toolchain_kernel_path_error() is None


def test_the_cache_key_covers_the_headers(tmp_path, monkeypatch):
    """A change to an included header is a new library (build.py hashes kernels*.h beside kernels.cpp)."""
    from toolchain.native import build

    assert "kernels_x86.h" in {p.name for p in build.KERNEL_HEADERS}
    assert '#include "kernels_x86.h"' in build.KERNEL_SOURCE.read_text()
    cxx = build._compiler()
    key = build._key(cxx)
    changed = tmp_path / "kernels_x86.h"
    changed.write_bytes(Path(build.KERNEL_SOURCE.parent / "kernels_x86.h").read_bytes() + b"\n")
    monkeypatch.setattr(build, "KERNEL_HEADERS", (changed,))
    assert build._key(cxx) != key


_SPIN_CHILD = r"""
import torch
from executorch.extension.pybindings import portable_lib
from toolchain.mesp.kernels import load_native_kernels
from toolchain.mesp.ops.quant import quantize
lib = load_native_kernels()
gen = torch.Generator().manual_seed(3)
q = quantize(torch.randn(896, 896, generator=gen), "int4", 64)
x = torch.randn(64, 896, generator=gen)
out = []
for n in (1, 2, 2, 1, 2):
    portable_lib._unsafe_reset_threadpool(n)
    units = lib.toolchain_pool_units()
    y = torch.empty(64, 896)
    assert lib.toolchain_int4_linear_a8(x.data_ptr(), 64, 896, q.q.data_ptr(), q.scale.data_ptr(), 896, 14, 64,
                                        y.data_ptr()) == 0
    assert (lib.toolchain_pool_units() > units) == (n == 2), (n, units)
    out.append(y)
assert all(torch.equal(out[0].view(torch.int32), y.view(torch.int32)) for y in out[1:])
print("ok")
"""


@pytest.mark.parametrize("spin", ["0", "5000"])
def test_the_kernels_workers_give_the_same_bits_whether_they_sleep_at_once_or_spin(spin):
    """$TOOLCHAIN_POOL_SPIN_US=0: every call wakes a sleeping worker (the futex path); 5000: they spin through
    the calls. Either way the calls at 2 threads run units on the workers and give the 1-thread bits."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOOLCHAIN_POOL_SPIN_US": spin}
    done = subprocess.run([sys.executable, "-c", _SPIN_CHILD], capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@pytest.mark.parametrize("value", ["-1", "100001", "fast", "2.5", ""])
def test_a_bad_pool_spin_is_refused_when_the_kernels_load(value):
    code = ("from toolchain.native import KernelUnavailable, load_kernels\n"
            "try:\n    load_kernels()\nexcept KernelUnavailable as e:\n    print(e)\nelse:\n    print('loaded')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOOLCHAIN_POOL_SPIN_US": value}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (f"$TOOLCHAIN_POOL_SPIN_US: {value!r} is not an integer from 0 to 100000 "
                                   "(microseconds the kernels' workers spin before sleeping; unset: 200)")


_FORK_CHILD = r"""
import os, signal, torch
from executorch.extension.pybindings import portable_lib
from toolchain.mesp.kernels import load_native_kernels
from toolchain.mesp.ops.quant import quantize
lib = load_native_kernels()
portable_lib._unsafe_reset_threadpool(2)
q = quantize(torch.randn(896, 896, generator=torch.Generator().manual_seed(4)), "int4", 64)
x, y = torch.randn(64, 896), torch.empty(64, 896)
def call():
    units = lib.toolchain_pool_units()
    assert lib.toolchain_int4_linear_a8(x.data_ptr(), 64, 896, q.q.data_ptr(), q.scale.data_ptr(), 896, 14, 64,
                                        y.data_ptr()) == 0
    assert lib.toolchain_pool_units() > units
call()                                   # the parent's workers exist now
pid = os.fork()
if pid == 0:
    signal.alarm(120)                    # a child waiting on the parent's workers would hang: fail instead
    call()
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
call()
print("ok")
"""


def test_a_forked_child_runs_the_kernels_on_workers_of_its_own():
    """The workers are threads of the process that started them; a fork's child (one thread) starts its own
    instead of waiting for the parent's."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _FORK_CHILD], capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
