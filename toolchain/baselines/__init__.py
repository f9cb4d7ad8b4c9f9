"""Baselines in the same harness as MeSP: autograd, MeBP (MeZO lives in mezo.py)."""

from toolchain.baselines.autograd import autograd_step
from toolchain.baselines.mebp import mebp_step

__all__ = ["autograd_step", "mebp_step", "STEP_MODES"]

STEP_MODES = ("mesp", "mebp", "autograd")
