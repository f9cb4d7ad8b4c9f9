"""Adapting a run to memory pressure (docs/training.md "Memory pressure"): after each step the step's anonymous
peak (what a phone counts: `memory.measure`, VmHWM - RssFile - RssShmem with VmHWM reset before the step) is
compared with the run's budget; when over, the next step runs one notch smaller along the planner's ladder
(`memory.fallback`). The trainer applies the new `WorkingSet` and logs `memory_adapted`; when no notch is left
the run stops (loop.py: checkpoint, `error` event, one message)."""

from __future__ import annotations

from collections.abc import Callable

from toolchain.memory.fallback import Notch, WorkingSet, next_notch
from toolchain.memory.measure import read_status, release_free_memory, reset_peak

__all__ = ["MemoryGuard"]


class MemoryGuard:
    """The budget check of one run.

    Args:
        budget_bytes: the anonymous-memory budget (`train --memory-budget`).
        layers: the model's decoder layers (the LCSB knob's range).
        predict_mb: the planner's peak (MB) of a working set, to order and skip notches (None: no figure).
    """

    def __init__(self, budget_bytes: int, layers: int, predict_mb: Callable[[WorkingSet], float | None]) -> None:
        self.budget_bytes, self.layers, self.predict_mb = budget_bytes, layers, predict_mb
        self.last_peak_bytes: int | None = None

    def before_step(self) -> None:
        """Free lists back to the kernel, then VmHWM reset: the step's peak is its own, not an earlier one's."""
        release_free_memory()
        reset_peak()

    def after_step(self) -> int:
        self.last_peak_bytes = max(0, read_status().peak_anon)
        return self.last_peak_bytes

    def over(self, measured_bytes: int) -> bool:
        return measured_bytes > self.budget_bytes

    def notch(self, ws: WorkingSet) -> Notch | None:
        """The next smaller working set the planner says helps (None: nothing smaller)."""
        return next_notch(ws, self.layers, self.predict_mb)
