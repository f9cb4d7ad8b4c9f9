"""Baselines in the same harness as MeSP: autograd, MeBP (exact gradients) and MeZO (an SPSA estimate)."""

from toolchain.baselines.autograd import autograd_step
from toolchain.baselines.gradients import GRADIENT_MODES, gradient_step
from toolchain.baselines.mebp import mebp_step
from toolchain.baselines.mezo import mezo_grad_estimate, mezo_step

__all__ = ["autograd_step", "mebp_step", "mezo_grad_estimate", "mezo_step", "gradient_step", "GRADIENT_MODES",
           "STEP_MODES"]

STEP_MODES = ("mesp", "mebp", "autograd")
