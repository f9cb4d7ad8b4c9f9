""""Will it fit": predicted peak memory of a training config against a device profile's budget.

Two sources, each with its calibrated runtime overhead (see docs/planner.md, "Calibration"):
- program (`--program DIR`, manifest schema_version 2): what the phone holds while it trains, as the
  apps run the program: the planned arena of every train method (the apps load all of them up front,
  and the stock ExecuTorch `Module` gives each loaded method its own arena; the arena includes the
  method's outputs), plus the app's state array (`memory_plan.lora_state_bytes`), plus the runtime's
  fixed overhead. Frozen weights (`constant_bytes`) are memory-mapped clean pages: not counted.
- analytic (`estimate.py`): the step's live tensors plus the host overhead measured by `bench memory`.
Either way the answer names its source, the parts of the peak, and the largest sequence length and
LoRA rank that would fit (from the analytic model: a program has its shapes fixed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from toolchain.errors import BadInput
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak, largest_fitting
from toolchain.memory.profiles import DeviceProfile
from toolchain.schemas import validate

__all__ = ["HOST_OVERHEAD_MB", "EXECUTORCH_OVERHEAD_MB", "FitReport", "ProgramPeak", "plan_fit", "program_peak"]

MANIFEST_NAME = "manifest.json"
# Anonymous memory a process holds besides the step's tensors, measured by `toolchain bench memory`
# (reports in tests/memory/data/bench_memory/; tests/memory/test_calibration.py recomputes both).
# Host, eager PyTorch: the median over the reports of (resident before the step - LoRA state).
HOST_OVERHEAD_MB = 4.3
# ExecuTorch runtime on the host (Python bindings, portable kernels): the largest measured
# (peak - planned arenas - state array): program and method metadata, the bindings' output copies.
EXECUTORCH_OVERHEAD_MB = 7.2


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
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ProgramPeak:
    peak_mb: float
    parts_mb: dict[str, float]
    notes: list[str]
    manifest: dict


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path} does not exist; --program must be a directory written by `toolchain export`") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if version != 2:
        raise BadInput(f"{path} has manifest schema_version {version!r}; the planner reads version 2 (functional "
                       f"state): re-export the program with this toolchain, or drop --program")
    validate("manifest", manifest, where=str(path))
    return manifest


def program_peak(program_dir: Path, *, overhead_mb: float = EXECUTORCH_OVERHEAD_MB) -> ProgramPeak:
    """Peak MB of an exported program as the apps run it (see the module docstring).

    Raises:
        BadInput: no manifest, not JSON, not schema_version 2, or no ExecuTorch memory plan for a train method.
        SchemaError: the manifest violates its schema.
    """
    path = Path(program_dir) / MANIFEST_NAME
    manifest = _read_manifest(path)
    plan = manifest["memory_plan"]
    arenas = plan["planned_arena_bytes"]
    loaded = [m["name"] for m in manifest["methods"] if m["kind"] == "train_step"]
    missing = [name for name in loaded if name not in arenas]
    if missing:
        raise BadInput(f"{path}: memory_plan.planned_arena_bytes has no arena for {', '.join(missing)} (only an "
                       f"ExecuTorch export plans one); export with --target executorch, or drop --program")
    total = sum(arenas[name] for name in loaded)
    what = f"planned_arena ({loaded[0]})" if len(loaded) == 1 else f"planned_arenas ({len(loaded)} methods)"
    parts = {what: total / BYTES_PER_MB, "lora_state": plan["lora_state_bytes"] / BYTES_PER_MB}
    if overhead_mb:
        parts["runtime_overhead"] = overhead_mb
    notes = [f"program constants {plan['constant_bytes'] / BYTES_PER_MB:.1f} MB not counted (memory-mapped weights "
             f"are clean pages the phone's footprint excludes)",
             "a lower bound for large programs: the runtime's per-method metadata (grows with the graph) and the "
             "outputs copied out of the arena are not counted; the Qwen2.5-0.5B int4 program measured 120.4 MB "
             "against 79.5 MB predicted (docs/export.md)"]
    if len(loaded) > 1:
        largest = max(loaded, key=lambda name: arenas[name])
        notes.append(f"the apps load all {len(loaded)} train methods up front and each loaded method has its own "
                     f"arena; loaded one at a time (or with shared arenas) the largest alone is "
                     f"{arenas[largest] / BYTES_PER_MB:.1f} MB ({largest})")
    return ProgramPeak(sum(parts.values()), parts, notes, manifest)


def _check_program_shape(manifest: dict, shape: StepShape, where: Path) -> None:
    arch = {k: manifest["model"]["arch"].get(k) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate",
                                                          "vocab")}
    want = {k: getattr(shape.arch, k) for k in arch}
    got = {"seq_len": manifest["seq_len"], "rank": manifest["lora"]["rank"], **arch}
    bad = [f"{k} {got[k]} (not {v})" for k, v in {"seq_len": shape.seq_len, "rank": shape.rank, **want}.items()
           if got[k] != v]
    if bad:
        raise BadInput(f"{where} was exported with {', '.join(bad)}; pass the program's model, --seq-len and "
                       f"--rank, or drop --program")


def _max_rank(shape: StepShape) -> int:
    return min(min(shape.arch.linear_shape(t)) for t in shape.targets)


def plan_fit(shape: StepShape, device: DeviceProfile, *, program_dir: Path | None = None,
             overhead_mb: float | None = None) -> FitReport:
    """Does `shape` fit `device`? See the module docstring.

    Args:
        overhead_mb: runtime memory on top of the tensors; None: the calibrated constant of the source
            (HOST_OVERHEAD_MB for the analytic model, EXECUTORCH_OVERHEAD_MB for a program).
    """
    host = HOST_OVERHEAD_MB if overhead_mb is None else overhead_mb
    analytic = estimate_peak(shape, overhead_mb=host)
    notes = []
    if program_dir is not None:
        prog = program_peak(program_dir, overhead_mb=EXECUTORCH_OVERHEAD_MB if overhead_mb is None else overhead_mb)
        _check_program_shape(prog.manifest, shape, Path(program_dir))
        peak, parts, notes, source, phase = prog.peak_mb, prog.parts_mb, list(prog.notes), "program", None
        used = parts.get("runtime_overhead", 0.0)
        notes.append("largest seq len / rank below come from the analytic model")
    else:
        peak, parts, source, phase, used = analytic.peak_mb, analytic.parts_mb, "analytic", analytic.phase, host
        if phase == "backward (saved only)":
            notes.append(f"{shape.method}: the peak is in a block's backward, whose autograd transients are not "
                         f"modelled: this is a lower bound (the LM head dominates for every Qwen2.5 preset)")
    if overhead_mb is None:
        notes.append(f"runtime overhead {used:.1f} MB: calibrated with `toolchain bench memory` (docs/planner.md)")
    budget = device.budget_mb
    max_rank = _max_rank(shape)
    return FitReport(
        device=device.name, budget_mb=budget, predicted_peak_mb=peak, source=source, fits=peak <= budget,
        margin_mb=budget - peak, parts_mb=parts, phase=phase, analytic_peak_mb=analytic.peak_mb,
        largest_seq_len=largest_fitting(shape, budget, "seq_len", shape.arch.max_positions, overhead_mb=host),
        largest_rank=largest_fitting(replace(shape), budget, "rank", max_rank, overhead_mb=host),
        max_rank=max_rank, overhead_mb=used, notes=notes)
