"""Benchmark processes: `python -m toolchain.bench.worker prepare|memory|timing SPEC.json [OUT.json]`.

- `memory`: one mode in a fresh process, so that no mode inherits another's heap:
  1. import torch (and trigger its lazy imports), set the thread count, trim malloc, read
     RssAnon: the baseline;
  2. map the frozen weights (file-backed: not counted), build the adapter and the batch;
  3. one warm-up step (touches every weight page, fills the allocator's caches);
  4. `repeat` measured steps, each with a fresh high-water mark (`memory.measure_peak`).
- `timing`: every mode in ONE process, steps interleaved round by round (the order reversed every
  other round), so that a noisy machine slows all modes alike; the minimum per mode is reported.
  The same process computes each exact mode's gradients at the initial adapter and compares them,
  then counts each mode's FLOPs from one more step and times the host's matmuls at that step's
  shapes (`bench.flops`).
- `prepare`: builds the weights cache (memory-hungry, so in its own process too); with --quant only the
  quantized weights file, streamed from the model's source when no float32 cache exists.
Exit code 2 with one stderr line on a ToolchainError.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from toolchain.errors import BadInput, ToolchainError

__all__ = ["main", "run_memory", "run_timing", "worker_setup"]


class _Setup(NamedTuple):
    arch: Any
    weights: Any
    cfg: Any
    options: Any
    input_ids: Any
    labels: Any


def _import_runtime() -> None:
    """Trigger torch's lazy imports before the baseline, the same for every mode: the first
    non-reentrant `checkpoint` imports torch._dynamo and friends (about 70 MB of Python modules),
    which is runtime, not the step's memory."""
    import safetensors  # noqa: F401
    import torch
    from torch.utils.checkpoint import checkpoint

    x = torch.ones(3, requires_grad=True)
    checkpoint(torch.sin, x, use_reentrant=False).sum().backward()


def worker_setup(spec: dict) -> _Setup:
    import torch

    from toolchain.bench.weights_cache import load_mmap_weights, load_quantized
    from toolchain.lora import LoraConfig
    from toolchain.mesp import StepOptions

    if spec.get("quant", "none") != "none":
        # the program's weight format, memory-mapped; projections dequantized per chunk where used
        arch, weights = load_quantized(Path(spec["weights_dir"]), spec["quant"], spec["quant_group"],
                                       spec["quant_chunk_elems"], head=spec.get("quant_head", True))
    else:
        arch, weights = load_mmap_weights(Path(spec["weights_dir"]))
    cfg = LoraConfig(rank=spec["rank"], alpha=spec["alpha"], targets=tuple(spec["targets"]))
    options = StepOptions(loss_chunk=spec["loss_chunk"], vocab_chunk=spec["vocab_chunk"], mlp_chunk=spec["mlp_chunk"])
    gen = torch.Generator().manual_seed(spec["seed"])
    input_ids = torch.randint(0, arch.vocab, (spec["seq_len"],), generator=gen)
    return _Setup(arch, weights, cfg, options, input_ids, input_ids.clone())


def _program_step(spec: dict, s: _Setup, target: str, pdir=None, *, groups: bool = False) -> Callable[[int], float]:
    """One step of the exported program on its runtime, driven by the host's layer loop. The state is
    held as an app holds it (one flat array) and starts from the eager modes' adapter, so the program's
    loss is comparable with theirs (bench.memory.check_program made sure the configs agree)."""
    from toolchain.lora import init_lora
    from toolchain.program import ProgramDir
    from toolchain.program.spec import flat_state, state_layout
    from toolchain.runtime import LayerLoop
    from toolchain.runtime.program_runtime import open_runtime

    if not spec.get("program_dir"):
        raise BadInput(f"{target} mode needs --program DIR, a program directory exported with --target {target}")
    pdir = pdir or ProgramDir(Path(spec["program_dir"]))
    loop = LayerLoop(pdir, open_runtime(pdir, target, threads=spec["threads"]))
    layout = state_layout(pdir.arch, pdir.lora_config, pdir.optimizer)
    state = flat_state(layout, init_lora(s.arch, s.cfg, seed=spec["seed"], zero_b=False))
    per = spec.get("layers_per_checkpoint", 1) if groups else 1
    return lambda k: loop.train_step(s.input_ids, s.labels, spec["lr"], state, layers_per_checkpoint=per)


def _step_fn(spec: dict, s: _Setup, mode: str, pdir=None) -> Callable[[int], float]:
    """One SGD training step of `mode` on its own adapter; the argument is the step index. `pdir`: the
    program directory of the executorch/onnx modes, when already read."""
    from toolchain.bench.steps import prepare_lora, program_target, sgd_hook, train_step, uses_groups
    from toolchain.lora import init_lora

    if program_target(mode):
        # the row's own program (`bench memory --program A --program B`: row keys mode, mode#2, ...)
        spec = dict(spec, program_dir=spec.get("program_dirs", {}).get(mode, spec.get("program_dir")))
        return _program_step(spec, s, program_target(mode), pdir, groups=uses_groups(mode))
    lora = prepare_lora(mode, init_lora(s.arch, s.cfg, seed=spec["seed"], zero_b=False))
    hook = sgd_hook(lora, spec["lr"])
    return lambda k: train_step(s.arch, s.weights, s.cfg, lora, s.input_ids, s.labels, mode=mode, hook=hook,
                                options=s.options, seed=spec["seed"] + 1 + k, lr=spec["lr"],
                                layers_per_checkpoint=spec.get("layers_per_checkpoint", 1))


def _load_native_kernels() -> None:
    """The native kernel library (toolchain/native), loaded before the baseline like the runtime itself, for every
    ExecuTorch mode alike; where it cannot load, an int8 program's runtime refuses it later with the reason."""
    from toolchain.native import KernelUnavailable, load_kernels

    try:
        load_kernels()
    except KernelUnavailable:
        pass


def run_memory(spec: dict) -> dict:
    """Peak anonymous memory of `spec["mode"]` as described in the module docstring (MiB)."""
    import torch

    from toolchain.memory.measure import MIB, measure_peak, read_status, release_free_memory

    from toolchain.bench.steps import program_target

    torch.set_num_threads(spec["threads"])
    _import_runtime()
    target = program_target(spec["mode"])
    if target == "executorch":
        # The ExecuTorch Python bindings' import (~130 MB of Python-side module state) is host
        # overhead an app does not have; the program itself (load, arenas, state) is loaded after
        # the baseline and counted.
        from executorch.runtime import Runtime

        from toolchain.runtime.executorch_runtime import load_quantized_kernels

        Runtime.get()
        load_quantized_kernels()   # the int4 methods' kernel library, as an app links it
        _load_native_kernels()     # and the native kernels (--compute int8 and fused programs call them)
    if target == "onnx":
        # Likewise the onnxruntime Python module (its sessions, arenas and state are counted).
        import onnxruntime  # noqa: F401
    pdir = None
    spec = dict(spec, program_dir=spec.get("program_dirs", {}).get(spec["mode"], spec.get("program_dir")))
    if target and spec.get("program_dir"):
        # Likewise the manifest as Python objects and its schema validator (~3 MB; an app's parsed
        # manifest is a few KB). Everything the program loads and allocates comes after the baseline.
        from toolchain.program import ProgramDir

        pdir = ProgramDir(Path(spec["program_dir"]))
    release_free_memory()
    baseline = read_status()
    s = worker_setup(spec)
    step = _step_fn(spec, s, spec["mode"], pdir)
    step(0)  # warm-up
    peaks, before, drift = [], [], []
    for k in range(1, spec["repeat"] + 1):
        with measure_peak() as m:
            loss = step(k)
        peaks.append(round((m.peak_anon_bytes - baseline.rss_anon) / MIB, 2))
        before.append(round((m.anon_before_bytes - baseline.rss_anon) / MIB, 2))
        drift.append(round(m.file_drift_bytes / MIB, 2))
    return {"mode": spec["mode"], "peak_mb": max(peaks), "peak_mb_runs": peaks,
            "resident_before_step_mb": min(before), "loss": loss, "baseline_anon_mb": round(baseline.rss_anon / MIB, 2),
            "mapped_file_mb": round(read_status().rss_file / MIB, 2), "file_drift_mb": max(drift, key=abs)}


def _grad_diffs(spec: dict, s: _Setup, modes: list[str]) -> dict[str, float]:
    """Each exact mode's max relative gradient difference (max over tensors of max|g - ref| / max|ref|)
    to the reference: the first of autograd, mebp, mesp that runs."""
    from toolchain.bench.steps import EXACT_MODES, collect_hook, prepare_lora, train_step
    from toolchain.lora import init_lora, lora_state_dict

    grads = {}
    for mode in (m for m in EXACT_MODES if m in modes):
        store: list = [{} for _ in range(s.arch.layers)]
        lora0 = prepare_lora(mode, init_lora(s.arch, s.cfg, seed=spec["seed"], zero_b=False))
        train_step(s.arch, s.weights, s.cfg, lora0, s.input_ids, s.labels, mode=mode, hook=collect_hook(store),
                   options=s.options, layers_per_checkpoint=spec.get("layers_per_checkpoint", 1))
        grads[mode] = lora_state_dict(tuple(store))
    if not grads:
        return {}
    ref = next(iter(grads.values()))
    return {mode: max(float((g[k].double() - r.double()).abs().max() / (r.double().abs().max() or 1.0))
                      for k, r in ref.items()) for mode, g in grads.items()}


def run_timing(spec: dict) -> dict:
    """Step times of every mode in `spec["modes"]`, interleaved, plus the gradient check."""
    import torch

    torch.set_num_threads(spec["threads"])
    s = worker_setup(spec)
    modes = spec["modes"]
    steps = {mode: _step_fn(spec, s, mode) for mode in modes}
    for step in steps.values():
        step(0)  # warm-up
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for k in range(1, spec["repeat"] + 1):
        for mode in (modes if k % 2 else modes[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            steps[mode](k)
            wall[mode].append(round(time.perf_counter() - t0, 4))
            cpu[mode].append(round(time.process_time() - c0, 4))
    diffs = _grad_diffs(spec, s, modes) if spec.get("check_grads") else {}
    flops = _flops(spec, s, steps, {mode: (min(wall[mode]), min(cpu[mode])) for mode in modes})
    return {"reference_mode": next(iter(diffs), None),
            "modes": {mode: {"step_s": min(wall[mode]), "step_s_runs": wall[mode], "step_cpu_s": min(cpu[mode]),
                             "grad_max_rel_diff": diffs.get(mode), **flops[mode]} for mode in modes}}


def _flops(spec: dict, s: _Setup, steps: dict[str, Callable[[int], float]],
           step_s: dict[str, tuple[float, float]]) -> dict:
    """Per mode: its step's FLOPs counted from one more step (bench.flops), the host's matmul rate at that
    step's shapes, and the timed step (wall, CPU) as GFLOP/s and utilisation. A program mode is counted on the eager
    step it exports (mesp, or mesp_groups for *_groups): the program is the same ops on another runtime."""
    from toolchain.bench.flops import count_step_flops, flops_fields, matmul_rate
    from toolchain.bench.steps import program_target, uses_groups

    counted: dict[str, tuple] = {}
    out = {}
    for mode, seconds in step_s.items():
        source = ("mesp_groups" if uses_groups(mode) else "mesp") if program_target(mode) else mode
        if source not in counted:
            step = steps.get(source) or _step_fn(spec, s, source)
            flops = count_step_flops(lambda: step(spec["repeat"] + 1))
            counted[source] = (flops, matmul_rate(flops.gemms, seed=spec["seed"]))
        out[mode] = flops_fields(*counted[source], *seconds, counted_from=source)
    return out


def _prepare(spec: dict) -> None:
    from toolchain.bench.weights_cache import ensure_quantized, ensure_weights_cache

    from toolchain.bench.weights_cache import weights_cache_dir

    if spec.get("quant", "none") != "none":
        # every mode runs on the quantized file: written from the float32 shards if cached, else streamed from
        # the model's source (no float32 copy of the model at all)
        path = weights_cache_dir(Path(spec["cache_dir"]), spec["model"], spec["init"], spec["seed"])
        ensure_quantized(path, spec["quant"], spec["quant_group"], head=spec.get("quant_head", True),
                         model=spec["model"], init=spec["init"], seed=spec["seed"])
    else:
        ensure_weights_cache(Path(spec["cache_dir"]), spec["model"], spec["init"], spec["seed"])


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the bench process that started this worker dies, so a stopped or killed
    bench leaves no worker running on (PR_SET_PDEATHSIG; then check the parent did not die first)."""
    import ctypes
    import ctypes.util
    import os
    import signal

    parent = os.environ.get("TOOLCHAIN_BENCH_PARENT")
    if sys.platform != "linux" or not parent:
        return
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):
        sys.exit(143)


def main(argv: list[str]) -> int:
    _die_with_parent()
    commands = {"memory": run_memory, "timing": run_timing}
    try:
        if len(argv) == 2 and argv[0] == "prepare":
            _prepare(json.loads(Path(argv[1]).read_text()))
        elif len(argv) == 3 and argv[0] in commands:
            result = commands[argv[0]](json.loads(Path(argv[1]).read_text()))
            Path(argv[2]).write_text(json.dumps(result))
        else:
            print("usage: python -m toolchain.bench.worker prepare SPEC.json | memory|timing SPEC.json OUT.json",
                  file=sys.stderr)
            return 64
    except ToolchainError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
