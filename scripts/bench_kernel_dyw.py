"""dX = dY W for int4 W (toolchain_int4_dyw_a8, the training step's --compute int8 dX) on each kernel path this CPU
has, beside the forward int4 kernel (toolchain_int4_linear_a8) and float32 torch.matmul of the dequantized matrix
(what the fp32 step computes), side by side in one process.

  .venv/bin/python scripts/bench_kernel_dyw.py [--paths generic,avx2,avx_vnni,avx512_vnni] [--t 256] [--group 64]
      [--reps 3] [--threads 1,2] [--vchunk 8192] [--json OUT]

Shapes: Qwen2.5-0.5B's training matmuls at T = --t rows (seq 256): down_proj's dX (dy [T, 4864] x W [4864, 896]),
gate / up's ([T, 896] x [896, 4864]), q / o's ([T, 896] x [896, 896]), k / v's ([T, 128] x [128, 896]) and one LM
head vocabulary chunk ([T, vchunk] x [vchunk, 896]). Per path and shape: GMAC/s per CPU second (time.thread_time
of the calling thread, best of --reps, ExecuTorch's thread pool at 1 thread) of int4_dyw_a8, of int4_linear_a8 at
the same T and MACs (x [T, i] x W^T, the forward / recompute), and of torch.matmul(dy, W) in float32 (torch at 1
thread; its dequantization not counted). Every path's int4_dyw_a8 output is checked bit-equal to the generic path's
first. --threads 1,2 adds the wall time of int4_dyw_a8 per thread-pool size (interleaved, best of --reps) and the
ratio. Prints one JSON line per path and a table; --json writes them all.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import time
from pathlib import Path

SHAPES = {"down_proj": (4864, 896), "gate_up": (896, 4864), "q_o": (896, 896), "k_v": (128, 896)}   # (o, i)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="generic,avx2,avx_vnni,avx512_vnni")
    ap.add_argument("--t", type=int, default=256)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--vchunk", type=int, default=8192, help="LM head vocabulary chunk rows (0: leave out)")
    ap.add_argument("--threads", default="", help="e.g. 1,2: int4_dyw_a8 wall time per thread-pool size")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import torch
    from executorch.extension.pybindings import portable_lib

    from toolchain.mesp.kernels import load_native_kernels
    from toolchain.mesp.ops.quant import QuantWeight, dequantize

    torch.set_num_threads(1)
    lib = load_native_kernels()
    portable_lib._unsafe_reset_threadpool(1)
    default = lib.toolchain_kernel_path().decode()
    paths = [p for p in a.paths.split(",") if lib.toolchain_select_kernel_path(p.encode()) == 0]
    lib.toolchain_select_kernel_path(default.encode())
    shapes = dict(SHAPES)
    if a.vchunk:
        shapes["lm_head_chunk"] = (a.vchunk, 896)
    gen = torch.Generator().manual_seed(0)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    T = a.t
    data = {}
    for name, (o, i) in shapes.items():
        ng = -(-i // a.group)
        q = torch.randint(0, 256, (o, i // 2), generator=gen, dtype=torch.uint8)
        s = torch.rand(o, ng, generator=gen) * 0.02 + 1e-3
        data[name] = (q, s, torch.randn(T, o, generator=gen), torch.randn(T, i, generator=gen),
                      torch.empty(T, i), torch.empty(T, o))

    def dyw(name):
        q, s, dy, _, dx, _ = data[name]
        o, i = q.shape[0], 2 * q.shape[1]
        assert lib.toolchain_int4_dyw_a8(ptr(dy), T, o, ptr(q), ptr(s), i, s.shape[1], a.group, ptr(dx)) == 0

    def fwd(name):
        q, s, _, x, _, y = data[name]
        o, i = q.shape[0], 2 * q.shape[1]
        assert lib.toolchain_int4_linear_a8(ptr(x), T, i, ptr(q), ptr(s), o, s.shape[1], a.group, ptr(y)) == 0

    def best_cpu(fn, reps):
        best = float("inf")
        for _ in range(reps):
            c0 = time.thread_time()
            fn()
            best = min(best, time.thread_time() - c0)
        return best

    def gmacs(name, seconds):
        o, i = shapes[name]
        return round(T * o * i / seconds / 1e9, 1)

    fp32 = {}
    for name in shapes:                               # float32 dy @ W of the dequantized W (torch, 1 thread)
        q, s, dy, *_ = data[name]
        w = dequantize(QuantWeight(q, s, 4))
        torch.matmul(dy, w)
        fp32[name] = gmacs(name, best_cpu(lambda: torch.matmul(dy, w), a.reps))
    ref = {}
    rows = []
    for p in paths:
        assert lib.toolchain_select_kernel_path(p.encode()) == 0
        row = {"path": p}
        for name in shapes:
            dyw(name)
            out = data[name][4]
            ref.setdefault(name, out.clone())
            assert torch.equal(ref[name].view(torch.int32), out.view(torch.int32)), (p, name)
            reps = 1 if p == "generic" else a.reps
            row[f"{name}_dyw"] = gmacs(name, best_cpu(lambda: dyw(name), reps))
            row[f"{name}_fwd"] = gmacs(name, best_cpu(lambda: fwd(name), reps))
            row[f"{name}_fp32"] = fp32[name]
        counts = [int(n) for n in a.threads.split(",") if n]
        if counts:
            wall = {n: float("inf") for n in counts}
            for _ in range(a.reps):
                for n in counts:
                    portable_lib._unsafe_reset_threadpool(n)
                    assert lib.toolchain_kernel_threads() == n
                    w0 = time.perf_counter()
                    for name in shapes:
                        dyw(name)
                    wall[n] = min(wall[n], time.perf_counter() - w0)
            portable_lib._unsafe_reset_threadpool(1)
            for n in counts:
                row[f"dyw_wall_ms_{n}t"] = round(wall[n] * 1e3, 1)
            if len(counts) > 1:
                row[f"dyw_speedup_{counts[-1]}t"] = round(wall[counts[0]] / wall[counts[-1]], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    lib.toolchain_select_kernel_path(default.encode())

    print(f"\nGMAC/s per CPU second, T = {T}, group {a.group}, 1 thread ({cpu_name()}):")
    print(f"{'path':12s} {'shape (o x i)':22s} {'int4_dyw_a8':>11s} {'int4_linear_a8':>14s} {'fp32 matmul':>11s}")
    for row in rows:
        for name, (o, i) in shapes.items():
            print(f"{row['path']:12s} {name + f' ({o} x {i})':22s} {row[f'{name}_dyw']:11.1f} "
                  f"{row[f'{name}_fwd']:14.1f} {row[f'{name}_fp32']:11.1f}")
        if "dyw_speedup_2t" in row:
            print(f"{row['path']:12s} all shapes: 1 thread {row['dyw_wall_ms_1t']} ms, 2 threads "
                  f"{row['dyw_wall_ms_2t']} ms wall: {row['dyw_speedup_2t']}x")
    if a.json:
        a.json.write_text(json.dumps({"cpu": cpu_name(), "t": T, "group": a.group, "shapes": shapes, "rows": rows},
                                     indent=2) + "\n")


if __name__ == "__main__":
    main()
