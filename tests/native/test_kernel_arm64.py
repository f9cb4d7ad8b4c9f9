"""The arm64 paths of the int4 kernels (toolchain/native/kernels_arm64.h: neon, dotprod, i8mm, and the generic
path), built by GCC and clang at the apps' baseline (armv8-a) and run under qemu-aarch64 at three CPU levels by
scripts/check_kernel_arm64.sh: int4_linear_a8 on 402 cases (random shapes, odd sizes, partial last groups, T = 1,
2..9, >= 10, groups of 32 / 64 / 96 / 128 / 256, NaN / inf rows) and int4_dyw_a8 (dX = dY W) on 108 (the same
kinds, odd o, partial blocks and k-groups, ties, zero scales): every path equal to the generic path and to this
host's x86 kernel bit for bit, within the float32 bound of a float64 reference; the default path per CPU level
(max: i8mm, cortex-a76: dotprod, cortex-a53: neon); a forced path the CPU lacks refused (-2 from a valid call, one
Error: line with the library's reason); sdot / smmla in the dotprod / i8mm functions (objdump) and nowhere else;
and, in a build with kernels.cpp's thread-pool code against a stand-in pool (tests/native/arm64_pool.cpp), every
path with the weight rows of large calls split into chunks over 3 threads, to the same bits. The training step's
float32 ops (tests/native/arm64_train_ops.cpp, all 14: attention_train and its backward, swiglu_train, swiglu,
rms_norm, online_softmax_stats, exp_sub_rows, lora_backward, lora_rows_backward, lora_linear_a8, lora_linear_a8_rows,
rope_train and its backward, rms_norm_backward) in every run against the same driver built for this x86-64 host: equal
bit for bit (kernels.cpp writes its float32 sums' scalar tails, and the products RoPE and the RMSNorm backward add, as
std::fma, so GCC, clang and -march agree), and, for the ops that call kernels.cpp's `dot` and rms_norm_backward,
within the float32 bound of a float64 reference; one hash over x86, both compilers, every path, CPU model and
thread count; the pooled build at 1 and 2 threads (every op split over the pool at 2).

The script installs g++-aarch64-linux-gnu, qemu-user, clang-19 and lld-19 from Debian's packages when they
are missing (a minute or two once); skipped when they are missing and cannot be installed. About 7 minutes
with them (416 s on the 2-core host at load 8-9); ARM64_CASES=2000 runs more random cases (slower)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_kernel_arm64.sh"
SKIP = 77
EXPECTED = {  # CPU model -> (paths it runs, the default choice, paths refused)
    "max": ({"generic", "neon", "dotprod", "i8mm"}, "i8mm", {"avx512_vnni", "sve"}),
    "cortex-a76": ({"generic", "neon", "dotprod"}, "dotprod", {"i8mm"}),
    "cortex-a53": ({"generic", "neon"}, "neon", {"dotprod", "i8mm"}),
}


@pytest.mark.slow
def test_arm64_paths_equal_the_generic_path_under_qemu():
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=3600, env=env)
    out = done.stdout + done.stderr
    if done.returncode == SKIP:
        reason = next((line for line in out.splitlines() if "skipped:" in line), out.strip()[-300:])
        pytest.skip(f"no arm64 cross tools: {reason}")
    print(out)
    tally = re.findall(r"^arm64: (\d+) passed, (\d+) failed$", out, re.M)
    assert tally and tally[-1][1] == "0" and done.returncode == 0, out[-4000:]
    # every run the script promises was made and passed (a check that did not run cannot pass)
    for cc in ("gcc", "clang"):
        assert f"ok   {cc}: the dotprod functions contain sdot" in out and f"ok   {cc}: the i8mm functions contain smmla" in out
        for cpu, (paths, default, refused) in EXPECTED.items():
            for p in paths:
                assert f"ok   {cc} -cpu {cpu} TOOLCHAIN_KERNEL_PATH={p}: outputs hash = the generic path's" in out, (cc, cpu, p)
            assert f"ok   {cc} -cpu {cpu} (default) runs the {default} path" in out, (cc, cpu)
            for p in refused - {"avx512_vnni", "sve"}:
                assert f"ok   {cc} -cpu {cpu} TOOLCHAIN_KERNEL_PATH={p} is refused" in out, (cc, cpu, p)
    for p in ("generic", "neon", "dotprod", "i8mm"):
        label = f"gcc-pool -cpu max TOOLCHAIN_KERNEL_PATH={p}"
        assert f"ok   {label}: outputs hash = the generic path's" in out, p
        assert f"ok   {label}: the weight rows were split over the pool" in out, p
    hashes = set(re.findall(r"path\): float32 bound .* outputs hash ([0-9a-f]{16})$", out, re.M))
    assert len(hashes) == 1, hashes                   # int4_linear_a8: one hash over every run
    dyw = re.findall(r"path\) dyw: float32 bound .* outputs hash ([0-9a-f]{16})$", out, re.M)
    assert len(dyw) == 28 and len(set(dyw)) == 1, dyw   # int4_dyw_a8: 28 runs (every one not refused), one hash
    for cc in ("gcc", "clang"):
        for cpu, (paths, _, _) in EXPECTED.items():
            for p in paths:
                assert f"ok   {cc} -cpu {cpu} TOOLCHAIN_KERNEL_PATH={p}: dyw: outputs hash = the generic path's" in out
                assert f"ok   {cc} -cpu {cpu} TOOLCHAIN_KERNEL_PATH={p}: dyw_acc: acc + dy W = acc + dx" in out
    # the train ops: x86's own run, then every arm64 run and the pooled build at 1 and 2 threads
    assert "ok   x86-64: the train ops hold their float64 bounds" in out
    assert "ok   x86-64 generic path: the train ops' outputs equal the default path's" in out
    # the AVX2-only build (-march=x86-64-v3: GCC's f32x16 as two 8-lane halves): the native build's bits
    assert "ok   x86-64-v3 build (AVX2, no AVX-512): the train ops' outputs equal the -march=native build's" in out
    for cc in ("gcc", "clang"):
        for cpu, (paths, _, _) in EXPECTED.items():
            for p in paths:
                label = f"{cc} -cpu {cpu} TOOLCHAIN_KERNEL_PATH={p}"
                assert f"ok   {label}: train ops: every op passed (bits equal to x86, float64 bounds)" in out, label
                assert f"ok   {label}: train ops: every output equal to x86's bit for bit" in out, label
                assert f"ok   {label}: train ops hash = the x86 build's (" in out, label
    for n, what in ((1, "no train op used the pool"), (2, "every train op was split over the pool")):
        label = f"gcc-pool -cpu max TOOLCHAIN_TEST_POOL_THREADS={n}"
        assert f"ok   {label}: train ops hash = the x86 build's (" in out and f"ok   {label}: {what}" in out, n
    x86 = re.findall(r"^arm64: .*: train ops outputs hash ([0-9a-f]{16})$", out, re.M)
    train = re.findall(r"^arm64: (gcc|clang)\S* .*path\) train ops: 14 ops, .* outputs hash ([0-9a-f]{16})$", out, re.M)
    assert len(train) == 30, len(train)       # 12 runs per compiler, 4 pooled at 3 threads, 2 at 1 and 2 threads
    assert len(x86) == 1 and {h for _, h in train} == set(x86), (x86, train)   # one hash: x86, GCC and clang
    assert re.findall(r"^arm64: x86-64-v3 build \(.*\) train ops outputs hash ([0-9a-f]{16})$", out, re.M) == x86
    assert int(tally[-1][0]) == 337, tally   # + the 28 runs' int4_dyw_a8_acc checks, the x86-64-v3 build's
    assert len(re.findall(r"^  ok   .*: dyw_acc: acc \+ dy W = acc \+ dx bit for bit", out, re.M)) == 28
