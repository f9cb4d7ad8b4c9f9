"""Peak anonymous memory of one DPO step beside one SFT step of the same exported program on ExecuTorch (the
`toolchain bench memory` way: one fresh process per mode with phone-like malloc (`PHONE_LIKE_MALLOC_ENV`), the
program loaded and one warm-up step run, then the measured step's anonymous high-water mark above the anonymous
memory just before it).

    toolchain export --model qwen2.5-0.5b --init random --seq-len 256 --no-generate --preference --out P
    PYTHONPATH=. python scripts/bench_dpo_memory.py --program P [--modes sft,dpo,dpo_same] [--json out.json]
    PYTHONPATH=. python scripts/bench_dpo_memory.py --eager qwen2.5-0.5b --seq-len 256 [--modes ...]

`--eager MODEL` measures the eager MeSP steps instead (`mesp_step` / `mesp.dpo.dpo_step`, SGD applied per layer as
each layer's gradient appears, on the int4 weights memory-mapped from `toolchain bench memory`'s weights cache, LoRA
r8 on all 7 projections, random weights): the same structure as the program's steps, no export needed.

Modes: sft (`LayerLoop.train_step`, every layer's input kept), sft_groupsS (checkpoint groups of S), dpo
(`LayerLoop.pair_step` / `dpo_step` as they run by default: every input of the chosen sequence kept, the rejected
one's in graded groups, `mesp.step.second_sequence_groups`), dpo_same (every input of both kept: the layout before
the graded groups), dpo_groupsS (both sequences in groups of S). Rows are random ids of seq_len tokens; a pair's
two sequences share their first `--prompt-frac` x seq_len tokens (the prompt; default 0.25; 0: an empty prompt),
labels -100 there, and differ after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _rows(t: int, vocab: int, prompt_frac: float):
    """(ids [2, t], labels [2, t]): two random sequences sharing their first round(prompt_frac * t) ids."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, t), generator=g)
    p = round(prompt_frac * t)
    ids[1, :p] = ids[0, :p]
    labels = ids.clone()
    labels[:, :p] = -100
    return ids, labels


def _layout(mode: str) -> tuple[int, str]:
    """(layers_per_checkpoint, second_groups) of a mode."""
    return (int(mode.split("groups")[1]) if "groups" in mode else 1), ("same" if mode.endswith("_same") else "graded")


def worker(program: Path, mode: str, threads: int, prompt_frac: float) -> dict:
    from toolchain.memory.measure import measure_peak
    from toolchain.program import ProgramDir
    from toolchain.runtime.loop import LayerLoop
    from toolchain.runtime.program_runtime import open_runtime

    pdir = ProgramDir(program)
    runtime = open_runtime(pdir, "executorch", threads=threads, use="train")
    loop = LayerLoop(pdir, runtime)
    state = pdir.state_init()
    ids, labels = _rows(pdir.seq_len, min(pdir.arch.vocab, 32000), prompt_frac)
    groups, second = _layout(mode)

    def step() -> None:
        if mode.startswith("sft"):
            loop.train_step(ids[0], labels[0], 1e-4, state, layers_per_checkpoint=groups)
        else:
            loop.pair_step(((ids[0], labels[0]), (ids[1], labels[1])), lambda a, b: (0.5, -0.5), 1e-4, state,
                           layers_per_checkpoint=groups, second_groups=second)

    step()                                      # warm-up: methods loaded, arenas allocated
    cpu = time.process_time()
    with measure_peak() as m:
        step()
    cpu = time.process_time() - cpu
    return {"mode": mode, "peak_anon_bytes": m.peak_anon_bytes, "anon_before_bytes": m.anon_before_bytes,
            "step_peak_mib": round((m.peak_anon_bytes - m.anon_before_bytes) / 2**20, 2),
            "peak_mib": round(m.peak_anon_bytes / 2**20, 2), "cpu_s": round(cpu, 2),
            "file_drift_bytes": m.file_drift_bytes}


def eager_worker(model: str, seq_len: int, mode: str, threads: int, prompt_frac: float) -> dict:
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
    ids, labels = _rows(seq_len, arch.vocab, prompt_frac)
    groups, second = _layout(mode)

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
                         layers_per_checkpoint=groups, second_groups=second)

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
    ap.add_argument("--modes", default="sft,dpo,dpo_same")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-frac", type=float, default=0.25,
                    help="the share of seq_len a pair's sequences have in common (the prompt; 0: none)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if (args.program is None) == (args.eager is None):
        sys.exit("give --program P or --eager MODEL")
    if args.worker:
        print(json.dumps(worker(args.program, args.worker, args.threads, args.prompt_frac) if args.eager is None
                         else eager_worker(args.eager, args.seq_len, args.worker, args.threads, args.prompt_frac)))
        return
    from toolchain.memory.measure import PHONE_LIKE_MALLOC_ENV

    rows = []
    for mode in args.modes.split(","):
        what = ["--program", str(args.program)] if args.eager is None else ["--eager", args.eager, "--seq-len",
                                                                              str(args.seq_len)]
        out = subprocess.run([sys.executable, __file__, *what, "--threads", str(args.threads), "--prompt-frac",
                              str(args.prompt_frac), "--worker", mode],
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
                                         "threads": args.threads, "prompt_frac": args.prompt_frac, "rows": rows},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
