"""What a prefill leaves on one thread, from CPU-time counters (docs/kernels.md "Threads"; a loaded host too).

  .venv/bin/python scripts/bench_prefill_threads.py --program DIR [--paths avx512_vnni,avx2] [--threads 2]
      [--prompt-len 64] [--reps 7] [--json OUT]

Per kernel path, in a child process: the prompt's prefill (`toolchain.runtime.generate`, one new token) through the
fused methods, first with the thread pool at 1 thread (its CPU time: what one idle core needs), then at --threads
with kernels_pool_run (kernels.cpp: the kernels' only entry to their threads) interposed by a small C shim (built
with cc into a temporary directory, LD_PRELOADed into the child) that records per pool call each thread's CPU time
in the call's tasks. The calling thread's CPU time then splits into `serial` (outside pool calls: Python, the
runtime, what the kernels do on one thread), its own tasks, and `wait` (inside a pool call, not in a task: waiting
for the other threads). `estimate` = serial + sum over pool calls of (all threads' task CPU / threads) is the
prefill time on idle cores with the tasks spread evenly and no slowdown from sharing; `ratio` = 1-thread CPU /
estimate. `task_growth` = task CPU at --threads / the same work's CPU at 1 thread (about serial-free CPU at 1
thread), > 1 when the threads slow each other (memory, caches, frequency, or the other jobs of a loaded host).
Wall times are printed too; they mean something only when `uptime` load is below the thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
typedef void (*task_fn)(void*, size_t);
typedef void (*par_fn)(task_fn, void*, int64_t);
#define SLOTS 8
#define MAXREC 200000
typedef struct { int64_t range, wall_ns, caller_cpu_ns, cpu_ns[SLOTS]; } rec_t;
static rec_t recs[MAXREC];
static int64_t nrec = 0;
static int enabled = 0;
static _Atomic int next_slot = 0;
static __thread int slot = -1;
typedef struct { task_fn fn; void* ctx; rec_t* r; } wrap_t;
static int64_t now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
static int my_slot(void) { if (slot < 0) slot = atomic_fetch_add(&next_slot, 1) % SLOTS; return slot; }
static void wrapper(void* p, size_t i) {
  wrap_t* w = (wrap_t*)p;
  int s = my_slot();
  int64_t t0 = now(CLOCK_THREAD_CPUTIME_ID);
  w->fn(w->ctx, i);
  __atomic_fetch_add(&w->r->cpu_ns[s], now(CLOCK_THREAD_CPUTIME_ID) - t0, __ATOMIC_RELAXED);
}
void kernels_pool_run(task_fn fn, void* ctx, int64_t range) {
  static par_fn real = 0;
  if (!real) real = (par_fn)dlsym(RTLD_NEXT, "kernels_pool_run");
  if (!enabled || nrec >= MAXREC) { real(fn, ctx, range); return; }
  rec_t* r = &recs[nrec++];
  for (int s = 0; s < SLOTS; ++s) r->cpu_ns[s] = 0;
  r->range = (int64_t)range;
  wrap_t w = {fn, ctx, r};
  int64_t t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
  real(wrapper, &w, range);
  r->caller_cpu_ns = now(CLOCK_THREAD_CPUTIME_ID) - c0;
  r->wall_ns = now(CLOCK_MONOTONIC) - t0;
}
void shim_enable(int on) { enabled = on; }
void shim_reset(void) { nrec = 0; }
int64_t shim_count(void) { return nrec; }
rec_t* shim_records(void) { return recs; }
int shim_caller_slot(void) { return my_slot(); }
"""


def _child(a) -> dict:
    import ctypes

    import torch
    from executorch.extension.pybindings import portable_lib

    from toolchain.native import kernel_path
    from toolchain.program import ProgramDir
    from toolchain.runtime.generate import generate
    from toolchain.runtime.program_runtime import open_runtime

    shim = ctypes.CDLL(os.environ["TOOLCHAIN_POOL_SHIM"])

    class Rec(ctypes.Structure):
        _fields_ = [("range", ctypes.c_int64), ("wall_ns", ctypes.c_int64), ("caller_cpu_ns", ctypes.c_int64),
                    ("cpu_ns", ctypes.c_int64 * 8)]
    shim.shim_records.restype = ctypes.POINTER(Rec)
    shim.shim_count.restype = ctypes.c_int64
    assert shim.shim_caller_slot() == 0                      # this (the calling) thread is slot 0
    torch.set_num_threads(1)
    pdir = ProgramDir(a.program, verify=False)
    runtime = open_runtime(pdir, "executorch", threads=a.threads, use="generate")
    state = pdir.state_init()
    prompt = [(7 * i + 3) % min(pdir.arch.vocab, 1000) for i in range(a.prompt_len)]

    def run(threads: int) -> dict:
        portable_lib._unsafe_reset_threadpool(threads)
        generate(pdir, runtime, state, prompt, 1)             # warm-up
        best: dict = {}
        for _ in range(a.reps):
            shim.shim_reset()
            shim.shim_enable(1)
            w0, c0 = time.perf_counter(), time.thread_time()
            res = generate(pdir, runtime, state, prompt, 1)
            cpu = time.thread_time() - c0
            shim.shim_enable(0)
            n = shim.shim_count()
            rp = shim.shim_records()
            recs = [rp[i] for i in range(n)]
            own = sum(r.cpu_ns[0] for r in recs) / 1e9
            inside = sum(r.caller_cpu_ns for r in recs) / 1e9
            task = sum(sum(r.cpu_ns) for r in recs) / 1e9
            row = {"prefill_wall_s": res.prefill_s, "caller_cpu_s": cpu, "serial_s": cpu - inside,
                   "wait_s": inside - own, "task_cpu_s": task, "even_share_s": task / threads,
                   "busiest_thread_s": sum(max(r.cpu_ns) for r in recs) / 1e9, "pool_calls": n,
                   "wall_s": time.perf_counter() - w0}
            best = row if not best else {k: min(best[k], row[k]) for k in row}
        return best

    one = run(1)
    many = run(a.threads)
    estimate = many["serial_s"] + many["even_share_s"]
    return {"path": kernel_path(), "threads": a.threads, "load_avg": os.getloadavg()[0],
            "one_thread": one, "threads_n": many, "estimate_s": estimate,
            "ratio_estimate": one["caller_cpu_s"] / estimate,
            "serial_share": many["serial_s"] / one["caller_cpu_s"],
            "task_growth": many["task_cpu_s"] / max(one["caller_cpu_s"] - many["serial_s"], 1e-9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", type=Path, required=True)
    ap.add_argument("--paths", default="avx512_vnni,avx2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a)))
        return
    if a.threads < 2:
        sys.exit("Error: --threads must be at least 2")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "libpool_shim.so"
        (Path(tmp) / "shim.c").write_text(SHIM)
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", str(lib),
                        str(Path(tmp) / "shim.c"), "-ldl"], check=True)
        for path in a.paths.split(","):
            env = dict(os.environ, LD_PRELOAD=str(lib), TOOLCHAIN_POOL_SHIM=str(lib), TOOLCHAIN_KERNEL_PATH=path,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
            out = subprocess.run([sys.executable, __file__, "--child", "--program", str(a.program), "--threads",
                                  str(a.threads), "--prompt-len", str(a.prompt_len), "--reps", str(a.reps)],
                                 env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"Error: the {path} child failed: {out.stderr.strip().splitlines()[-1:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ms = lambda v: f"{v * 1e3:7.1f}"  # noqa: E731
    print(f"prefill of {a.prompt_len} tokens, best of {a.reps}, ms of CPU (wall only where marked):")
    print(f"{'path':12s} {'1T cpu':>7s} {'serial':>7s} {'wait':>7s} {'tasks':>7s} {'even':>7s} {'estimate':>8s} "
          f"{'ratio':>6s} {'serial%':>7s} {'growth':>6s} {'1T wall':>7s} {'NT wall':>7s} calls load")
    for r in rows:
        o, m = r["one_thread"], r["threads_n"]
        print(f"{r['path']:12s} {ms(o['caller_cpu_s'])} {ms(m['serial_s'])} {ms(m['wait_s'])} {ms(m['task_cpu_s'])} "
              f"{ms(m['even_share_s'])} {ms(r['estimate_s']):>8s} {r['ratio_estimate']:6.2f} "
              f"{100 * r['serial_share']:6.1f}% {r['task_growth']:6.2f} {ms(o['prefill_wall_s'])} "
              f"{ms(m['prefill_wall_s'])} {m['pool_calls']:5d} {r['load_avg']:.1f}")
    if a.json:
        a.json.write_text(json.dumps({"program": str(a.program), "threads": a.threads, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
