"""`bench memory`: every training mode side by side: peak memory per mode in a fresh process,
step time of all modes interleaved in one process, gradients compared, and the analytic breakdown.

Workers (`toolchain.bench.worker`) do the measuring; this module plans them and assembles the
`bench_memory` document. The float32 frozen weights are cached once and memory-mapped by every
worker (`bench.weights_cache`), so no mode is charged for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from toolchain.atomic import discarded_on_stop
from toolchain.bench.steps import base_mode, program_target, uses_groups
from toolchain.bench.weights_cache import ARCH_FILE, cache_arch, default_cache_dir, weights_cache_dir
from toolchain.errors import BadInput
from toolchain.lora import ALL_TARGETS, LoraConfig
from toolchain.memory.breakdown import step_breakdown
from toolchain.memory.measure import PHONE_LIKE_MALLOC_ENV
from toolchain.mesp import StepOptions
from toolchain.mesp.step import sqrt_layers_per_checkpoint
from toolchain.models import PRESETS, ModelArch
from toolchain.validate import check_rank

__all__ = ["BENCH_MODES", "COUNTED", "FILE_DRIFT_LIMIT_MB", "BenchWorkload", "MemoryBenchConfig", "run_memory_bench",
           "planner_estimate", "program_settings", "check_program", "mark_file_drift", "unreliable_rows",
           "format_table", "call_worker", "check_config", "host_info", "worker_spec"]

BENCH_MODES: tuple[str, ...] = ("autograd", "mebp", "mesp", "mesp_groups", "mezo", "executorch", "executorch_groups",
                                "onnx", "onnx_groups")

COUNTED = ("peak_mb = max over the measured steps of (VmHWM - RssFile - RssShmem) from /proc/self/status, "
           "the high-water mark reset right before the step (clear_refs 5, after a warm-up step and malloc_trim), "
           "minus the worker's RssAnon before the model was loaded (after importing torch); one fresh worker "
           "process per mode. Counted: LoRA parameters, gradients, optimizer state (none for SGD), checkpoints, "
           "activations, transients, allocator slack. Not counted: the frozen weights (float32, memory-mapped "
           "from safetensors: clean file-backed pages, as on phones), the Python/torch runtime. "
           "MB = MiB (2**20 bytes). step_s / step_cpu_s = min over the timed steps (wall / process CPU time), "
           "all modes interleaved in one separate process with glibc's default allocator. "
           "step_gflop = FLOPs of one step counted from its own matmul-like ops (torch FlopCounterMode; program "
           "modes: the eager step they export, flops_counted_from); gflop_per_s = step_gflop / step_s; "
           "matmul_gflop_per_s = the host's float32 torch.mm/bmm rate at that step's own matmul shapes (each "
           "distinct shape timed, weighted by its calls, same threads); utilisation = gflop_per_s / "
           "matmul_gflop_per_s (utilisation_cpu: the same with step_cpu_s).")
# |file_drift_mb| above this marks a peak unreliable. On a machine with free memory the mapped
# weights stay resident after the warm-up step and the drift is exactly 0; under memory pressure the
# kernel evicts and re-reads weight pages during the step, and VmHWM - RssFile (RssFile read at the
# end) is then off by the pages that moved: a Qwen2.5-1.5B MeSP step measured 461.5 MB with a drift
# of -152 MB, and 109.3 MB (drift 0) on a quiet machine.
FILE_DRIFT_LIMIT_MB = 4.0

_ALLOCATOR_NOTE = {
    "phone-like": (" Memory workers run with MALLOC_MMAP_THRESHOLD_=131072: glibc maps every block >= 128 KiB "
                   "on its own and unmaps it on free, as phone allocators do with large blocks (glibc's default "
                   "dynamic threshold keeps freed tensors in a fragmented heap: peaks then vary from step to step)."),
    "glibc": " Memory workers run with glibc's default allocator (peaks include heap fragmentation).",
}


@dataclass(frozen=True)
class BenchWorkload:
    """What every benchmark trains on: the model, the batch and the LoRA config, and how the
    benchmark processes run. `MemoryBenchConfig` and `bench.mezo.MezoCosineConfig` extend it.

    Args:
        model: preset or checkpoint directory. Default: "tiny".
        init: "random" (seeded) or "pretrained". Default: "random".
        seed: seeds the weights, the adapter and the batch. Default: 0.
        alpha: LoRA alpha; None means 2 x rank.
        repeat: measured steps per memory worker, and timed steps per mode. Default: 1.
        threads: torch intra-op threads in every process (the same for every mode). Default: 1
            (reproducible on a shared machine; ratios are what the bench compares).
        cache_dir: where the float32 frozen weights are cached for memory-mapping.
        allocator: "phone-like" (see `memory.measure.PHONE_LIKE_MALLOC_ENV`) or "glibc" for the
            memory workers. Default: "phone-like".
    """

    model: str = "tiny"
    init: str = "random"
    seed: int = 0
    seq_len: int = 256
    rank: int = 8
    alpha: float | None = None
    targets: tuple[str, ...] = ALL_TARGETS
    repeat: int = 1
    threads: int = 1
    cache_dir: Path = field(default_factory=default_cache_dir)
    allocator: str = "phone-like"

    def __post_init__(self) -> None:
        for name, low in (("seq_len", 2), ("repeat", 1), ("threads", 1), ("rank", 1)):
            if getattr(self, name) < low:
                raise BadInput(f"`{name}` must be >= {low}, got {getattr(self, name)}")
        if self.allocator not in _ALLOCATOR_NOTE:
            raise BadInput(f"`allocator` must be phone-like or glibc, got {self.allocator!r}")
        arch = PRESETS.get(self.model)
        if arch is not None:   # a checkpoint directory's rank is checked when it is loaded
            check_rank(self.rank, arch, self.targets)
        self.lora_config()

    def lora_config(self) -> LoraConfig:
        return LoraConfig(rank=self.rank, alpha=self.alpha if self.alpha is not None else 2.0 * self.rank,
                          targets=self.targets)

    def workload(self) -> dict[str, Any]:
        """The `BenchWorkload` fields of this config, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(BenchWorkload)}


@dataclass(frozen=True)
class MemoryBenchConfig(BenchWorkload):
    """One `bench memory` run: a `BenchWorkload` and

    Args:
        modes: any of BENCH_MODES, in this order.
        lr: SGD learning rate of the steps. Default: 1e-4 (the MeSP paper's).
        loss_chunk, vocab_chunk, mlp_chunk: MeSP's `StepOptions`.
        program_dir: exported program for the executorch and onnx modes.
        more_programs: further programs of the same workload (e.g. its `--compute int8` export): each program mode
            also runs on each of them, as the row keys `mode#2`, `mode#3`, ... (rows: `mode` and `program`).
        check_grads: compare the exact modes' gradients at the initial adapter. Default: True.
        quant / quant_group / quant_chunk_elems: frozen projection weights of the eager modes: "none"
            (float32), or the program's int8/int4 format, memory-mapped and dequantized per row chunk
            where used, as the exported methods do (so program and eager run on equal weights).
        quant_head: int4: the embedding and LM head int4 too (the program's `quant.head`). Default: True.
        layers_per_checkpoint: the checkpoint groups of mode mesp_groups (`mesp_step`); None: round(sqrt(L)).
    """

    modes: tuple[str, ...] = ("autograd", "mebp", "mesp")
    lr: float = 1e-4
    loss_chunk: int = StepOptions().loss_chunk
    vocab_chunk: int | None = StepOptions().vocab_chunk
    mlp_chunk: int | None = StepOptions().mlp_chunk
    program_dir: Path | None = None
    more_programs: tuple[Path, ...] = ()
    check_grads: bool = True
    quant: str = "none"
    quant_group: int = 64
    quant_chunk_elems: int = 1 << 18
    quant_head: bool = True
    layers_per_checkpoint: int | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in BENCH_MODES]
        if unknown or not self.modes:
            raise BadInput(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; "
                           f"choose from {','.join(BENCH_MODES)}")
        if len(set(self.modes)) != len(self.modes):
            raise BadInput(f"`modes` lists a mode twice: {','.join(self.modes)}")
        super().__post_init__()
        self.step_options()
        if self.layers_per_checkpoint is not None and self.layers_per_checkpoint < 1:
            raise BadInput(f"--layers-per-checkpoint must be >= 1, got {self.layers_per_checkpoint}")
        from toolchain.program.spec import QuantSpec

        QuantSpec(self.quant, self.quant_group, self.quant_chunk_elems, head=self.quant_head)

    def programs(self) -> tuple[Path, ...]:
        """Every --program, in order (the first is `program_dir`)."""
        return (() if self.program_dir is None else (self.program_dir,)) + tuple(self.more_programs)

    def row_keys(self) -> dict[str, Path | None]:
        """Row key -> its program: each mode once; a program mode once per program (`mode`, `mode#2`, ...)."""
        out: dict[str, Path | None] = {}
        for mode in self.modes:
            if not program_target(mode):
                out[mode] = None
                continue
            for k, p in enumerate(self.programs() or (None,)):
                out[mode if k == 0 else f"{mode}#{k + 1}"] = p
        return out

    def step_options(self) -> StepOptions:
        return StepOptions(loss_chunk=self.loss_chunk, vocab_chunk=self.vocab_chunk, mlp_chunk=self.mlp_chunk)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(cache_dir=str(self.cache_dir), program_dir=str(self.program_dir) if self.program_dir else None,
                 more_programs=[str(p) for p in self.more_programs],
                 targets=list(self.targets), modes=list(self.modes), alpha=self.lora_config().alpha, dtype="float32",
                 lora_init="A and B uniform(+-1/sqrt(in)) from the seed (B != 0, so every gradient is checked)",
                 data="seq_len random token ids from the seed, labels = input_ids", optimizer="SGD")
        return d


def _worker(args: list[str], threads: int, extra_env: dict[str, str] | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS=str(threads), TOOLCHAIN_BENCH_PARENT=str(os.getpid()), **(extra_env or {}))
    proc = subprocess.run([sys.executable, "-m", "toolchain.bench.worker", *args], capture_output=True, text=True,
                          env=env)
    if proc.returncode == 2:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "benchmark worker failed"
        raise BadInput(last.split(": ", 1)[-1])
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker {args[0]} exited with {proc.returncode}:\n{proc.stderr[-4000:]}")


def call_worker(tmp: Path, command: str, spec: dict, threads: int, env: dict[str, str] | None = None) -> Any:
    """Run `python -m toolchain.bench.worker COMMAND` on `spec` (files in `tmp`); returns its output."""
    tag = f"{command}-{spec.get('mode', 'all')}"
    spec_path, out_path = tmp / f"spec-{tag}.json", tmp / f"out-{tag}.json"
    spec_path.write_text(json.dumps(spec))
    _worker([command, str(spec_path)] + ([] if command == "prepare" else [str(out_path)]), threads, env)
    return None if command == "prepare" else json.loads(out_path.read_text())


def check_config(config: MemoryBenchConfig) -> ModelArch | None:
    """Validate what needs the model before anything runs; returns the preset's arch (None: checkpoint)."""
    arch = PRESETS.get(config.model)
    if arch is None and config.init == "random":
        raise BadInput(f"unknown preset {config.model!r}; --init random needs one of {', '.join(PRESETS)}")
    if arch is not None and config.seq_len > arch.max_positions:
        raise BadInput(f"--seq-len {config.seq_len} exceeds {config.model}'s {arch.max_positions} positions")
    for mode in config.modes:
        if program_target(mode) and config.program_dir is None:
            raise BadInput(f"--modes {mode} needs --program DIR, a program directory written by "
                           f"`toolchain export --target {program_target(mode)}`")
    if config.more_programs and config.program_dir is None:
        raise BadInput("more programs given without a first --program")
    if config.program_dir is not None and any(program_target(m) for m in config.modes):
        for p in config.programs():
            check_program(config, arch, p)
    return arch


def program_settings(program_dir: Path) -> dict[str, Any]:
    """MemoryBenchConfig fields that make the eager modes run what the program runs: its sequence length,
    weight format and step chunking (the CLI's explicit options override them)."""
    from toolchain.program import ProgramDir

    spec = ProgramDir(program_dir, verify=False).spec
    return {"seq_len": spec.seq_len, "quant": spec.quant.kind, "quant_group": spec.quant.group, "quant_chunk_elems": spec.quant.chunk_elems,
            "quant_head": spec.quant.head_quantized or spec.quant.kind != "int4", "loss_chunk": spec.options.loss_chunk, "vocab_chunk": spec.options.vocab_chunk,
            "mlp_chunk": spec.options.mlp_chunk}


def check_program(config: MemoryBenchConfig, arch: ModelArch | None, program_dir: Path | None = None) -> None:
    """The program (`program_dir`, default the first) must be the benchmarked workload: same widths, sequence
    length, LoRA and weight format (its `compute` may differ: that is what several programs compare; so may a
    further program's MLP chunk, which follows its compute's default: `export --mlp-chunk`, 512 for int8)."""
    from toolchain.program import ProgramDir

    program_dir = program_dir or config.program_dir
    pdir = ProgramDir(program_dir, verify=False)
    for target in {program_target(m) for m in config.modes} - {None}:
        if target not in pdir.targets:
            raise BadInput(f"{program_dir} has no {target} program (it has {', '.join(pdir.targets)}); "
                           f"export it with --target {target}")
    q = pdir.spec.quant
    o = pdir.spec.options
    got = {"seq_len": pdir.seq_len, "rank": pdir.lora_config.rank, "targets": pdir.lora_config.targets,
           "alpha": pdir.lora_config.alpha, "quant": q.kind, "quant_group": q.group,
           "quant_chunk_elems": q.chunk_elems, "quant_head": q.head_quantized, "loss_chunk": o.loss_chunk,
           "vocab_chunk": o.vocab_chunk, "mlp_chunk": o.mlp_chunk}
    want = {"seq_len": config.seq_len, "rank": config.rank, "targets": config.lora_config().targets,
            "alpha": config.lora_config().alpha, "quant": config.quant, "quant_group": config.quant_group,
            "quant_chunk_elems": config.quant_chunk_elems, "quant_head": config.quant == "int4" and config.quant_head,
            "loss_chunk": config.loss_chunk, "vocab_chunk": config.vocab_chunk, "mlp_chunk": config.mlp_chunk}
    if config.quant == "none":
        got = {k: v for k, v in got.items() if k not in ("quant_group", "quant_chunk_elems")}
        want = {k: v for k, v in want.items() if k not in ("quant_group", "quant_chunk_elems")}
    if program_dir != config.program_dir:                 # a further program: the eager modes follow the first
        del got["mlp_chunk"], want["mlp_chunk"]
    diff = [f"{k} {got[k]} (bench: {want[k]})" for k in want if got[k] != want[k]]
    if arch is not None and pdir.arch != arch:
        diff.append(f"model {pdir.model.source} (bench: {config.model})")
    if diff:
        raise BadInput(f"{program_dir} was exported with {', '.join(diff)}; pass the same settings "
                       f"(--seq-len, --rank, --alpha, --targets, --quant, ...) or export a matching program")


def groups_of(config: MemoryBenchConfig, layers: int) -> int:
    """Layers per checkpoint of the mesp_groups mode."""
    return config.layers_per_checkpoint or sqrt_layers_per_checkpoint(layers)


def worker_spec(config: MemoryBenchConfig, weights_dir: Path, layers: int) -> dict:
    cfg = config.lora_config()
    return {"weights_dir": str(weights_dir), "rank": cfg.rank, "alpha": cfg.alpha, "targets": list(cfg.targets),
            "seq_len": config.seq_len, "seed": config.seed, "repeat": config.repeat, "threads": config.threads,
            "lr": config.lr, "loss_chunk": config.loss_chunk, "vocab_chunk": config.vocab_chunk,
            "mlp_chunk": config.mlp_chunk, "check_grads": config.check_grads, "quant": config.quant,
            "quant_group": config.quant_group, "quant_chunk_elems": config.quant_chunk_elems,
            "quant_head": config.quant_head, "program_dir": str(config.program_dir) if config.program_dir else None,
            "program_dirs": {k: str(p) for k, p in config.row_keys().items() if p is not None},
            "layers_per_checkpoint": groups_of(config, layers)}


def run_memory_bench(config: MemoryBenchConfig, *, on_mode: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run `config` and return the `bench_memory` document.

    Args:
        on_mode: called before each stage: "weights" (cache), each mode's memory worker, "timing".

    Raises:
        BadInput: invalid configuration, or the executorch mode without its runtime hook.
    """
    notify = on_mode or (lambda stage: None)
    arch = check_config(config)
    weights_dir = weights_cache_dir(config.cache_dir, config.model, config.init, config.seed)
    env = PHONE_LIKE_MALLOC_ENV if config.allocator == "phone-like" else None
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name, discarded_on_stop(Path(tmp_name)) as tmp:
        notify("weights")
        if config.quant != "none" or not (weights_dir / ARCH_FILE).is_file():
            call_worker(tmp, "prepare", {"cache_dir": str(config.cache_dir), "model": config.model,
                                         "init": config.init, "seed": config.seed, "quant": config.quant,
                                         "quant_group": config.quant_group, "quant_head": config.quant_head},
                        config.threads)
        arch = arch or cache_arch(weights_dir)
        spec = worker_spec(config, weights_dir, arch.layers)
        rows = []
        keys = config.row_keys()
        for key in keys:
            notify(key)
            rows.append(call_worker(tmp, "memory", dict(spec, mode=key), config.threads, env))
        notify("timing")
        timing = call_worker(tmp, "timing", dict(spec, modes=list(keys)), config.threads)
    for row in rows:
        row.update(timing["modes"][row["mode"]], threads=config.threads)
        program = keys[row["mode"]]
        if program is not None:
            row["program"] = str(program)
            row["compute"], row["mlp_chunk"] = _program_compute(program)
        row["mode"] = base_mode(row["mode"])
        mark_file_drift(row)
        if uses_groups(row["mode"]):
            row["layers_per_checkpoint"] = spec["layers_per_checkpoint"]
        row.update(planner_estimate(row["mode"], arch, config, spec["layers_per_checkpoint"],
                                    program or config.program_dir))
        if not program_target(row["mode"]):
            row["breakdown"] = step_breakdown(row["mode"], arch, config.lora_config(), config.seq_len,
                                              config.step_options(),
                                              layers_per_checkpoint=spec["layers_per_checkpoint"]).as_mb()
    return {"schema_version": 1, "config": config.as_json(), "results": rows,
            "counted": COUNTED + _ALLOCATOR_NOTE[config.allocator], "reference_mode": timing["reference_mode"],
            "host": host_info()}


def _program_compute(program_dir: Path) -> tuple[str, int | None]:
    """The program's compute and MLP chunk (a program row's `compute`, `mlp_chunk`)."""
    from toolchain.program import ProgramDir

    spec = ProgramDir(program_dir, verify=False).spec
    return spec.compute, spec.options.mlp_chunk


# The planner's answer for the quantity a mode's `peak_mb` measures (`planner_estimate`); modes without one
# (mezo, onnx, onnx_groups) get none.
_PLANNED_EAGER = {"autograd": "autograd", "mebp": "mebp", "mesp": "mesp", "mesp_groups": "mesp"}
_PLANNED_PROGRAM = ("executorch", "executorch_groups")


def planner_estimate(mode: str, arch: ModelArch, config: MemoryBenchConfig, layers_per_checkpoint: int,
                     program_dir: Path | None = None) -> dict[str, Any]:
    """What `toolchain plan fit` predicts for the peak `mode` measures, beside it in the report: the analytic
    model with its calibrated host overhead for the eager modes (`estimate_peak`, SGD, every layer, the bench's
    chunk sizes), the program's host figure for the ExecuTorch modes (`program_peak`: its largest arena, one
    shared by the Python bindings, plus state, checkpoints, activations and runtime overhead; every layer
    backpropagated, as the bench steps) of `program_dir` (the row's --program). Empty for modes the planner does not model (mezo, onnx)."""
    from toolchain.memory.estimate import StepShape, estimate_peak
    from toolchain.memory.fit import EXECUTORCH_OVERHEAD_MB, HOST_OVERHEAD_MB, program_peak

    groups = layers_per_checkpoint if uses_groups(mode) else 1
    if mode in _PLANNED_EAGER:
        method = _PLANNED_EAGER[mode]
        shape = StepShape(arch, config.seq_len, config.rank, targets=config.lora_config().targets, method=method,
                          loss_chunk=config.loss_chunk, vocab_chunk=config.vocab_chunk, mlp_chunk=config.mlp_chunk,
                          optimizer="sgd", layers_per_checkpoint=groups)
        mb, source = estimate_peak(shape, overhead_mb=HOST_OVERHEAD_MB[method]).peak_mb, "analytic"
    elif mode in _PLANNED_PROGRAM and program_dir is not None:
        mb = program_peak(program_dir, lcsb_k=arch.layers, overhead_mb=EXECUTORCH_OVERHEAD_MB,
                          layers_per_checkpoint=groups).host_peak_mb
        source = "program"
    else:
        return {}
    return {"planner_estimate_mb": round(mb, 2), "planner_source": source}


def mark_file_drift(row: dict[str, Any]) -> None:
    """Add `unreliable` to a result row whose file pages moved during the step (see FILE_DRIFT_LIMIT_MB)."""
    if abs(row["file_drift_mb"]) > FILE_DRIFT_LIMIT_MB:
        row["unreliable"] = (f"file-backed pages changed by {row['file_drift_mb']:+.1f} MB during the measured step "
                             "(memory pressure evicted mapped weights): the peak is off by about that much or "
                             "more; re-run with more free memory")


def unreliable_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The results of a `bench_memory` document whose peak was not measured on stable file pages."""
    return [r for r in doc["results"] if r.get("unreliable")]


def host_info() -> dict[str, Any]:
    import platform

    import torch

    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version()}


def format_table(doc: dict[str, Any]) -> str:
    """Plain-text table of a `bench_memory` document (ratios against MeBP when it was run)."""
    rows = doc["results"]
    base = next((r for r in rows if r["mode"] == "mebp"), None)
    head = (f"{'mode':<18}{'peak MB':>10}{'plan MB':>9}{'plan err':>9}{'step s':>9}{'cpu s':>9}{'peak/MeBP':>11}"
            f"{'time/MeBP':>11}{'GFLOP':>9}{'GFLOP/s':>9}{'util':>7}{'cpu util':>9}{'grad rel diff':>15}  largest transient")
    lines = [head, "-" * len(head)]
    several = len({r.get("program") for r in rows if r.get("program")}) > 1
    for r in rows:
        label = f"{r['mode']}[{r['compute']}]" if several and r.get("program") else r["mode"]
        peak_ratio = f"{r['peak_mb'] / base['peak_mb']:.3f}" if base and base["peak_mb"] > 0 else "-"
        time_ratio = f"{r['step_s'] / base['step_s']:.3f}" if base and base["step_s"] > 0 else "-"
        diff = f"{r['grad_max_rel_diff']:.2e}" if r.get("grad_max_rel_diff") is not None else "-"
        b = r.get("breakdown") or {}
        what = f"{b['largest_transient_what']} {b['largest_transient_mb']:.1f} MB" if b else "-"
        gflop, rate, util, util_cpu = ((f"{r['step_gflop']:.2f}", f"{r['gflop_per_s']:.1f}", f"{r['utilisation']:.2f}",
                                        f"{r['utilisation_cpu']:.2f}") if "step_gflop" in r else ("-",) * 4)
        plan, err = ((f"{r['planner_estimate_mb']:.1f}", f"{r['planner_estimate_mb'] / r['peak_mb'] - 1:+.1%}")
                     if r.get("planner_estimate_mb") is not None and r["peak_mb"] > 0 else ("-", "-"))
        lines.append(f"{label:<18}{r['peak_mb']:>10.1f}{plan:>9}{err:>9}{r['step_s']:>9.3f}{r['step_cpu_s']:>9.3f}"
                     f"{peak_ratio:>11}{time_ratio:>11}{gflop:>9}{rate:>9}{util:>7}{util_cpu:>9}{diff:>15}  {what}")
    lines += [f"! {r['mode']}{' ' + r['program'] if several and r.get('program') else ''}: unreliable peak: {r['unreliable']}" for r in unreliable_rows(doc)]
    return "\n".join(lines)
