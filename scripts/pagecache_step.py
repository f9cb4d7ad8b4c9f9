"""One training step of an exported program when the page cache cannot hold its weights.

The frozen weights are clean memory-mapped file pages: the OS may evict them under pressure and fault them back in
from storage when a method reads them. This runs the program's step (ExecuTorch, the host's layer loop, SGD) in
fresh processes, one per case, side by side:

  resident   no memory limit: after the warm-up step the weights stay in the page cache (no reads);
  evicted    the process in a memory cgroup whose limit is its anonymous memory after the warm-up step plus
             --anon-headroom-mb plus --cache-mb: the page cache may hold only --cache-mb of the weights file, so
             every step reads most of the file again (cgroup v1 `memory.limit_in_bytes` or v2 `memory.max`; the
             file's pages are dropped with posix_fadvise(DONTNEED) first so that they are charged to the cgroup);
  prefetch   as evicted, with `LayerLoop(prefetch=True)`: madvise(MADV_WILLNEED) of the next layer's pages
             before each layer's call (toolchain/runtime/prefetch.py).

Per case, per measured step: wall and CPU seconds, bytes read from storage (/proc/self/io read_bytes), major page
faults (getrusage), and the loss (equal across cases: the same step). The phone figure: read_bytes / the storage's
sequential read rate (UFS 4.0: ~4 GB/s), the time a phone at least spends reading per step.

Needs root (the cgroup) and Linux. Usage:

    python scripts/pagecache_step.py --program P7B --cache-mb 1024 --steps 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CASES = ("resident", "evicted", "prefetch")
UFS4_BYTES_PER_S = 4.0e9
MADV_DONTNEED = 4           # Linux: drop this process's page table entries of the range (file pages stay cached)


def _io_read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def _cgroup_dir(name: str) -> tuple[Path, str]:
    """A new memory cgroup (v1 if its memory hierarchy is mounted, else v2) and its limit file's name."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        path, limit = v1 / name, "memory.limit_in_bytes"
    else:
        root = Path("/sys/fs/cgroup")
        if "memory" not in (root / "cgroup.controllers").read_text().split():
            raise SystemExit("Error: no memory cgroup controller here (cgroup v1 memory or v2 memory needed)")
        path, limit = root / name, "memory.max"
    path.mkdir(exist_ok=True)
    return path, limit


def _child(args) -> dict:
    import torch

    from toolchain.lora import init_lora
    from toolchain.program import ProgramDir
    from toolchain.program.spec import flat_state, state_layout
    from toolchain.runtime import LayerLoop
    from toolchain.runtime.program_runtime import open_runtime

    torch.set_num_threads(args.threads)
    pdir = ProgramDir(Path(args.program))
    loop = LayerLoop(pdir, open_runtime(pdir, "executorch", threads=args.threads), prefetch=args.case == "prefetch")
    state = flat_state(state_layout(pdir.arch, pdir.lora_config, pdir.optimizer),
                       init_lora(pdir.arch, pdir.lora_config, seed=0, zero_b=False))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, pdir.arch.vocab, (pdir.seq_len,), generator=gen)
    weights = Path(pdir.weights_file)
    out = {"case": args.case, "weights_bytes": weights.stat().st_size, "steps": []}
    loop.train_step(ids, ids.clone(), 1e-4, state)          # warm-up: arenas, kernels, every page touched once
    if args.case != "resident":
        from toolchain.memory.measure import read_status

        cg, limit_file = _cgroup_dir(args.cgroup)
        (cg / "cgroup.procs").write_text(str(os.getpid()))
        # drop the file's pages charged before the move: unmap them from this process (a file page mapped
        # anywhere is not dropped), then drop them from the page cache
        from toolchain.runtime.prefetch import LayerPrefetcher

        unmap = LayerPrefetcher(pdir.weights(), pdir.arch.layers)
        for start, length in unmap.ranges.values():
            unmap._madvise(start, length, MADV_DONTNEED)
        fd = os.open(weights, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        # what the cgroup is charged for already (v1 moves no charges with the task: about nothing; v2 the
        # process's memory), plus what the step may add, plus the page cache left for the weights
        usage_file = "memory.usage_in_bytes" if limit_file == "memory.limit_in_bytes" else "memory.current"
        charged = int((cg / usage_file).read_text())
        limit = charged + int((args.anon_headroom_mb + args.cache_mb) * 2**20)
        out.update(charged_before_bytes=charged, rss_anon_bytes=read_status().rss_anon)
        (cg / limit_file).write_text(str(limit))
        out.update(cgroup=str(cg), limit_bytes=limit, cache_mb=args.cache_mb, anon_headroom_mb=args.anon_headroom_mb)
    for _ in range(args.steps):
        r0, c0, t0 = _io_read_bytes(), time.process_time(), time.perf_counter()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        loss = loop.train_step(ids, ids.clone(), 1e-4, state)
        out["steps"].append({"wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - c0, 3),
                             "read_bytes": _io_read_bytes() - r0,
                             "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0,
                             "loss": loss})
    if loop.prefetcher is not None:
        out["prefetch_calls"], out["prefetch_bytes"] = loop.prefetcher.calls, loop.prefetcher.bytes
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", required=True, help="exported program directory (ExecuTorch)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated among {','.join(CASES)}")
    ap.add_argument("--cache-mb", type=float, default=1024.0, help="page cache the cgroup leaves for the weights")
    ap.add_argument("--anon-headroom-mb", type=float, default=1024.0,
                    help="anonymous memory the step may add above the process's after the warm-up step")
    ap.add_argument("--steps", type=int, default=1, help="measured steps per case (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cgroup", default=f"pagecache-step-{os.getpid()}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        Path(args.child).write_text(json.dumps(_child(args)))
        return 0
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        print(f"Error: unknown case(s) {', '.join(bad)}; choose among {', '.join(CASES)}", file=sys.stderr)
        return 2
    if not Path(args.program, "manifest.json").is_file():
        print(f"Error: {args.program} is not a program directory (no manifest.json)", file=sys.stderr)
        return 2
    rows = []
    for case in cases:
        cgroup = f"pagecache-step-{os.getpid()}-{case}"
        tmp = Path(f"/tmp/pagecache-{os.getpid()}-{case}.json")
        cmd = [sys.executable, __file__, "--program", args.program, "--child", str(tmp), "--case", case,
               "--cache-mb", str(args.cache_mb), "--anon-headroom-mb", str(args.anon_headroom_mb),
               "--steps", str(args.steps), "--threads", str(args.threads), "--cgroup", cgroup]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"Error: case {case} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}",
                      file=sys.stderr)
                return 1
            row = json.loads(tmp.read_text())
        finally:
            tmp.unlink(missing_ok=True)
            for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
                if (root / cgroup).is_dir():
                    (root / cgroup).rmdir()
        for s in row["steps"]:
            s["ufs4_read_s"] = round(s["read_bytes"] / UFS4_BYTES_PER_S, 3)
        rows.append(row)
        for k, s in enumerate(row["steps"], 1):
            print(f"{case:<9} step {k}  wall {s['wall_s']:8.2f} s  cpu {s['cpu_s']:8.2f} s  read "
                  f"{s['read_bytes'] / 2**20:9.1f} MiB  major faults {s['major_faults']:8d}  loss {s['loss']:.6f}  "
                  f"UFS 4.0 read {s['ufs4_read_s']:.2f} s", flush=True)
    doc = {"program": str(Path(args.program).resolve()), "cases": rows, "threads": args.threads,
           "ufs4_bytes_per_s": UFS4_BYTES_PER_S,
           "command": " ".join(["python", "scripts/pagecache_step.py", *sys.argv[1:]])}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
