"""`bench memory`: every training mode side by side, each measured in a fresh process.

Per mode, `toolchain.bench.worker` maps the cached float32 weights, runs a warm-up step and then
`repeat` measured SGD steps (peak anonymous memory as `memory.measure` defines it, wall time).
The exact modes also write their gradients at the initial adapter; this module compares them
(max relative difference against the reference mode) and adds the analytic breakdown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolchain.bench.weights_cache import default_cache_dir, weights_cache_dir
from toolchain.errors import BadInput
from toolchain.lora import ALL_TARGETS, LoraConfig
from toolchain.memory.breakdown import step_breakdown
from toolchain.mesp import StepOptions
from toolchain.models import PRESETS, Qwen25Arch

__all__ = ["BENCH_MODES", "COUNTED", "MemoryBenchConfig", "run_memory_bench", "format_table", "grads_max_rel_diff"]

BENCH_MODES: tuple[str, ...] = ("autograd", "mebp", "mesp", "mezo", "executorch")
_REFERENCE_ORDER = ("autograd", "mebp", "mesp")

COUNTED = ("peak_mb = max over the measured steps of (VmHWM - RssFile - RssShmem) from /proc/self/status, "
           "the high-water mark reset right before the step (clear_refs 5, after a warm-up step and malloc_trim), "
           "minus the worker's RssAnon before the model was loaded (after importing torch). Counted: LoRA "
           "parameters, gradients, optimizer state (none for SGD), checkpoints, activations, transients, "
           "allocator slack. Not counted: the frozen weights (float32, memory-mapped from safetensors: clean "
           "file-backed pages, as on phones), the Python/torch runtime. MB = MiB (2**20 bytes).")
_ALLOCATOR_NOTE = {
    "phone-like": (" Memory comes from a worker whose glibc maps every block >= 128 KiB on its own "
                   "(MALLOC_MMAP_THRESHOLD_=131072, as phone allocators do with large blocks); step_s from a second "
                   "worker with glibc's defaults, whose peak is peak_glibc_default_mb (it includes heap "
                   "fragmentation, which varies from step to step)."),
    "glibc": " Memory and time come from one worker with glibc's default allocator (peaks include heap fragmentation).",
}


@dataclass(frozen=True)
class MemoryBenchConfig:
    """One `bench memory` run.

    Args:
        model: preset or checkpoint directory. Default: "tiny".
        init: "random" (seeded) or "pretrained". Default: "random".
        modes: any of BENCH_MODES, each measured in its own process, in this order.
        alpha: LoRA alpha; None means 2 x rank.
        lr: SGD learning rate of the measured steps. Default: 1e-4 (the MeSP paper's).
        threads: torch intra-op threads in every worker (the same for every mode).
        check_grads: compare the exact modes' gradients at the initial adapter. Default: True.
        allocator: "phone-like" measures memory in a process started with
            `memory.measure.PHONE_LIKE_MALLOC_ENV` (large blocks mapped and unmapped one by one, as
            phone allocators do) and time in a second process with glibc's defaults; "glibc" does
            both in one default process. Default: "phone-like".
    """

    model: str = "tiny"
    init: str = "random"
    seed: int = 0
    seq_len: int = 256
    rank: int = 8
    alpha: float | None = None
    targets: tuple[str, ...] = ALL_TARGETS
    modes: tuple[str, ...] = ("autograd", "mebp", "mesp")
    repeat: int = 1
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    lr: float = 1e-4
    loss_chunk: int = StepOptions().loss_chunk
    mlp_chunk: int | None = StepOptions().mlp_chunk
    cache_dir: Path = field(default_factory=default_cache_dir)
    program_dir: Path | None = None
    check_grads: bool = True
    allocator: str = "phone-like"

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in BENCH_MODES]
        if unknown or not self.modes:
            raise BadInput(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; choose from {','.join(BENCH_MODES)}")
        if len(set(self.modes)) != len(self.modes):
            raise BadInput(f"`modes` lists a mode twice: {','.join(self.modes)}")
        for name, low in (("seq_len", 2), ("repeat", 1), ("threads", 1), ("rank", 1)):
            if getattr(self, name) < low:
                raise BadInput(f"`{name}` must be >= {low}, got {getattr(self, name)}")
        if self.allocator not in ("phone-like", "glibc"):
            raise BadInput(f"`allocator` must be phone-like or glibc, got {self.allocator!r}")
        StepOptions(self.loss_chunk, self.mlp_chunk)
        self.lora_config()  # validates targets

    def lora_config(self) -> LoraConfig:
        return LoraConfig(rank=self.rank, alpha=self.alpha if self.alpha is not None else 2.0 * self.rank,
                          targets=self.targets)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cache_dir"] = str(self.cache_dir)
        d["program_dir"] = str(self.program_dir) if self.program_dir else None
        d["targets"], d["modes"] = list(self.targets), list(self.modes)
        d["alpha"] = self.lora_config().alpha
        d["dtype"] = "float32"
        d["lora_init"] = "A and B uniform(+-1/sqrt(in)) from the seed (B != 0, so every gradient is checked)"
        d["data"] = "seq_len random token ids from the seed, labels = input_ids"
        return d


def _worker(args: list[str], threads: int, extra_env: dict[str, str] | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS=str(threads), **(extra_env or {}))
    proc = subprocess.run([sys.executable, "-m", "toolchain.bench.worker", *args], capture_output=True, text=True,
                          env=env)
    if proc.returncode == 2:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "benchmark worker failed"
        raise BadInput(last.split(": ", 1)[-1])
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker {' '.join(args)} exited with {proc.returncode}:\n{proc.stderr[-4000:]}")


def _check_executorch(config: MemoryBenchConfig) -> None:
    import importlib

    hook = getattr(importlib.import_module("toolchain.runtime"), "run_executorch_step", None)
    if hook is None or config.program_dir is None:
        raise BadInput("executorch mode needs an exported program: not available yet")


def _arch_for(config: MemoryBenchConfig) -> Qwen25Arch | None:
    arch = PRESETS.get(config.model)
    if arch is None and config.init == "random":
        raise BadInput(f"unknown preset {config.model!r}; --init random needs one of {', '.join(PRESETS)}")
    if arch is not None and config.seq_len > arch.max_positions:
        raise BadInput(f"--seq-len {config.seq_len} exceeds {config.model}'s {arch.max_positions} positions")
    return arch


def grads_max_rel_diff(a_path: Path, ref_path: Path) -> float:
    """max over tensors of max|a - ref| / max|ref| (float64)."""
    from safetensors.torch import load_file

    a, ref = load_file(str(a_path)), load_file(str(ref_path))
    if sorted(a) != sorted(ref):
        raise RuntimeError(f"gradient files {a_path.name} and {ref_path.name} hold different tensors")
    worst = 0.0
    for k, r in ref.items():
        r = r.double()
        scale = float(r.abs().max()) or 1.0
        worst = max(worst, float((a[k].double() - r).abs().max()) / scale)
    return worst


def _spec(config: MemoryBenchConfig, mode: str, weights_dir: Path, grads_out: Path | None) -> dict:
    cfg = config.lora_config()
    return {"mode": mode, "weights_dir": str(weights_dir), "rank": cfg.rank, "alpha": cfg.alpha,
            "targets": list(cfg.targets), "seq_len": config.seq_len, "seed": config.seed, "repeat": config.repeat,
            "threads": config.threads, "lr": config.lr, "loss_chunk": config.loss_chunk,
            "mlp_chunk": config.mlp_chunk, "grads_out": str(grads_out) if grads_out else None,
            "program_dir": str(config.program_dir) if config.program_dir else None}


def _add_breakdowns(rows: list[dict], arch: Qwen25Arch, config: MemoryBenchConfig) -> None:
    for row in rows:
        if row["mode"] == "executorch":
            continue
        b = step_breakdown(row["mode"], arch, config.lora_config(), config.seq_len, loss_chunk=config.loss_chunk,
                           mlp_chunk=config.mlp_chunk)
        row["breakdown"] = b.as_mb()


def _run_mode(config: MemoryBenchConfig, mode: str, weights_dir: Path, tmp: Path) -> tuple[dict, Path | None]:
    """Run one mode's worker(s); returns its row and its gradient file (exact modes, if checked)."""
    from toolchain.memory.measure import PHONE_LIKE_MALLOC_ENV

    grads_out = tmp / f"grads-{mode}.safetensors" if config.check_grads else None

    def run(tag: str, grads: Path | None, env: dict[str, str] | None) -> dict:
        spec_path, out_path = tmp / f"spec-{mode}-{tag}.json", tmp / f"result-{mode}-{tag}.json"
        spec_path.write_text(json.dumps(_spec(config, mode, weights_dir, grads)))
        _worker(["run", str(spec_path), str(out_path)], config.threads, env)
        return json.loads(out_path.read_text())

    timed = run("glibc", grads_out, None)
    if config.allocator == "glibc":
        row = dict(timed, allocator="glibc default")
    else:
        counted = run("phone", None, PHONE_LIKE_MALLOC_ENV)
        row = dict(counted, allocator=f"glibc with {', '.join(f'{k}={v}' for k, v in PHONE_LIKE_MALLOC_ENV.items())}",
                   peak_glibc_default_mb=timed["peak_mb"], step_s_phone_like_allocator=counted["step_s"])
        row.update({k: timed[k] for k in ("step_s", "step_s_runs", "step_cpu_s")})
    return row, grads_out if grads_out is not None and grads_out.is_file() else None


def run_memory_bench(config: MemoryBenchConfig, *, on_mode: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every mode of `config` (fresh processes for each) and return the `bench_memory` document.

    Args:
        on_mode: called with a mode's name before it starts (progress display); "weights" first
            while the weights cache is being checked or built.

    Raises:
        BadInput: invalid configuration, or the executorch mode without its runtime hook.
    """
    arch = _arch_for(config)
    if "executorch" in config.modes:
        _check_executorch(config)
    weights_dir = weights_cache_dir(config.cache_dir, config.model, config.init, config.seed)
    rows, grads_files = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name:
        tmp = Path(tmp_name)
        if on_mode:
            on_mode("weights")
        prep = tmp / "prepare.json"
        prep.write_text(json.dumps({"cache_dir": str(config.cache_dir), "model": config.model, "init": config.init,
                                    "seed": config.seed}))
        _worker(["prepare", str(prep)], config.threads)
        for mode in config.modes:
            if on_mode:
                on_mode(mode)
            row, grads = _run_mode(config, mode, weights_dir, tmp)
            rows.append(row)
            if grads is not None:
                grads_files[mode] = grads
        reference = next((m for m in _REFERENCE_ORDER if m in grads_files), None)
        for row in rows:
            path = grads_files.get(row["mode"])
            row["grad_max_rel_diff"] = grads_max_rel_diff(path, grads_files[reference]) if path else None
    if arch is None:
        from toolchain.bench.weights_cache import ARCH_FILE

        arch = Qwen25Arch(**json.loads((weights_dir / ARCH_FILE).read_text()))
    _add_breakdowns(rows, arch, config)
    return {"schema_version": 1, "config": config.as_json(), "results": rows, "counted": COUNTED + _ALLOCATOR_NOTE[config.allocator],
            "reference_mode": reference, "host": _host()}


def _host() -> dict[str, Any]:
    import platform

    import torch

    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version()}


def format_table(doc: dict[str, Any]) -> str:
    """Plain-text table of a `bench_memory` document (ratios against MeBP when it was run)."""
    rows = doc["results"]
    base = next((r for r in rows if r["mode"] == "mebp"), None)
    head = (f"{'mode':<11}{'peak MB':>10}{'step s':>9}{'cpu s':>9}{'peak/MeBP':>11}{'time/MeBP':>11}"
            f"{'grad rel diff':>15}  largest transient")
    lines = [head, "-" * len(head)]
    for r in rows:
        peak_ratio = f"{r['peak_mb'] / base['peak_mb']:.3f}" if base and base["peak_mb"] > 0 else "-"
        time_ratio = f"{r['step_s'] / base['step_s']:.3f}" if base and base["step_s"] > 0 else "-"
        diff = f"{r['grad_max_rel_diff']:.2e}" if r.get("grad_max_rel_diff") is not None else "-"
        b = r.get("breakdown") or {}
        what = f"{b['largest_transient_what']} {b['largest_transient_mb']:.1f} MB" if b else "-"
        lines.append(f"{r['mode']:<11}{r['peak_mb']:>10.1f}{r['step_s']:>9.3f}{r['step_cpu_s']:>9.3f}{peak_ratio:>11}"
                     f"{time_ratio:>11}"
                     f"{diff:>15}  {what}")
    return "\n".join(lines)
