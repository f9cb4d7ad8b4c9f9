"""The eager MeSP step's peak at a preset's widths with fewer layers, beside the planner's estimate: what the planner's
width-dependent terms (a block's working set at d and f, the LM head over the whole vocabulary, the int4
dequantization transients it does not model) come to at 7B-8B widths, in minutes instead of the full model's hour
on a shared laptop. The layer-proportional terms (checkpoints, LoRA state) are closed forms the full-model
estimate adds.

Writes the preset's int4 weights with `--layers` layers (seeded random, streamed as `bench memory --quant int4`
writes them), then runs `bench memory`'s memory worker (`toolchain.bench.worker.run_memory`: fresh process,
phone-like allocator, a warm-up step, a measured step) with RssAnon also sampled every ~2 ms during each step
(independent of mapped pages moving under memory pressure, which VmHWM - RssFile is not).

    python scripts/bench_7b_widths.py --model qwen2.5-7b --layers 2 --cache-dir DIR --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def _write(model: str, layers: int, d: Path) -> None:
    from toolchain.bench.weights_cache import QUANT_ARCH_FILE, quantized_file
    from toolchain.models import get_preset
    from toolchain.models.source import RandomSource
    from toolchain.program.spec import QuantSpec
    from toolchain.program.weights_file import write_weights_streamed

    arch = dataclasses.replace(get_preset(model), layers=layers)
    d.mkdir(parents=True, exist_ok=True)
    out = quantized_file(d, "int4", 64, True)
    if not out.is_file():
        write_weights_streamed(out.with_suffix(".tmp"), RandomSource(arch, 0), QuantSpec("int4", 64, head=True))
        os.replace(out.with_suffix(".tmp"), out)
    (d / QUANT_ARCH_FILE).write_text(json.dumps(dataclasses.asdict(arch), indent=2, sort_keys=True))


def _measure(model: str, layers: int, d: Path) -> dict:
    from toolchain.bench import worker
    from toolchain.bench.memory import MemoryBenchConfig, planner_estimate, worker_spec
    from toolchain.memory.measure import read_status
    from toolchain.models import get_preset

    arch = dataclasses.replace(get_preset(model), layers=layers)
    cfg = MemoryBenchConfig(model=model, init="random", seed=0, seq_len=256, rank=8, modes=("mesp",), repeat=1,
                            cache_dir=d, quant="int4", quant_group=64)
    spec = dict(worker_spec(cfg, d, arch.layers), mode="mesp")
    orig, steps = worker._step_fn, []

    def timed(*a, **k):
        f = orig(*a, **k)

        def g(i):
            peak, stop = [0], threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], read_status().rss_anon)
                    time.sleep(0.002)
            th = threading.Thread(target=sample, daemon=True)
            th.start()
            t0, c0 = time.perf_counter(), time.process_time()
            r = f(i)
            steps.append({"step": i, "wall_s": round(time.perf_counter() - t0, 2),
                          "cpu_s": round(time.process_time() - c0, 2)})
            stop.set()
            th.join()
            steps[-1]["rss_anon_sampled_peak_mb"] = round(peak[0] / 2**20, 2)
            return r
        return g

    worker._step_fn = timed
    row = worker.run_memory(spec)
    row["steps"] = steps
    row["sampled_peak_mb"] = round(steps[-1]["rss_anon_sampled_peak_mb"] - row["baseline_anon_mb"], 2)
    row.update(planner_estimate("mesp", arch, cfg, 1))
    row["arch"] = dataclasses.asdict(arch)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--stage", choices=["all", "write", "measure"], default="all", help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = args.cache_dir / f"{args.model}-{args.layers}layers-int4"
    if args.stage == "write":
        _write(args.model, args.layers, d)
        return 0
    if args.stage == "measure":
        args.json.write_text(json.dumps(_measure(args.model, args.layers, d), indent=2))
        return 0
    base = [sys.executable, __file__, "--model", args.model, "--layers", str(args.layers), "--cache-dir",
            str(args.cache_dir), "--json", str(args.json)]
    # the writer and the measurement in separate processes: the writer's heap is not the step's baseline
    subprocess.run([*base, "--stage", "write"], check=True)
    subprocess.run([*base, "--stage", "measure"], check=True,
                   env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1"))
    row = json.loads(args.json.read_text())
    print(f"{args.model} widths, {args.layers} layers: peak {row['peak_mb']:.2f} MiB (sampled {row['sampled_peak_mb']:.2f}, "
          f"file drift {row['file_drift_mb']}), planner {row['planner_estimate_mb']:.2f} MiB "
          f"({row['planner_estimate_mb'] / row['peak_mb'] - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
