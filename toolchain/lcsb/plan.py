"""LCSB step plans: which decoder layers each training step backpropagates through.

Layer-Cyclic Selective Backpropagation (arXiv 2602.13073) partitions the L layers into groups and
backpropagates through one group per step, cycling over steps; the other layers run forward only and
are identity in backward. A plan is a finite list of *phases* (each a sorted tuple of layers) and a
*schedule* (step -> phase index, repeated cyclically), so a phone can export one step program per
phase and cycle through the schedule without knowing the policy that produced it.

Policies (k = most layers selected per step, g = ceil(L / k) groups):
  cyclic   contiguous groups, sizes as equal as possible (L=10, k=4: {0-2}, {3-5}, {6-9}).
  strided  groups {i, i+g, i+2g, ...} for i < g (L=10, k=4: {0,3,6,9}, {1,4,7}, {2,5,8}).
  last     the last k layers at every step (MLX's `--num-layers`).
  anchored the top k - 1 layers at every step, plus one of the other L - k + 1, cycling bottom-up (L=10,
           k=4: {0,7,8,9}, {1,7,8,9}, ..., {6,7,8,9}; period L - k + 1). The top layers' gradients are then
           exact at every step, and every layer is still trained (docs/lcsb.md "What limits the gap": at the same
           cost per step, the bench's loss gap is about half of cyclic's).
  random   k layers drawn uniformly without replacement at every step (as LISA samples layers): step
           t selects the first k of `toolchain.text.shuffle.permutation(L, seed + t)`, sorted, which the
           apps compute the same way; the draws repeat after `period` steps (a finite plan).
  full     every layer at every step (ordinary backprop; k = L).
A plan may start with a *warm-up*: steps s < `warmup` backpropagate through every layer (ordinary
backprop); from step `warmup` on, step s uses phases[schedule[s % len(schedule)]] (the global step index:
the schedule does not restart after the warm-up). docs/lcsb.md "Benchmark": a 10% warm-up before
`anchored` cuts the bench's loss gap by about a third.
The schedule of cyclic and strided visits the groups in ascending order, so over one period each
layer is selected exactly once; anchored visits its cycling layer in ascending order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from toolchain.errors import BadInput, SchemaError
from toolchain.schemas import read_json, write_json
from toolchain.text.shuffle import permutation

__all__ = ["Policy", "POLICIES", "StepPlan", "make_plan", "read_plan", "write_plan", "plan_from_dict"]

Policy = Literal["cyclic", "strided", "last", "anchored", "random", "full"]
POLICIES: tuple[str, ...] = get_args(Policy)
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class StepPlan:
    """A finite LCSB schedule for a model with `layers` decoder layers.

    Args:
        layers: decoder layers of the model the plan is for.
        policy: the policy that generated the phases (see the module docstring).
        k: most layers selected in one step (every phase has at most k layers).
        phases: distinct layer selections, each sorted ascending.
        schedule: step -> index into `phases`; step s uses `schedule[s % len(schedule)]`.
        seed: the random policy's seed; None for the others.
        warmup: steps s < warmup backpropagate through every layer; later steps follow the schedule
            (global step index). Default: 0 (no warm-up; not written to JSON).
    """

    layers: int
    policy: Policy
    k: int
    phases: tuple[tuple[int, ...], ...]
    schedule: tuple[int, ...]
    seed: int | None = None
    warmup: int = 0

    def __post_init__(self) -> None:
        # JSON Schema's "integer" takes 1.0 (and a plan file may hold true): every index an int, or one BadInput
        for name in ("layers", "k"):
            if type(getattr(self, name)) is not int:
                raise BadInput(f"`{name}` must be an integer, got {getattr(self, name)!r}")
        if self.seed is not None and type(self.seed) is not int:
            raise BadInput(f"`seed` must be an integer or null, got {self.seed!r}")
        for where, values in [*((f"phase {i}", p) for i, p in enumerate(self.phases)), ("schedule", self.schedule)]:
            wrong = [v for v in values if type(v) is not int]
            if wrong:
                raise BadInput(f"{where} holds {wrong[0]!r}; layer and phase indices must be integers")
        if type(self.warmup) is not int or self.warmup < 0:
            raise BadInput(f"`warmup` must be an integer >= 0 (full-backprop steps before the plan), got "
                           f"{self.warmup!r}")
        if self.layers < 1:
            raise BadInput(f"`layers` must be >= 1, got {self.layers}")
        if self.policy not in POLICIES:
            raise BadInput(f"unknown LCSB policy {self.policy!r}; choose {', '.join(POLICIES)}")
        if not 1 <= self.k <= self.layers:
            raise BadInput(f"`k` = {self.k} must be between 1 and the model's {self.layers} layers")
        if (self.seed is None) != (self.policy != "random"):
            raise BadInput(f"`seed` must be set for the random policy and null otherwise (policy {self.policy!r}, "
                           f"seed {self.seed!r})")
        if not self.phases or not self.schedule:
            raise BadInput("a plan needs at least one phase and a non-empty schedule")
        for i, phase in enumerate(self.phases):
            if not phase or list(phase) != sorted(set(phase)):
                raise BadInput(f"phase {i} {list(phase)} must be a non-empty, strictly ascending list of layers")
            outside = [layer for layer in phase if not 0 <= layer < self.layers]
            if outside:
                raise BadInput(f"phase {i} selects layer {outside[0]}, but the plan's model has layers "
                               f"0..{self.layers - 1}")
            if len(phase) > self.k:
                raise BadInput(f"phase {i} selects {len(phase)} layers, more than k = {self.k}")
        bad = [s for s in self.schedule if not 0 <= s < len(self.phases)]
        if bad:
            raise BadInput(f"schedule refers to phase {bad[0]}, but the plan has {len(self.phases)} phases")
        unused = sorted(set(range(len(self.phases))) - set(self.schedule))
        if unused:
            raise BadInput(f"phase {unused[0]} is never scheduled; drop it or add it to `schedule`")

    @property
    def period(self) -> int:
        """Steps after which the schedule repeats (after the warm-up, if any)."""
        return len(self.schedule)

    def layers_at(self, step: int) -> tuple[int, ...]:
        """Layers to backpropagate through at `step` (0-based, counted over the whole run): every layer
        during the warm-up, else the step's phase."""
        if step < self.warmup:
            return tuple(range(self.layers))
        return self.phases[self.schedule[step % len(self.schedule)]]

    def phase_at(self, step: int) -> int | None:
        """Index into `phases` of `step`; None during the warm-up (every layer, no phase)."""
        if step < self.warmup:
            return None
        return self.schedule[step % len(self.schedule)]

    @property
    def max_layers(self) -> int:
        """Most layers one step backpropagates through: k, or every layer when there is a warm-up."""
        return self.layers if self.warmup > 0 else self.k

    def selection_counts(self) -> list[int]:
        """How many times each layer is selected over one period of the schedule (warm-up excluded)."""
        counts = [0] * self.layers
        for s in range(self.period):
            for layer in self.phases[self.schedule[s]]:
                counts[layer] += 1
        return counts

    def check_layers(self, layers: int, *, where: str = "plan") -> None:
        """Raise BadInput unless the plan was made for a model with `layers` decoder layers."""
        if self.layers != layers:
            raise BadInput(f"{where} is for {self.layers} layers but the model has {layers}; "
                           f"make one with `toolchain plan lcsb --layers {layers} ...`")

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON; `warmup` only when > 0, so plans without one stay byte-identical."""
        doc = {"schema_version": SCHEMA_VERSION, "layers": self.layers, "policy": self.policy, "k": self.k,
               "seed": self.seed, "phases": [list(p) for p in self.phases], "schedule": list(self.schedule)}
        if self.warmup > 0:
            doc["warmup"] = self.warmup
        return doc


def plan_from_dict(doc: dict[str, Any], *, where: str = "plan") -> StepPlan:
    """Build a plan from a schema-valid document, checking what the schema cannot (ranges, references).

    Raises:
        SchemaError: the document is structurally valid JSON but not a consistent plan.
    """
    try:
        return StepPlan(layers=doc["layers"], policy=doc["policy"], k=doc["k"], seed=doc.get("seed"),
                        phases=tuple(tuple(p) for p in doc["phases"]), schedule=tuple(doc["schedule"]),
                        warmup=doc.get("warmup", 0))
    except BadInput as e:
        raise SchemaError(f"{where} is not a consistent step_plan: {e}") from None


def read_plan(path: Path) -> StepPlan:
    """Read and validate a plan file (schema, then consistency)."""
    return plan_from_dict(read_json(Path(path), "step_plan"), where=str(path))


def write_plan(path: Path, plan: StepPlan) -> None:
    """Write the plan atomically as schema-validated JSON."""
    write_json(Path(path), "step_plan", plan.to_dict())


def make_plan(layers: int, k: int | None, policy: Policy, *, seed: int | None = None,
              period: int | None = None, warmup: int = 0) -> StepPlan:
    """Build the plan of a policy.

    Args:
        layers: decoder layers L.
        k: most layers per step; ignored (set to L) by `full`, required by the others.
        policy: cyclic, strided, last, anchored, random or full.
        seed: random policy only (default 0).
        period: random policy only: steps before the draws repeat. Default: 4 * ceil(L / k).
        warmup: full-backprop steps before the plan (steps s < warmup use every layer). Default: 0.

    Raises:
        BadInput: k missing or outside 1..L, seed/period given to a policy that has none, or warmup < 0.
    """
    if type(warmup) is not int or warmup < 0:
        raise BadInput(f"`warmup` must be an integer >= 0 (full-backprop steps before the plan), got {warmup!r}")
    if policy not in POLICIES:
        raise BadInput(f"unknown LCSB policy {policy!r}; choose {', '.join(POLICIES)}")
    if layers < 1:
        raise BadInput(f"`layers` must be >= 1, got {layers}")
    if policy == "full":
        k = layers
    if k is None:
        raise BadInput(f"the {policy} policy needs k (layers per step)")
    if not 1 <= k <= layers:
        raise BadInput(f"k = {k} is outside 1..{layers} (the model's layers); choose k <= {layers}")
    if policy != "random" and (seed is not None or period is not None):
        raise BadInput(f"seed and period only apply to the random policy, not {policy!r}")
    groups = math.ceil(layers / k)
    if policy == "cyclic":
        bounds = [layers * i // groups for i in range(groups + 1)]
        phases = [tuple(range(bounds[i], bounds[i + 1])) for i in range(groups)]
    elif policy == "strided":
        phases = [tuple(range(i, layers, groups)) for i in range(groups)]
    elif policy == "last":
        phases = [tuple(range(layers - k, layers))]
    elif policy == "anchored":
        top = tuple(range(layers - k + 1, layers))
        phases = [(j,) + top for j in range(layers - k + 1)]
    elif policy == "full":
        phases = [tuple(range(layers))]
    else:
        return _random_plan(layers, k, 0 if seed is None else seed, 4 * groups if period is None else period, warmup)
    return StepPlan(layers=layers, policy=policy, k=k, phases=tuple(phases), schedule=tuple(range(len(phases))),
                    warmup=warmup)


def _random_plan(layers: int, k: int, seed: int, period: int, warmup: int) -> StepPlan:
    if period < 1:
        raise BadInput(f"`period` must be >= 1, got {period}")
    phases: list[tuple[int, ...]] = []
    schedule = []
    for step in range(period):
        draw = tuple(sorted(permutation(layers, seed + step)[:k]))
        if draw not in phases:
            phases.append(draw)
        schedule.append(phases.index(draw))
    return StepPlan(layers=layers, policy="random", k=k, phases=tuple(phases), schedule=tuple(schedule), seed=seed,
                    warmup=warmup)
