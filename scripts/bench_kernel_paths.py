"""The int4 kernel (toolchain_int4_linear_a8) on each kernel path this CPU has, side by side in one process.

  .venv/bin/python scripts/bench_kernel_paths.py [--paths generic,avx2,avx_vnni,avx512_vnni] [--mb 300]
      [--group 64] [--reps 3] [--threads 1,2] [--json OUT]

decode: T = 1 through --mb MB of int4 weights (0.5B decode reads ~279 MB per token), [4864, 896] and
[896, 4864] matrices cycled so the weights come from memory, not cache: GB/s of weights per CPU second.
prefill: a 32-row chunk (the programs' prefill chunk) and T = 64 through one [4864, 896] and one [896, 4864]
matrix: GMAC/s per CPU second. Times are the calling thread's CPU time (time.thread_time, best of --reps), so
other processes on a loaded host do not count (their share of the memory bus and caches still does); the
thread pool is set to 1 thread. Every path's output is checked bit-equal to the generic path's first.
--threads 1,2 adds, per path, the wall time of the same decode pass and a T = 32 chunk with ExecuTorch's
thread pool at each count (interleaved, best of --reps: on a loaded host the best is the least disturbed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="generic,avx2,avx_vnni,avx512_vnni")
    ap.add_argument("--mb", type=float, default=300.0)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="", help="e.g. 1,2: wall time per thread-pool size")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import torch
    from executorch.extension.pybindings import portable_lib

    from toolchain.mesp.kernels import load_native_kernels

    lib = load_native_kernels()
    portable_lib._unsafe_reset_threadpool(1)
    default = lib.toolchain_kernel_path().decode()
    paths = [p for p in a.paths.split(",") if lib.toolchain_select_kernel_path(p.encode()) == 0]
    lib.toolchain_select_kernel_path(default.encode())
    gen = torch.Generator().manual_seed(0)
    shapes = [(4864, 896), (896, 4864)]

    def make(o, i):
        ng = -(-i // a.group)
        return torch.randint(0, 256, (o, i // 2), generator=gen, dtype=torch.uint8), torch.randn(o, ng, generator=gen)

    n_mats = max(2, int(a.mb * 1e6 / (4864 * 896 / 2)))
    mats = [make(*shapes[k % 2]) for k in range(n_mats)]
    nbytes = sum(q.numel() + s.numel() * 4 for q, s in mats)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731

    def run(q, s, x, y):
        o, i = q.shape[0], q.shape[1] * 2
        assert lib.toolchain_int4_linear_a8(ptr(x), x.shape[0], i, ptr(q), ptr(s), o, s.shape[1], a.group, ptr(y)) == 0

    xs = {i: torch.randn(64, i, generator=gen) for _, i in shapes}
    ys = {(t, o): torch.empty(t, o) for t in (1, 32, 64) for o, _ in shapes}
    ref = {}
    rows = []
    for p in paths:
        assert lib.toolchain_select_kernel_path(p.encode()) == 0
        for k, (q, s) in enumerate(mats[:2]):                          # bit-equal to generic
            for t in (1, 32, 64):
                y = torch.empty(t, q.shape[0])
                run(q, s, xs[q.shape[1] * 2][:t].contiguous(), y)
                ref.setdefault((k, t), y.clone())
                assert torch.equal(ref[(k, t)].view(torch.int32), y.view(torch.int32)), (p, k, t)
        x1 = {i: xs[i][:1].contiguous() for i in xs}
        best = float("inf")
        for _ in range(a.reps):
            c0 = time.thread_time()
            for q, s in mats:
                run(q, s, x1[q.shape[1] * 2], ys[(1, q.shape[0])])
            best = min(best, time.thread_time() - c0)
        row = {"path": p, "decode_gb_per_cpu_s": round(nbytes / best / 1e9, 2), "decode_ms_per_279mb": round(best * 279e6 / nbytes * 1e3, 2)}
        for t in (32, 64):
            xt = {i: xs[i][:t].contiguous() for i in xs}
            reps = 1 if p == "generic" else a.reps
            best = float("inf")
            for _ in range(reps):
                c0 = time.thread_time()
                for q, s in mats[:2]:
                    run(q, s, xt[q.shape[1] * 2], ys[(t, q.shape[0])])
                best = min(best, time.thread_time() - c0)
            macs = t * sum(q.numel() * 2 for q, _ in mats[:2])
            row[f"prefill_t{t}_gmac_per_cpu_s"] = round(macs / best / 1e9, 1)
        counts = [int(n) for n in a.threads.split(",") if n]
        if counts:
            x32 = {i: xs[i][:32].contiguous() for i in xs}
            wall = {(n, k): float("inf") for n in counts for k in ("decode", "t32")}
            for _ in range(a.reps):
                for n in counts:
                    portable_lib._unsafe_reset_threadpool(n)
                    assert lib.toolchain_kernel_threads() == n
                    w0 = time.perf_counter()
                    for q, s in mats:
                        run(q, s, x1[q.shape[1] * 2], ys[(1, q.shape[0])])
                    w1 = time.perf_counter()
                    for q, s in mats[:2]:
                        run(q, s, x32[q.shape[1] * 2], ys[(32, q.shape[0])])
                    w2 = time.perf_counter()
                    wall[(n, "decode")] = min(wall[(n, "decode")], w1 - w0)
                    wall[(n, "t32")] = min(wall[(n, "t32")], w2 - w1)
            portable_lib._unsafe_reset_threadpool(1)
            for n in counts:
                row[f"wall_decode_ms_{n}t"] = round(wall[(n, "decode")] * 1e3, 2)
                row[f"wall_t32_ms_{n}t"] = round(wall[(n, "t32")] * 1e3, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    lib.toolchain_select_kernel_path(default.encode())
    if a.json:
        a.json.write_text(json.dumps({"weights_mb": round(nbytes / 1e6, 1), "group": a.group, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
