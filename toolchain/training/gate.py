"""The evaluation gate (docs/training.md "The evaluation gate"): the held-out loss before the first step, at the
run's evaluations and after the last; the best adapter kept in memory; at the end the last adapter is kept only
when its loss is finite and below the start's, else the best one that is, else the starting adapter is restored.
A forgetting probe (general text shipped with the program, `text/probe.py`) measured at the start and on the kept
adapter flags a rise above PROBE_THRESHOLD: a warning, never a rollback (the run is meant to move the model toward
the user's text; the decision is made on the user's held-out rows).

`Evaluation` drives it for the shared loop (loop.py); the trainer supplies `held_out(rows)` (the loss of its live
state), `snapshot()` and `load_snapshot(s)`. `decide` is the decision alone, a pure function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from toolchain.text.dataset import DataRow

__all__ = ["PROBE_THRESHOLD", "GateDecision", "ProbeCheck", "decide", "Evaluation"]

# Forgetting is flagged when the probe's loss rises by more than 5% (relative). On the demo model a good 200-step
# run on the bundled user text moves it by a few percent; the threshold is a warning line, not a quality bar.
PROBE_THRESHOLD = 0.05

Decision = Literal["kept", "kept_best", "rolled_back"]


def _fmt(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else str(x)   # nan, inf, -inf


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass(frozen=True)
class ProbeCheck:
    """The probe's loss on the starting adapter and on the kept one."""

    start_loss: float
    end_loss: float
    threshold: float = PROBE_THRESHOLD

    @property
    def rise(self) -> float | None:
        if not (math.isfinite(self.start_loss) and math.isfinite(self.end_loss)) or self.start_loss <= 0:
            return None
        return (self.end_loss - self.start_loss) / self.start_loss

    @property
    def forgetting(self) -> bool:
        rise = self.rise
        return (not math.isfinite(self.end_loss)) or (rise is not None and rise > self.threshold)

    def warning(self) -> str | None:
        if not self.forgetting:
            return None
        rise = "" if self.rise is None else f" {self.rise * 100:.1f}%"
        return (f"forgetting: the general-text probe's loss rose{rise} ({_fmt(self.start_loss)} -> "
                f"{_fmt(self.end_loss)}), above the {self.threshold * 100:g}% threshold")


@dataclass(frozen=True)
class GateDecision:
    decision: Decision
    start_loss: float
    end_loss: float
    best_loss: float | None     # lowest finite loss after the start (None: none finite)
    best_step: int | None
    kept_step: int
    reason: str
    probe: ProbeCheck | None = None

    def event_fields(self) -> dict[str, Any]:
        """The `gate` telemetry event's fields (non-finite losses as null)."""
        d = {"decision": self.decision, "start_loss": _finite(self.start_loss), "end_loss": _finite(self.end_loss),
             "best_loss": self.best_loss, "best_step": self.best_step, "kept_step": self.kept_step,
             "reason": self.reason, "probe": "no_probe" if self.probe is None else "measured"}
        if self.probe is not None:
            p = self.probe
            d.update(probe_start_loss=_finite(p.start_loss), probe_end_loss=_finite(p.end_loss),
                     probe_rise=None if p.rise is None else round(p.rise, 6), probe_threshold=p.threshold,
                     forgetting=p.forgetting)
        return d

    def lines(self) -> list[str]:
        """What the run prints: the decision, then the probe's verdict."""
        out = [f"gate: {self.reason}"]
        if self.probe is None:
            out.append("gate: no probe (an eager run, or a program exported without one): no forgetting check")
        else:
            w = self.probe.warning()
            out.append(f"warning: {w}" if w else f"gate: probe {_fmt(self.probe.start_loss)} -> "
                                                 f"{_fmt(self.probe.end_loss)} (no forgetting above "
                                                 f"{self.probe.threshold * 100:g}%)")
        return out


def decide(start_step: int, start_loss: float, later: Sequence[tuple[int, float]]) -> GateDecision:
    """The gate's decision from the start's held-out loss and the later evaluations `(step, loss)`, the last of
    them after the last step. A non-finite start loss counts as +inf (any finite loss beats it)."""
    if not later:
        raise ValueError("decide() needs the evaluation after the last step")
    end_step, end_loss = later[-1]
    finite = [(loss, step) for step, loss in later if math.isfinite(loss)]
    best_loss, best_step = min(finite, key=lambda ls: (ls[0], -ls[1])) if finite else (None, None)
    start = start_loss if math.isfinite(start_loss) else math.inf
    if math.isfinite(end_loss) and end_loss < start and end_loss <= best_loss:
        return GateDecision("kept", start_loss, end_loss, best_loss, best_step, end_step,
                            f"kept: held-out {_fmt(start_loss)} -> {_fmt(end_loss)}")
    if best_loss is not None and best_loss < start:
        return GateDecision("kept_best", start_loss, end_loss, best_loss, best_step, best_step,
                            f"kept best: held-out {_fmt(start_loss)} -> {_fmt(best_loss)} at step {best_step} "
                            f"(last {_fmt(end_loss)})")
    return GateDecision("rolled_back", start_loss, end_loss, best_loss, best_step, start_step,
                        f"rolled back: held-out {_fmt(start_loss)} -> {_fmt(end_loss)}")


class Evaluation:
    """The held-out evaluations of one run and, with `gate`, its decision.

    Args:
        held: the held-out rows (the caller caps them at HELD_OUT_EVAL_ROWS).
        every: evaluate every N steps (0: only before the first and after the last).
        gate: decide at the end (False: evaluate and log only: `--no-gate`).
        probe: the forgetting probe's rows (None: the program has none).
        on_eval: called with each point {"step", "loss", "rows", "tokens"}.
    """

    def __init__(self, held: Sequence[DataRow], *, every: int = 0, gate: bool = True,
                 probe: Sequence[DataRow] | None = None,
                 on_eval: Callable[[dict], None] | None = None) -> None:
        self.held, self.every, self.gate, self.probe, self.on_eval = list(held), every, gate, probe, on_eval
        self.points: list[dict] = []
        self.decision: GateDecision | None = None
        self._start: tuple[int, float] | None = None
        self._start_snapshot = self._best_snapshot = None
        self._best: float = math.inf
        self._probe_start: float | None = None

    def due(self, step: int, last: bool) -> bool:
        return last or (self.every > 0 and step % self.every == 0)

    def evaluate(self, trainer, step: int) -> float:
        """The held-out loss of the trainer's live state after `step` steps: an `eval` event, a point, on_eval."""
        from toolchain.training.checkpoint import finite_or_none

        t0 = time.perf_counter()
        ev = trainer.held_out(self.held)
        if not trainer.logged_eval(step):
            trainer.emit("eval", step=step, loss=finite_or_none(ev["loss"]), rows=ev["rows"], tokens=ev["tokens"],
                         eval_time_s=round(time.perf_counter() - t0, 6))
        point = {"step": step, "loss": ev["loss"], "rows": ev["rows"], "tokens": ev["tokens"]}
        self.points.append(point)
        if self.on_eval is not None:
            self.on_eval(point)
        return ev["loss"]

    def begin(self, trainer, step: int) -> None:
        """Before the first step of this session (`step`: the steps already done, 0 unless resumed)."""
        loss = self.evaluate(trainer, step)
        if not self.gate:
            return
        self._start = (step, loss)
        self._start_snapshot = trainer.snapshot()
        if self.probe:
            self._probe_start = trainer.held_out(self.probe)["loss"]

    def after_step(self, trainer, step: int, last: bool) -> None:
        if not self.due(step, last):
            return
        loss = self.evaluate(trainer, step)
        if self.gate and not last and math.isfinite(loss) and loss <= self._best:
            self._best, self._best_snapshot = loss, trainer.snapshot()
        if self.gate and last and math.isfinite(loss) and loss <= self._best:
            self._best_snapshot = None          # the last one is the best: nothing earlier to restore

    def finish(self, trainer) -> GateDecision | None:
        """After the last step's evaluation: decide, restore the kept state, log the `gate` event."""
        if not self.gate or self._start is None:
            return None
        start_step, start_loss = self._start
        later = [(p["step"], p["loss"]) for p in self.points if p["step"] > start_step]
        d = decide(start_step, start_loss, later)
        if d.decision == "rolled_back":
            trainer.load_snapshot(self._start_snapshot)
        elif d.decision == "kept_best":
            trainer.load_snapshot(self._best_snapshot)
        self._start_snapshot = self._best_snapshot = None
        if self._probe_start is not None:
            d = GateDecision(**{**d.__dict__, "probe": ProbeCheck(self._probe_start,
                                                                  trainer.held_out(self.probe)["loss"])})
        trainer.emit("gate", **d.event_fields())
        self.decision = d
        return d
