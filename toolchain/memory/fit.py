""""Will it fit": predicted peak memory of a training config against a device profile's budget.

Two sources, each with its calibrated runtime overhead (see docs/planner.md, "Calibration"):
- program (`--program DIR`, manifest schema_version 3: layer-generic methods run by the app's layer
  loop, weights in weights.safetensors): the anonymous memory of an app running the loop, from the
  manifest's `memory_plan`:
    arenas            the ExecuTorch planned arena of every method (method outputs live in it). On a phone
                      (the stock Android JNI and iOS `Module` wrappers, `share_memory_arenas=false`) every
                      loaded method holds its own arena: the SUM. The host's Python bindings
                      (`Runtime.load_program`) share one arena between a program's methods: the LARGEST.
    lora_state        the app's flat state array (LoRA params, optimizer moments).
    checkpoints       the per-layer block inputs of the layers backpropagated this step (T x d float32
                      each; LCSB keeps only the selected layers').
    activations       the running hidden state / gradient: 1 [T, d] (a method's output is copied out of the
                      arena over its input where the loop no longer needs that: head_loss's d over x,
                      block_backward's d over the incoming d, block_forward's output over an input that is not
                      a checkpoint; LayerLoop.train_step, forward).
    runtime_overhead  the runtime itself (program and per-method metadata, kernels' scratch), measured with
                      `toolchain bench memory --modes executorch` on this host.
  The phone figure (sum of arenas) is the fit answer; the host figure (largest arena) is what
  `toolchain bench memory --modes executorch --program DIR` measures here. Frozen weights are memory-mapped
  clean pages (zero-copy inputs): not counted.
- analytic (`estimate.py`): the eager step's live tensors plus the host overhead of its method measured by
  `bench memory`.
Either way the answer names its source, the parts of the peak, and the largest sequence length and LoRA rank
that would fit (from the analytic model: a program has its shapes fixed).

The manifest is read through toolchain/contract (the typed, schema-validated manifest).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from toolchain.contract import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION, Manifest, ManifestVersionError, read_manifest
from toolchain.errors import BadInput
from toolchain.lora.config import parse_targets
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak, largest_fitting
from toolchain.memory.fallback import KNOBS, WorkingSet, fallback_ladder
from toolchain.memory.profiles import DeviceProfile
from toolchain.mesp.step import inputs_alive_bound, pair_inputs_alive_bound
from toolchain.models.presets import ModelArch, get_preset
from toolchain.validate import check_rank, check_seq_len

__all__ = ["HOST_OVERHEAD_MB", "EXECUTORCH_OVERHEAD_MB", "ACTIVATION_COPIES", "FitReport",
           "ProgramPeak", "plan_fit", "program_peak", "program_shape",
           "fit_shape", "analytic_peak", "fallback_of"]

TARGET = "executorch"
# [T, d] float32 activations the app holds besides the checkpoints: the running x or d. The forward's last output
# is x beside the checkpoints; head_loss's d is copied out of the arena over x, block_backward's over the incoming d
# (LayerLoop.train_step; 2 while each output had its own buffer, before 2026-12-03).
ACTIVATION_COPIES = 1
# Anonymous memory a process holds besides the step's tensors, measured by `toolchain bench memory`
# (reports in tests/memory/data/bench_memory/; tests/memory/test_calibration.py recomputes them).
# Host, eager PyTorch, per method: the median over its reports of (resident before the step - LoRA state),
# mostly heap the warm-up step left behind (the baselines' small autograd blocks fragment it: ~14 MB).
HOST_OVERHEAD_MB: dict[str, float] = {"mesp": 3.2, "mebp": 14.4, "autograd": 12.6}
# ExecuTorch runtime on the host (Python bindings, XNNPACK), layer loop: the largest measured
# (peak - host figure without overhead) of the executorch reports (one tiny int4 program): the program
# and its methods' metadata, the runtime's and XNNPACK's scratch. It grows with the model: the held-out int4
# programs measured 9.9-10.9 MB (0.5B, seq 256), 11.4 (0.5B, seq 1024), 18.3 (3B): docs/planner.md.
EXECUTORCH_OVERHEAD_MB = 1.5


@dataclass(frozen=True)
class FitReport:
    device: str
    budget_mb: float
    predicted_peak_mb: float
    source: str                         # "analytic" or "program"
    fits: bool
    margin_mb: float                    # budget - peak (negative: over budget)
    parts_mb: dict[str, float]
    phase: str | None                   # where the analytic peak is (None for a program)
    analytic_peak_mb: float             # the analytic model's answer, also when the program's is used
    largest_seq_len: int | None         # at this rank; None when even 1 token does not fit
    largest_rank: int | None            # at this seq_len
    max_rank: int                       # the largest meaningful rank for these targets
    overhead_mb: float
    host_peak_mb: float | None = None   # a program on this host (one shared arena): `bench memory` checks it
    host_parts_mb: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)
    # what a run under memory pressure would fall back to (memory/fallback.py: the knobs' ladder walked until the
    # predicted peak fits the budget): {"layers_per_checkpoint", "lcsb_k", "seq_len" (null: fixed by the program),
    # "predicted_peak_mb", "fits", "notches": [knob, ...]}; no notch when the requested settings fit
    fallback: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ProgramPeak:
    peak_mb: float                      # phone: every loaded method's own arena (their sum)
    host_peak_mb: float                 # host Python bindings: one arena shared by the methods (the largest)
    parts_mb: dict[str, float]          # of peak_mb
    host_parts_mb: dict[str, float]     # of host_peak_mb
    lcsb_k: int                         # layers whose checkpoints are counted
    notes: list[str]
    manifest: Manifest


def _read_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise BadInput(f"{path} does not exist; --program must be a directory written by `toolchain export`")
    try:
        return read_manifest(path)
    except ManifestVersionError as e:
        raise BadInput(f"{path} has manifest schema_version {e.version!r}; the planner reads version "
                       f"{MANIFEST_SCHEMA_VERSION} (layer-generic methods, weights outside the program): re-export "
                       f"the program with this toolchain, or drop --program") from None


def _selected_layers(manifest: Manifest, lcsb_k: int | None) -> tuple[int, str]:
    layers = manifest.model.arch["layers"]
    if lcsb_k is not None:
        if not 1 <= lcsb_k <= layers:
            raise BadInput(f"LCSB k {lcsb_k} is not in 1..{layers}, the program's layer count; pass a --lcsb-k in range")
        return lcsb_k, "--lcsb-k"
    plan = manifest.lcsb
    if plan is None:
        return layers, "no LCSB: every layer"
    return max(len(phase) for phase in plan.phases), "the program's default LCSB plan (largest phase)"


def program_peak(program_dir: Path, *, lcsb_k: int | None = None, overhead_mb: float = EXECUTORCH_OVERHEAD_MB,
                 layers_per_checkpoint: int = 1, pair: bool = False) -> ProgramPeak:
    """Peak MB of an app running an exported program's layer loop (see the module docstring).

    Args:
        lcsb_k: layers backpropagated per step (their checkpoints are kept); None: the program's default
            LCSB plan (its largest phase), or every layer when it has none.
        overhead_mb: the runtime's own memory, added to both figures as `runtime_overhead`.
        layers_per_checkpoint: checkpoint groups of the loop (`LayerLoop.train_step`). Default: 1 (every
            backpropagated layer's input kept).
        pair: the DPO step (`LayerLoop.pair_step`, a program exported with --preference): both sequences'
            inputs alive at once (`mesp.step.pair_inputs_alive_bound`: the second's in graded groups) and the
            second sequence's [T, d] gradient besides the activations. Default: the SFT step.

    Raises:
        BadInput: no manifest, not JSON, not schema_version 3, no ExecuTorch memory plan for a method,
            or lcsb_k out of range.
        SchemaError: the manifest violates its schema.
    """
    path = Path(program_dir) / MANIFEST_NAME
    return _program_peak(_read_manifest(path), path, lcsb_k, overhead_mb, layers_per_checkpoint, pair)


def _program_peak(manifest: Manifest, path: Path, lcsb_k: int | None, overhead_mb: float,
                  layers_per_checkpoint: int = 1, pair: bool = False) -> ProgramPeak:
    plan = manifest.memory_plan
    # the training methods: the generation ones are loaded only to generate; their own figure is the
    # manifest's generate.peak_estimate_bytes
    methods = manifest.training_methods()
    arenas = plan.planned_arena_bytes.get(TARGET)
    if arenas is None:
        have = ", ".join(sorted(plan.planned_arena_bytes)) or "none"
        raise BadInput(f"{path}: memory_plan.planned_arena_bytes has no {TARGET} plan (planned targets: {have}); "
                       f"export with --target {TARGET}, or drop --program")
    missing = [name for name in methods if name not in arenas]
    if missing:
        raise BadInput(f"{path}: memory_plan.planned_arena_bytes.{TARGET} has no arena for {', '.join(missing)}; "
                       f"re-export the program with this toolchain, or drop --program")
    arch = manifest.model.arch
    k, why = _selected_layers(manifest, lcsb_k)
    # checkpoint groups (LayerLoop.train_step): the kept inputs below a group plus the group's, at most
    kept = inputs_alive_bound(k, layers_per_checkpoint)
    if kept < k:
        why += f"; {kept} alive at once with --layers-per-checkpoint {layers_per_checkpoint}"
    if pair:
        kept = pair_inputs_alive_bound(k, layers_per_checkpoint)
        why += f"; the DPO step: {kept} of both sequences' inputs alive at once"
    row = manifest.seq_len * arch["hidden"] * 4                    # one [T, d] float32
    largest = max(methods, key=lambda name: arenas[name])
    common = {"lora_state": plan.lora_state_bytes / BYTES_PER_MB,
              "checkpoints": plan.checkpoint_bytes * kept / arch["layers"] / BYTES_PER_MB,
              "activations": (ACTIVATION_COPIES + pair) * row / BYTES_PER_MB}
    if overhead_mb:
        common["runtime_overhead"] = overhead_mb
    parts = {"planned_arenas": sum(arenas[name] for name in methods) / BYTES_PER_MB, **common}
    host = {"planned_arena_largest": arenas[largest] / BYTES_PER_MB, **common}
    notes = [f"phone figure (the fit answer): the apps' ExecuTorch Module gives each of the {len(methods)} loaded "
             f"methods ({', '.join(methods)}) its own arena: their sum, {parts['planned_arenas']:.1f} MB",
             f"host figure {sum(host.values()):.1f} MB: the Python bindings share one arena between a program's "
             f"methods (the largest, {host['planned_arena_largest']:.1f} MB, {largest}); `toolchain bench memory "
             f"--modes executorch --program DIR` measures this one on the host",
             f"checkpoints of {k} of {arch['layers']} layers ({why}), activations: {ACTIVATION_COPIES} [T, d] besides them",
             f"weights {plan.weights_bytes / BYTES_PER_MB:.1f} MB not counted (weights.safetensors is memory-mapped "
             f"and passed to the methods without copying: clean pages the phone's footprint excludes)",
             "the runtime overhead was calibrated on a tiny program and grows with the model: on the host the "
             "Qwen2.5-0.5B int4 programs' figures are 15% (seq 256) and 9% (seq 1024) under the measured peaks, "
             "Qwen2.5-3B's 11% (docs/planner.md)"]
    return ProgramPeak(sum(parts.values()), sum(host.values()), parts, host, k, notes, manifest)


def _check_program_shape(manifest: Manifest, shape: StepShape, where: Path) -> None:
    arch = {k: manifest.model.arch.get(k) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab")}
    want = {k: getattr(shape.arch, k) for k in arch}
    got = {"seq_len": manifest.seq_len, "rank": manifest.lora.rank, **arch}
    bad = [f"{k} {got[k]} (not {v})" for k, v in {"seq_len": shape.seq_len, "rank": shape.rank, **want}.items()
           if got[k] != v]
    if sorted(manifest.lora.targets) != sorted(shape.targets):
        bad.append(f"targets {','.join(manifest.lora.targets)} (not {','.join(shape.targets)})")
    if bad:
        raise BadInput(f"{where} was exported with {', '.join(bad)}; drop --model/--seq-len/--rank/--targets "
                       f"(--program supplies them) or pass the program's")


def program_shape(program_dir: Path, *, arch: ModelArch | None = None, seq_len: int | None = None,
                  rank: int | None = None, targets: tuple[str, ...] | None = None,
                  **fields) -> tuple[str, StepShape]:
    """The training step of an exported program, from its manifest: model, seq_len, LoRA rank and targets,
    and (unless given in `fields`) its optimizer and chunk sizes.

    Args:
        program_dir: the program directory (manifest schema_version 3).
        arch / seq_len / rank / targets: values the caller was given; each must agree with the manifest.
            Default: None (the manifest's).
        fields: other `StepShape` fields (method, lcsb_k, optimizer, loss_chunk, ...).

    Returns:
        The model as the manifest names it (`model.source`) and the step's shape.

    Raises:
        BadInput: no readable manifest, or a given value the program was not exported with.
        SchemaError: the manifest violates its schema.
    """
    where = Path(program_dir)
    manifest = _read_manifest(where / MANIFEST_NAME)
    lora = manifest.lora
    defaults = {"optimizer": manifest.optimizer.kind, **manifest.options.to_json()}
    shape = StepShape(ModelArch.from_dict(manifest.model.arch), manifest.seq_len, lora.rank, targets=lora.targets,
                      **{**defaults, **fields})
    given = replace(shape, arch=arch or shape.arch, seq_len=seq_len or shape.seq_len, rank=rank or shape.rank,
                    targets=targets or shape.targets)
    _check_program_shape(manifest, given, where)
    return manifest.model.source, shape


def fit_shape(*, model: str | None = None, seq_len: int | None = None, program_dir: Path | None = None,
              rank: int | None = None, targets: str | None = None, **fields) -> tuple[str, StepShape]:
    """The step `toolchain plan fit` models: a preset at `seq_len`, or an exported program's (`program_shape`).

    Args:
        model: a preset name; with `program_dir`, optional (it must be the program's).
        seq_len: tokens per step; with `program_dir`, optional (it must be the program's).
        program_dir: an exported program whose manifest gives the model, seq_len, rank and targets.
        rank: LoRA rank. Default: None (the program's, else 8).
        targets: comma-separated LoRA targets or "all". Default: None (the program's, else all).
        fields: other `StepShape` fields (method, lcsb_k, optimizer, loss_chunk, ...).

    Returns:
        The model's name and the step's shape.

    Raises:
        BadInput: neither a program nor model and seq_len, an unknown preset, a seq_len or rank the model
            does not allow, or values the program was not exported with.
    """
    arch = None if model is None else get_preset(model)
    names = None if targets is None else parse_targets(targets)
    if program_dir is not None:
        return program_shape(program_dir, arch=arch, seq_len=seq_len, rank=rank, targets=names, **fields)
    if arch is None or seq_len is None:
        raise BadInput("give --model and --seq-len, or --program (an exported program)")
    rank, names = rank or 8, names or parse_targets("all")
    check_seq_len(seq_len, arch)
    check_rank(rank, arch, names)
    return model, StepShape(arch, seq_len, rank, targets=names, **fields)


def _max_rank(shape: StepShape) -> int:
    return min(min(shape.arch.linear_shape(t)) for t in shape.targets)


def plan_fit(shape: StepShape, device: DeviceProfile, *, program_dir: Path | None = None,
             overhead_mb: float | None = None) -> FitReport:
    """Does `shape` fit `device`? See the module docstring.

    Args:
        program_dir: an exported program: its phone figure is the answer (`shape.lcsb_k` selects the
            checkpoints counted; None: the program's default plan).
        overhead_mb: runtime memory on top of the tensors; None: the calibrated constant of the source
            (HOST_OVERHEAD_MB[shape.method] for the analytic model, EXECUTORCH_OVERHEAD_MB for a program).
    """
    host = HOST_OVERHEAD_MB[shape.method] if overhead_mb is None else overhead_mb
    analytic = estimate_peak(shape, overhead_mb=host)
    notes = []
    host_peak = host_parts = None
    if program_dir is not None:
        path = Path(program_dir) / MANIFEST_NAME
        manifest = _read_manifest(path)
        _check_program_shape(manifest, shape, Path(program_dir))
        prog = _program_peak(manifest, path, shape.lcsb_k,
                             EXECUTORCH_OVERHEAD_MB if overhead_mb is None else overhead_mb,
                             layers_per_checkpoint=shape.layers_per_checkpoint)
        peak, parts, notes, source, phase = prog.peak_mb, prog.parts_mb, list(prog.notes), "program", None
        host_peak, host_parts = prog.host_peak_mb, prog.host_parts_mb
        used = parts.get("runtime_overhead", 0.0)
        notes.append("largest seq len / rank below come from the analytic model")
        weights_mb = manifest.memory_plan.weights_bytes / BYTES_PER_MB
        if weights_mb + peak > device.budget_mb:
            notes.append(f"the weights file ({weights_mb:.0f} MB, memory-mapped) and the step ({peak:.0f} MB) exceed "
                         f"the {device.budget_mb:.0f} MB budget together: the page cache will not keep the weights "
                         f"resident, so steps re-read them from storage (about twice the file per step: forward and "
                         f"backward; docs/benchmarks.md, \"When the weights do not stay in memory\")")
    else:
        peak, parts, source, phase, used = analytic.peak_mb, analytic.parts_mb, "analytic", analytic.phase, host
        if phase == "backward (saved only)":
            notes.append(f"{shape.method}: the peak is in a block's backward, whose autograd transients are not "
                         f"modelled: this is a lower bound (the LM head dominates for every Qwen2.5 preset)")
    if overhead_mb is None:
        where = ("the ExecuTorch Python bindings on the Linux host; an app's runtime must be measured on the phone"
                 if source == "program" else "eager PyTorch on the Linux host")
        notes.append(f"runtime overhead {used:.1f} MB: calibrated with `toolchain bench memory` ({where}; "
                     f"docs/planner.md)")
    budget = device.budget_mb
    max_rank = _max_rank(shape)
    if source == "program":
        def predict(ws):
            return _program_peak(manifest, path, ws.lcsb_k, EXECUTORCH_OVERHEAD_MB if overhead_mb is None
                                 else overhead_mb, ws.layers_per_checkpoint).peak_mb
    else:
        def predict(ws):
            return analytic_peak(shape, ws, overhead_mb=host)
    # checkpoint groups and LCSB are MeSP's (the baselines' steps have neither): only their rows' length
    knobs = KNOBS if shape.method == "mesp" else ("seq_len",)
    fallback = fallback_of(WorkingSet(shape.layers_per_checkpoint, shape.lcsb_k,
                                      shape.seq_len if source == "analytic" else None),
                           shape.arch.layers, predict, budget, knobs=knobs)
    return FitReport(
        device=device.name, budget_mb=budget, predicted_peak_mb=peak, source=source, fits=peak <= budget,
        margin_mb=budget - peak, parts_mb=parts, phase=phase, analytic_peak_mb=analytic.peak_mb,
        largest_seq_len=largest_fitting(shape, budget, "seq_len", shape.arch.max_positions, overhead_mb=host),
        largest_rank=largest_fitting(replace(shape), budget, "rank", max_rank, overhead_mb=host),
        max_rank=max_rank, overhead_mb=used, host_peak_mb=host_peak, host_parts_mb=host_parts, notes=notes,
        fallback=fallback)


def analytic_peak(shape: StepShape, ws: WorkingSet, *, overhead_mb: float) -> float:
    """The analytic peak (MB) of `shape` run with the working set `ws` (its seq_len, when set, replaces the shape's)."""
    return estimate_peak(replace(shape, lcsb_k=ws.lcsb_k, layers_per_checkpoint=ws.layers_per_checkpoint,
                                 seq_len=ws.seq_len or shape.seq_len, backward_layers=None),
                         overhead_mb=overhead_mb).peak_mb


def fallback_of(ws: WorkingSet, layers: int, predict, budget_mb: float, *, knobs=KNOBS) -> dict:
    """`FitReport.fallback`: the fallback ladder (memory/fallback.py) walked from `ws` against `budget_mb`."""
    end, peak, taken = fallback_ladder(ws, layers, predict, budget_mb, knobs=knobs)
    return {**end.to_json(), "seq_len": end.seq_len, "predicted_peak_mb": peak,
            "fits": peak is not None and peak <= budget_mb, "notches": [n.knob for n in taken]}
