"""One sequence's loss and LoRA gradients by any method: MeSP or a baseline (`toolchain grads`)."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from toolchain.baselines.autograd import autograd_step
from toolchain.baselines.mebp import mebp_step
from toolchain.baselines.mezo import mezo_grad_estimate
from toolchain.errors import BadInput
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import mesp_step
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights

__all__ = ["GradientMode", "GRADIENT_MODES", "gradient_step"]

GradientMode = Literal["mesp", "mebp", "autograd", "mezo"]
GRADIENT_MODES: tuple[str, ...] = ("mesp", "mebp", "autograd", "mezo")


def gradient_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
                  labels: Tensor, *, mode: GradientMode = "mesp", seed: int = 0):
    """Loss and LoRA gradients of one sequence.

    Args:
        input_ids / labels: [T] token ids and HF-style labels.
        mode: mesp, mebp, autograd (exact; they differ in memory and time) or mezo (one SPSA estimate
            from two forwards). Default: "mesp".
        seed: mezo only, the perturbation seed. Default: 0.

    Returns:
        A result with `loss` and `grads` (per layer, target -> LoraPair).

    Raises:
        BadInput: an unknown mode.
    """
    if mode == "mezo":
        return mezo_grad_estimate(arch, weights, cfg, lora, input_ids, labels, seed=seed)
    steps = {"mesp": mesp_step, "mebp": mebp_step, "autograd": autograd_step}
    if mode not in steps:
        raise BadInput(f"unknown gradient mode {mode!r}; choose {', '.join(GRADIENT_MODES)}")
    return steps[mode](arch, weights, cfg, lora, input_ids, labels)
