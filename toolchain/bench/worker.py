"""One benchmark mode in a fresh process: `python -m toolchain.bench.worker run SPEC.json OUT.json`.

A fresh process per mode, so that no mode inherits another's heap. The order of events:
  1. import torch, set the thread count, trim malloc, read RssAnon: the baseline;
  2. map the frozen weights (file-backed: not counted), build the adapter and the batch;
  3. one warm-up step (touches every weight page, fills the allocator's caches);
  4. `repeat` measured steps, each with a fresh high-water mark (`memory.measure_peak`);
  5. the gradient check: the adapter re-initialized from its seed, one step whose hook copies the
     gradients to a safetensors file the parent compares across modes (exact modes only).
`python -m toolchain.bench.worker prepare SPEC.json` builds the weights cache (memory-hungry,
so it runs in its own process too). Exit code 2 with one stderr line on a ToolchainError.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from toolchain.errors import BadInput, ToolchainError

__all__ = ["main", "run_mode"]


def _lora_cfg(spec: dict):
    from toolchain.lora import LoraConfig

    return LoraConfig(rank=spec["rank"], alpha=spec["alpha"], targets=tuple(spec["targets"]))


def _executorch_runner(spec: dict):
    import importlib

    runner = getattr(importlib.import_module("toolchain.runtime"), "run_executorch_step", None)
    if runner is None or not spec.get("program_dir"):
        raise BadInput("executorch mode needs an exported program: not available yet")
    return runner(Path(spec["program_dir"]))


def _save_grads(path: Path, grads) -> None:
    from safetensors.torch import save_file

    from toolchain.lora import lora_state_dict

    save_file({k: v.contiguous() for k, v in lora_state_dict(tuple(grads)).items()}, str(path))


def _import_runtime() -> None:
    """Trigger torch's lazy imports before the baseline, the same for every mode: the first
    non-reentrant `checkpoint` imports torch._dynamo and friends (about 70 MB of Python modules),
    which is runtime, not the step's memory."""
    import torch
    from torch.utils.checkpoint import checkpoint

    x = torch.ones(3, requires_grad=True)
    checkpoint(torch.sin, x, use_reentrant=False).sum().backward()


def _measured_step(step, k: int, baseline_anon: int) -> dict:
    from toolchain.memory.measure import MIB, measure_peak

    with measure_peak() as m:
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step(k)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"peak_mb": round((m.peak_anon_bytes - baseline_anon) / MIB, 2), "step_s": round(wall, 4),
            "step_cpu_s": round(cpu, 4), "before_mb": round((m.anon_before_bytes - baseline_anon) / MIB, 2),
            "file_drift_mb": round(m.file_drift_bytes / MIB, 2), "loss": loss}


def run_mode(spec: dict) -> dict:
    """Measure one mode as described in the module docstring; returns the result row (MiB, s)."""
    import safetensors  # noqa: F401  (imported before the baseline: its import is not the step's memory)
    import torch

    from toolchain.bench.steps import EXACT_MODES, collect_hook, prepare_lora, sgd_hook, train_step
    from toolchain.bench.weights_cache import load_mmap_weights
    from toolchain.lora import init_lora
    from toolchain.memory.measure import MIB, read_status, release_free_memory
    from toolchain.mesp import StepOptions

    torch.set_num_threads(spec["threads"])
    mode, seed, lr = spec["mode"], spec["seed"], spec["lr"]
    _import_runtime()
    release_free_memory()
    baseline = read_status()
    arch, weights = load_mmap_weights(Path(spec["weights_dir"]))
    cfg = _lora_cfg(spec)
    options = StepOptions(loss_chunk=spec["loss_chunk"], mlp_chunk=spec["mlp_chunk"])
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, arch.vocab, (spec["seq_len"],), generator=gen)
    labels = input_ids.clone()
    if mode == "executorch":
        et_step = _executorch_runner(spec)
        step = lambda k: float(et_step(input_ids, labels))  # noqa: E731
    else:
        lora = prepare_lora(mode, init_lora(arch, cfg, seed=seed, zero_b=False))
        hook = sgd_hook(lora, lr)
        step = lambda k: train_step(mode, arch, weights, lora, cfg, input_ids, labels, hook,  # noqa: E731
                                    options=options, seed=seed + 1 + k, lr=lr)
    loss = step(0)  # warm-up
    runs = [_measured_step(step, k, baseline.rss_anon) for k in range(1, spec["repeat"] + 1)]
    end = read_status()
    row = {
        "mode": mode, "peak_mb": max(m["peak_mb"] for m in runs), "peak_mb_runs": [m["peak_mb"] for m in runs],
        "step_s": round(statistics.median(m["step_s"] for m in runs), 4), "step_s_runs": [m["step_s"] for m in runs],
        "step_cpu_s": round(statistics.median(m["step_cpu_s"] for m in runs), 4),
        "resident_before_step_mb": min(m["before_mb"] for m in runs), "loss": runs[-1]["loss"],
        "baseline_anon_mb": round(baseline.rss_anon / MIB, 2), "mapped_file_mb": round(end.rss_file / MIB, 2),
        "file_drift_mb": max((m["file_drift_mb"] for m in runs), key=abs), "threads": spec["threads"],
    }
    if spec.get("grads_out") and mode in EXACT_MODES:
        lora0 = prepare_lora(mode, init_lora(arch, cfg, seed=seed, zero_b=False))
        store: list = [{} for _ in range(arch.layers)]
        train_step(mode, arch, weights, lora0, cfg, input_ids, labels, collect_hook(store), options=options)
        _save_grads(Path(spec["grads_out"]), store)
    return row


def _prepare(spec: dict) -> None:
    from toolchain.bench.weights_cache import ensure_weights_cache

    ensure_weights_cache(Path(spec["cache_dir"]), spec["model"], spec["init"], spec["seed"])


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "prepare":
            _prepare(json.loads(Path(argv[1]).read_text()))
        elif len(argv) == 3 and argv[0] == "run":
            row = run_mode(json.loads(Path(argv[1]).read_text()))
            Path(argv[2]).write_text(json.dumps(row))
        else:
            print("usage: python -m toolchain.bench.worker prepare SPEC.json | run SPEC.json OUT.json", file=sys.stderr)
            return 64
    except ToolchainError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
