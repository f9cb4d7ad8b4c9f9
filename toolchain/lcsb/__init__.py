"""LCSB: layer-cyclic selective backpropagation, as step plans (which layers each step backpropagates
through). The optimizer, with LCSB's zero-gradient rule for unselected layers, is `toolchain.optim`."""

from toolchain.lcsb.plan import POLICIES, Policy, StepPlan, make_plan, plan_from_dict, read_plan, write_plan
from toolchain.lcsb.resolve import PlanRequest

__all__ = ["PlanRequest", "Policy", "POLICIES", "StepPlan", "make_plan", "plan_from_dict", "read_plan", "write_plan"]
