"""The working set a training step can lower at run time, and the order its knobs are lowered in under memory
pressure (docs/training.md "Memory pressure"): one ladder for the trainers (`training/pressure.py`) and for
`toolchain plan fit`'s `fallback`.

Knobs, cheapest in quality first:
  layers_per_checkpoint  doubles (checkpoint groups: fewer layer inputs alive, one more block forward per group;
                         gradients exact), up to the layers backpropagated per step;
  lcsb_k                 halves (LCSB: fewer layers backpropagated per step; the stop-gradient surrogate), down to 1;
  seq_len                halves (the next rows cut to their first tokens), down to MIN_SEQ_LEN; only where the
                         rows' length is a run-time choice (eager steps: a program is padded to its export length).
A notch is taken only when the planner (`predict`) says it lowers the peak: e.g. groups larger than about
sqrt(k) keep more inputs alive than they save (`mesp.step.inputs_alive_bound`), so that notch is passed over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["KNOBS", "MIN_SEQ_LEN", "Knob", "WorkingSet", "Notch", "notch", "next_notch", "fallback_ladder"]

Knob = Literal["layers_per_checkpoint", "lcsb_k", "seq_len"]
KNOBS: tuple[Knob, ...] = ("layers_per_checkpoint", "lcsb_k", "seq_len")
MIN_SEQ_LEN = 16   # below this a row holds too little text to train on


@dataclass(frozen=True)
class WorkingSet:
    """The run-time knobs of one training step.

    Args:
        layers_per_checkpoint: checkpoint groups (1: every selected layer's input kept).
        lcsb_k: layers backpropagated per step; None: every layer (no LCSB).
        seq_len: the most tokens of a row the step takes; None: fixed (a program's export length).
    """

    layers_per_checkpoint: int = 1
    lcsb_k: int | None = None
    seq_len: int | None = None

    def selected(self, layers: int) -> int:
        return layers if self.lcsb_k is None else self.lcsb_k

    def to_json(self) -> dict:
        """The telemetry form (`working_set` of telemetry_event.schema.json): a fixed seq_len is left out."""
        d = {"layers_per_checkpoint": self.layers_per_checkpoint, "lcsb_k": self.lcsb_k}
        if self.seq_len is not None:
            d["seq_len"] = self.seq_len
        return d

    def describe(self) -> str:
        parts = [f"layers_per_checkpoint {self.layers_per_checkpoint}",
                 f"lcsb_k {'all' if self.lcsb_k is None else self.lcsb_k}"]
        if self.seq_len is not None:
            parts.append(f"seq_len {self.seq_len}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Notch:
    knob: Knob
    before: WorkingSet
    after: WorkingSet
    predicted_mb: float | None   # the planner's peak for `after` (None: no planner figure)


def notch(ws: WorkingSet, knob: Knob, layers: int) -> WorkingSet | None:
    """`ws` with `knob` lowered by one notch, or None when it is at its lowest."""
    k = ws.selected(layers)
    if knob == "layers_per_checkpoint":
        return None if ws.layers_per_checkpoint >= k else replace(ws, layers_per_checkpoint=min(
            2 * ws.layers_per_checkpoint, k))
    if knob == "lcsb_k":
        if k <= 1:
            return None
        new_k = max(1, k // 2)
        return replace(ws, lcsb_k=new_k, layers_per_checkpoint=min(ws.layers_per_checkpoint, new_k))
    if ws.seq_len is None or ws.seq_len <= MIN_SEQ_LEN:
        return None
    return replace(ws, seq_len=max(MIN_SEQ_LEN, ws.seq_len // 2))


def next_notch(ws: WorkingSet, layers: int, predict: Callable[[WorkingSet], float | None]) -> Notch | None:
    """The first notch, in KNOBS order, that the planner predicts lowers the peak of `ws` (a knob's further
    notches are tried when one does not help); None: nothing smaller is predicted to help."""
    base = predict(ws)
    for knob in KNOBS:
        new = notch(ws, knob, layers)
        while new is not None:
            p = predict(new)
            if base is None or p is None or p < base:
                return Notch(knob, ws, new, p)
            new = notch(new, knob, layers)
    return None


def fallback_ladder(ws: WorkingSet, layers: int, predict: Callable[[WorkingSet], float | None],
                    budget_mb: float) -> tuple[WorkingSet, float | None, list[Notch]]:
    """Walk the ladder from `ws` until the planner predicts the budget is met: (the settings, their predicted
    peak, the notches taken). When no notch is left the last settings are returned with a peak over budget."""
    taken: list[Notch] = []
    peak = predict(ws)
    while peak is None or peak > budget_mb:
        n = next_notch(ws, layers, predict)
        if n is None:
            break
        taken.append(n)
        ws, peak = n.after, n.predicted_mb
    return ws, peak, taken
