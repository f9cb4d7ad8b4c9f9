"""Adapting a run to memory pressure (docs/training.md "Memory pressure"): after each step the step's anonymous
peak (what a phone counts: `memory.measure`, VmHWM - RssFile - RssShmem with VmHWM reset before the step) is
compared with the run's budget; when over, the next step runs one notch smaller along the planner's ladder
(`memory.fallback`). The trainer applies the new `WorkingSet` and logs `memory_adapted`; when no notch is left
the run stops (loop.py: checkpoint, `error` event, one message)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from toolchain.errors import BadInput
from toolchain.lcsb.plan import make_plan
from toolchain.memory.fallback import KNOBS, Knob, Notch, WorkingSet, next_notch
from toolchain.memory.measure import MIB, read_status, release_free_memory, reset_peak

__all__ = ["MemoryGuard", "check_budget", "stop_budget"]


class MemoryGuard:
    """The budget check of one run.

    Args:
        budget_bytes: the anonymous-memory budget (`train --memory-budget`).
        layers: the model's decoder layers (the LCSB knob's range).
        predict_mb: the planner's peak (MB) of a working set, to order and skip notches (None: no figure).
        knobs: the knobs the trainer's steps can lower (a DPO run's pairs keep their length: not seq_len).
    """

    def __init__(self, budget_bytes: int, layers: int, predict_mb: Callable[[WorkingSet], float | None],
                 knobs: tuple[Knob, ...] = KNOBS) -> None:
        self.budget_bytes, self.layers, self.predict_mb, self.knobs = budget_bytes, layers, predict_mb, knobs
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
        return next_notch(ws, self.layers, self.predict_mb, knobs=self.knobs)


def check_budget(trainer, guard: MemoryGuard, measured: int, s: int, next_row: int, saved: int,
                 losses: list) -> int:
    """After step `s` (0-based) of `trainer` (loop.py's run): lower its working set when the step's peak was over the
    budget, or when the planner predicts the next row (a longer one) would be; stop when nothing smaller is left.
    Returns the step of the last checkpoint."""
    trigger, figure = None, measured
    ws = trainer.working
    if guard.over(measured):
        trigger = "measured"
    else:
        cur, nxt = trainer.row_tokens(trainer._order[s]), trainer.row_tokens(next_row)
        if cur is not None and nxt is not None and nxt > cur and ws.seq_len is not None:
            a = trainer.predict_peak_mb(dataclasses.replace(ws, seq_len=min(ws.seq_len, nxt)))
            b = trainer.predict_peak_mb(dataclasses.replace(ws, seq_len=min(ws.seq_len, cur)))
            if a is not None and b is not None and guard.over(measured + round((a - b) * MIB)):
                trigger, figure = "predicted", measured + round((a - b) * MIB)
    if trigger is None:
        return saved
    notch = guard.notch(ws)
    if notch is None:
        return stop_budget(trainer, guard, figure, s + 1, saved, losses)
    trainer.working = notch.after
    if notch.knob == "lcsb_k":               # a run-time plan: any layer subset runs without re-export
        trainer._plan = make_plan(trainer.layers, notch.after.lcsb_k, "cyclic")
    event = {"step": s + 1, "knob": notch.knob, "from": notch.before.to_json(), "to": notch.after.to_json(),
             "measured_bytes": figure, "budget_bytes": guard.budget_bytes, "trigger": trigger}
    if notch.predicted_mb is not None:
        event["predicted_bytes"] = round(notch.predicted_mb * MIB)
    trainer.adaptations.append(event)
    trainer.emit("memory_adapted", **event)
    return saved


def stop_budget(trainer, guard: MemoryGuard, measured: int, step: int, saved: int, losses: list) -> int:
    """Nothing smaller fits after `step` steps: checkpoint them, log a fatal `error`, stop with one message.

    Raises:
        BadInput: always (the message names the peak, the budget, the settings and the checkpoint).
    """
    run = trainer.run_options
    if run.checkpoint is not None and step > saved:
        trainer._save(step, losses)
        saved = step
    where = (f"; the checkpoint of step {saved} is at {run.checkpoint}: resume with a larger --memory-budget"
             if run.checkpoint is not None and saved > 0 else "")
    message = (f"stopped after step {step}: anonymous peak {measured / MIB:.1f} MiB is over --memory-budget "
               f"{guard.budget_bytes / MIB:g} MiB with the smallest settings ({trainer.working.describe()}){where}")
    trainer.emit("error", message=message, fatal=True, code="budget_exceeded", step=step - 1)
    raise BadInput(message)
