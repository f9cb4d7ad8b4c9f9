"""LCSB: layer-cyclic selective backpropagation (step plans) and the optimizers that update LoRA
adapters layer by layer, with LCSB's zero-gradient semantics for non-selected layers."""

from toolchain.lcsb.optim import SGD, AdamW, LayerSlots, OptimizerConfig, OptState, init_state, update_all, update_layer
from toolchain.lcsb.plan import POLICIES, Policy, StepPlan, make_plan, plan_from_dict, read_plan, write_plan

__all__ = ["SGD", "AdamW", "OptimizerConfig", "LayerSlots", "OptState", "init_state", "update_layer", "update_all",
           "Policy", "POLICIES", "StepPlan", "make_plan", "plan_from_dict", "read_plan", "write_plan"]
