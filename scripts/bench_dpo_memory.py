"""Peak anonymous memory of one DPO step beside one SFT step of the same exported program on ExecuTorch (the
`toolchain bench memory` way: one fresh process per mode with phone-like malloc (`PHONE_LIKE_MALLOC_ENV`), the
program loaded and one warm-up step run, then the measured step's anonymous high-water mark above the anonymous
memory just before it).

    toolchain export --model qwen2.5-0.5b --init random --seq-len 256 --no-generate --preference --out P
    PYTHONPATH=. python scripts/bench_dpo_memory.py --program P [--modes sft,dpo,dpo_groups5] [--json out.json]

Modes: sft (`LayerLoop.train_step`, every layer's input kept), sft_groupsS (checkpoint groups of S), dpo
(`LayerLoop.pair_step`: chosen and rejected, both sequences' checkpoints), dpo_groupsS. Rows are random ids of
seq_len tokens (a pair: prompt seq_len/4, both responses the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def worker(program: Path, mode: str, threads: int) -> dict:
    import torch

    from toolchain.memory.measure import measure_peak
    from toolchain.program import ProgramDir
    from toolchain.runtime.loop import LayerLoop
    from toolchain.runtime.runners import open_runtime

    pdir = ProgramDir(program)
    runner = open_runtime(pdir, "executorch", threads=threads, use="train")
    loop = LayerLoop(pdir, runner)
    state = pdir.state_init()
    t, v = pdir.seq_len, pdir.arch.vocab
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(v, 32000), (2, t), generator=g)
    labels = ids.clone()
    labels[:, : t // 4] = -100
    groups = int(mode.split("groups")[1]) if "groups" in mode else 1

    def step() -> None:
        if mode.startswith("sft"):
            loop.train_step(ids[0], labels[0], 1e-4, state, layers_per_checkpoint=groups)
        else:
            loop.pair_step(((ids[0], labels[0]), (ids[1], labels[1])), lambda a, b: (0.5, -0.5), 1e-4, state,
                           layers_per_checkpoint=groups)

    step()                                      # warm-up: methods loaded, arenas allocated
    cpu = time.process_time()
    with measure_peak() as m:
        step()
    cpu = time.process_time() - cpu
    return {"mode": mode, "peak_anon_bytes": m.peak_anon_bytes, "anon_before_bytes": m.anon_before_bytes,
            "step_peak_mib": round((m.peak_anon_bytes - m.anon_before_bytes) / 2**20, 2),
            "peak_mib": round(m.peak_anon_bytes / 2**20, 2), "cpu_s": round(cpu, 2),
            "file_drift_bytes": m.file_drift_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", type=Path, required=True)
    ap.add_argument("--modes", default="sft,dpo,dpo_groups5")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.program, args.worker, args.threads)))
        return
    from toolchain.memory.measure import PHONE_LIKE_MALLOC_ENV

    rows = []
    for mode in args.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--program", str(args.program), "--threads", str(args.threads),
                              "--worker", mode], env={**os.environ, **PHONE_LIKE_MALLOC_ENV}, capture_output=True,
                             text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{mode:14s} peak {row['peak_mib']:8.2f} MiB  step {row['step_peak_mib']:7.2f} MiB above the loaded "
              f"program  CPU {row['cpu_s']:.2f} s", flush=True)
    base = next((r for r in rows if r["mode"] == "sft"), None)
    if base is not None:
        for r in rows:
            print(f"{r['mode']:14s} peak / sft peak = {r['peak_anon_bytes'] / base['peak_anon_bytes']:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"program": str(args.program), "threads": args.threads, "rows": rows},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
