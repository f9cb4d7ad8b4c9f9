"""The step plan a run asks for: a plan file (`--plan`), or a policy built on the fly (`--lcsb-k`,
`--lcsb-policy`, `--lcsb-seed`, `--lcsb-warmup`), or neither (full backprop)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolchain.errors import BadInput
from toolchain.lcsb.plan import Policy, StepPlan, make_plan, read_plan

__all__ = ["PlanRequest"]


@dataclass(frozen=True)
class PlanRequest:
    """What the plan options ask for; `resolve` turns it into a `StepPlan` for a model's layer count.

    Args:
        path: a step plan JSON (`toolchain plan lcsb`); exclusive with the other fields. Default: None.
        k: layers backpropagated per step. Default: None (full backprop, or the policy's own k).
        policy: how layers are chosen per step. Default: None, "cyclic" with `k`, else "full".
        seed: seed of the "random" policy (only that policy has one). Default: None (0).
        warmup: full-backprop steps before the plan (`StepPlan.warmup`). Default: None (0).

    Raises:
        BadInput: a plan file together with k/policy/seed/warmup, a seed for a policy other than random,
            a warm-up without a selective policy, or a negative warm-up.
    """

    path: Path | None = None
    k: int | None = None
    policy: Policy | None = None
    seed: int | None = None
    warmup: int | None = None

    def __post_init__(self) -> None:
        if self.path is not None and any(v is not None for v in (self.k, self.policy, self.seed, self.warmup)):
            raise BadInput("--plan and --lcsb-k/--lcsb-policy/--lcsb-seed/--lcsb-warmup are exclusive; give one or "
                           "the other (a plan file records its own warmup: `toolchain plan lcsb --warmup N`)")
        if self.warmup is not None and self.warmup < 0:
            raise BadInput(f"--lcsb-warmup must be >= 0, got {self.warmup}")
        if self.warmup is not None and self.path is None and self.policy_name == "full":
            raise BadInput("--lcsb-warmup applies to an LCSB plan (--lcsb-k and/or --lcsb-policy); full backprop has "
                           "no warm-up")
        if self.seed is not None and self.policy_name != "random":
            raise BadInput(f"--lcsb-seed applies to --lcsb-policy random, not {self.policy_name}; drop it or "
                           f"choose random")

    @property
    def given(self) -> bool:
        """Whether any plan option was given (else the caller's default applies)."""
        return any(v is not None for v in (self.path, self.k, self.policy, self.seed, self.warmup))

    @property
    def policy_name(self) -> str:
        return self.policy or ("cyclic" if self.k is not None else "full")

    def resolve(self, layers: int) -> StepPlan:
        """The plan, checked against the model's `layers`; nothing given: full backprop."""
        if self.path is not None:
            step_plan = read_plan(self.path)
            step_plan.check_layers(layers, where=f"plan {self.path}")
            return step_plan
        policy = self.policy_name
        return make_plan(layers, self.k, policy, seed=self.seed if policy == "random" else None,
                         warmup=self.warmup or 0)

    def resolve_lcsb(self, layers: int) -> StepPlan | None:
        """The plan if it selects layers (LCSB); None for full backprop or when nothing was given."""
        if not self.given:
            return None
        step_plan = self.resolve(layers)
        return None if step_plan.policy == "full" else step_plan
