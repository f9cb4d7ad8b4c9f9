"""What a training run reports, the same for the eager and the program trainers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from toolchain.lora.weights import LoraWeights

__all__ = ["StepLog", "RunOutcome"]


class StepLog(NamedTuple):
    step: int                  # 1-based: the steps the run has taken after this one
    loss: float                # loss of this step's example, before its update
    row: int                   # index of the example in the data
    layers: tuple[int, ...]    # layers backpropagated through
    step_s: float              # wall time of the step (forward, backward, update)


@dataclass(frozen=True)
class RunOutcome:
    """How a training run ended (the apps' `RunOutcome`): the adapter, the steps, the losses.

    Args:
        lora: the adapter after the last step.
        log: the steps this call ran (after a resume: from the checkpoint's step on).
        losses: every step's loss over the whole run, the resumed-from part included (None: not finite).
        run_id: the run's telemetry id ("local" without telemetry).
        state: what a checkpoint holds: the eager `RunState` (adapter + optimizer state), or a program's
            flat float32 state vector.
        `lora` and `state` are the kept ones: after a gate's rollback the starting adapter, after `kept_best`
        the best evaluated one.
    """

    lora: LoraWeights
    log: tuple[StepLog, ...]
    losses: tuple[float | None, ...]
    run_id: str
    state: Any
    gate: Any = None                 # gate.GateDecision: the evaluation gate's decision (None: no gate)
    adaptations: tuple[dict, ...] = ()   # the `memory_adapted` events' fields, in step order

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None
