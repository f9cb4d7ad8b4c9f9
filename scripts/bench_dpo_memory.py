"""Peak anonymous memory of one DPO step beside one SFT step of the same exported program on ExecuTorch (the
`toolchain bench memory` way: one fresh process per mode with phone-like malloc (`PHONE_LIKE_MALLOC_ENV`), the
program loaded and one warm-up step run, then the measured step's anonymous high-water mark above the anonymous
memory just before it).

    toolchain export --model qwen2.5-0.5b --init random --seq-len 256 --no-generate --preference --out P
    PYTHONPATH=. python scripts/bench_dpo_memory.py --program P [--modes sft,dpo,dpo_groups5] [--json out.json]
    PYTHONPATH=. python scripts/bench_dpo_memory.py --eager qwen2.5-0.5b --seq-len 256 [--modes ...]

`--eager MODEL` measures the eager MeSP steps instead (`mesp_step` / `mesp.dpo.dpo_step`, SGD applied per layer as
each layer's gradient appears, on the int4 weights memory-mapped from `toolchain bench memory`'s weights cache, LoRA
r8 on all 7 projections, random weights): the same structure as the program's steps, no export needed.

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
    from toolchain.runtime.program_runtime import open_runtime

    pdir = ProgramDir(program)
    runtime = open_runtime(pdir, "executorch", threads=threads, use="train")
    loop = LayerLoop(pdir, runtime)
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


def eager_worker(model: str, seq_len: int, mode: str, threads: int) -> dict:
    import torch

    from toolchain.bench.weights_cache import (default_cache_dir, ensure_quantized, ensure_weights_cache,
                                               load_quantized)
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.memory.measure import measure_peak
    from toolchain.mesp import mesp_step
    from toolchain.mesp.dpo import dpo_step
    from toolchain.text.dataset import DataRow

    torch.set_num_threads(threads)
    path = ensure_weights_cache(default_cache_dir(), model, "random", 0)
    ensure_quantized(path, "int4", 64)
    arch, weights = load_quantized(path, "int4", 64, 1 << 18)
    cfg = LoraConfig(rank=8, alpha=16.0)
    lora = init_lora(arch, cfg, seed=0, zero_b=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, arch.vocab, (2, seq_len), generator=g)
    labels = ids.clone()
    labels[:, : seq_len // 4] = -100
    groups = int(mode.split("groups")[1]) if "groups" in mode else 1

    def hook(i, grads):
        for t, p in grads.items():
            lora[i][t].a.sub_(1e-6 * p.a)
            lora[i][t].b.sub_(1e-6 * p.b)

    def step() -> None:
        with torch.no_grad():
            if mode.startswith("sft"):
                mesp_step(arch, weights, cfg, lora, ids[0], labels[0], on_layer_grads=hook, keep_grads=False,
                          layers_per_checkpoint=groups)
            else:
                dpo_step(arch, weights, cfg, lora, DataRow(ids[0], labels[0]), DataRow(ids[1], labels[1]),
                         (-1000.0, -1000.0), beta=0.1, on_layer_grads=hook, keep_grads=False,
                         layers_per_checkpoint=groups)

    step()
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
    ap.add_argument("--program", type=Path, default=None)
    ap.add_argument("--eager", default=None, metavar="MODEL")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--modes", default="sft,dpo,dpo_groups5")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if (args.program is None) == (args.eager is None):
        sys.exit("give --program P or --eager MODEL")
    if args.worker:
        print(json.dumps(worker(args.program, args.worker, args.threads) if args.eager is None
                         else eager_worker(args.eager, args.seq_len, args.worker, args.threads)))
        return
    from toolchain.memory.measure import PHONE_LIKE_MALLOC_ENV

    rows = []
    for mode in args.modes.split(","):
        what = ["--program", str(args.program)] if args.eager is None else ["--eager", args.eager, "--seq-len",
                                                                              str(args.seq_len)]
        out = subprocess.run([sys.executable, __file__, *what, "--threads", str(args.threads), "--worker", mode],
                             env={**os.environ, **PHONE_LIKE_MALLOC_ENV}, capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{mode:14s} peak {row['peak_mib']:8.2f} MiB  step {row['step_peak_mib']:7.2f} MiB above the memory just "
              f"before the step  CPU {row['cpu_s']:.2f} s", flush=True)
    base = next((r for r in rows if r["mode"] == "sft"), None)
    if base is not None:
        for r in rows:
            print(f"{r['mode']:14s} peak / sft peak = {r['peak_anon_bytes'] / base['peak_anon_bytes']:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"program": str(args.program), "eager": args.eager, "seq_len": args.seq_len,
                                         "threads": args.threads, "rows": rows},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
