""""Will it fit": predicted peak memory of a training config against a device profile's budget.

The prediction comes from the exported program's memory plan when one is given (its manifest's
`memory_plan`), else from the analytic model (`estimate.py`) plus a calibrated runtime overhead.
Either way the answer names its source, the parts of the peak, and the largest sequence length
and LoRA rank that would fit (from the analytic model: a program has its shapes fixed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from toolchain.errors import BadInput
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak, largest_fitting
from toolchain.memory.profiles import DeviceProfile
from toolchain.schemas import SCHEMA_NAMES, validate

__all__ = ["FitReport", "plan_fit", "program_peak"]

MANIFEST_NAME = "manifest.json"


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


def _plan_value(plan: dict, key: str, where: str):
    if key not in plan:
        raise BadInput(f"{where} has no memory_plan.{key}; re-export the program with a toolchain that writes "
                       f"its memory plan, or drop --program to use the analytic model")
    return plan[key]


def program_peak(program_dir: Path) -> tuple[float, dict[str, float], list[str]]:
    """Peak MB of an exported program from DIR/manifest.json's memory plan: the largest method's
    planned arena plus the LoRA state. Constants (frozen weights) are memory-mapped and not counted.

    Raises:
        BadInput: no manifest, not JSON, or no memory plan in it.
    """
    path = Path(program_dir) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path} does not exist; --program must be a directory written by `toolchain export`") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if "manifest" in SCHEMA_NAMES:
        validate("manifest", manifest, where=str(path))
    plan = manifest.get("memory_plan") if isinstance(manifest, dict) else None
    if not isinstance(plan, dict):
        raise BadInput(f"{path} has no memory_plan; re-export the program with a toolchain that writes its "
                       f"memory plan, or drop --program to use the analytic model")
    arenas = _plan_value(plan, "planned_arena_bytes", str(path))
    if not isinstance(arenas, dict) or not arenas:
        raise BadInput(f"{path}: memory_plan.planned_arena_bytes must map each method to its arena bytes")
    method = max(arenas, key=arenas.get)
    lora = _plan_value(plan, "lora_state_bytes", str(path))
    constants = plan.get("constant_bytes", 0)
    parts = {f"planned_arena ({method})": arenas[method] / BYTES_PER_MB, "lora_state": lora / BYTES_PER_MB}
    notes = [f"program constants {constants / BYTES_PER_MB:.1f} MB not counted (memory-mapped weights are clean "
             f"pages the phone's footprint excludes)"]
    return sum(parts.values()), parts, notes


def _max_rank(shape: StepShape) -> int:
    return min(min(shape.arch.linear_shape(t)) for t in shape.targets)


def plan_fit(shape: StepShape, device: DeviceProfile, *, program_dir: Path | None = None,
             overhead_mb: float = 0.0) -> FitReport:
    """Does `shape` fit `device`? See the module docstring.

    Args:
        overhead_mb: runtime/allocator memory on top of the model's tensors (calibration constant).
    """
    analytic = estimate_peak(shape, overhead_mb=overhead_mb)
    notes = []
    if program_dir is not None:
        peak, parts, notes = program_peak(program_dir)
        if overhead_mb:
            parts["runtime_overhead"] = overhead_mb
            peak += overhead_mb
        source, phase = "program", None
        notes.append("largest seq len / rank below come from the analytic model")
    else:
        peak, parts, source, phase = analytic.peak_mb, analytic.parts_mb, "analytic", analytic.phase
    if overhead_mb == 0:
        notes.append("runtime overhead not included (0 MB): pass --overhead-mb once `bench memory` calibrated it")
    budget = device.budget_mb
    max_rank = _max_rank(shape)
    return FitReport(
        device=device.name, budget_mb=budget, predicted_peak_mb=peak, source=source, fits=peak <= budget,
        margin_mb=budget - peak, parts_mb=parts, phase=phase, analytic_peak_mb=analytic.peak_mb,
        largest_seq_len=largest_fitting(shape, budget, "seq_len", shape.arch.max_positions, overhead_mb=overhead_mb),
        largest_rank=largest_fitting(replace(shape), budget, "rank", max_rank, overhead_mb=overhead_mb),
        max_rank=max_rank, overhead_mb=overhead_mb, notes=notes)
