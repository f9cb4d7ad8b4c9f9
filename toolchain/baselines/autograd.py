"""Baseline: plain PyTorch autograd over the whole model (stores every activation, full logits).

Uses the same forward primitives as MeSP (each formula lives once, in `mesp/ops`); only the
differentiation differs. Returns gradients in the same structure as `mesp_step`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp import StepResult, block_forward, block_params
from toolchain.mesp.block import block_rope
from toolchain.mesp.ops import IGNORE_INDEX, rmsnorm_forward, shift_labels
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights

__all__ = ["autograd_step", "leaf_lora", "grads_of", "full_logits_loss"]


def leaf_lora(lora: LoraWeights) -> LoraWeights:
    """Detached copies of the adapter that require grad (the caller's tensors stay untouched)."""
    return tuple({t: LoraPair(p.a.detach().clone().requires_grad_(), p.b.detach().clone().requires_grad_())
                  for t, p in layer.items()} for layer in lora)


def grads_of(lora: LoraWeights) -> LoraWeights:
    return tuple({t: LoraPair(p.a.grad, p.b.grad) for t, p in layer.items()} for layer in lora)


def full_logits_loss(arch: ModelArch, weights: ModelWeights, x: Tensor, labels: Tensor) -> Tensor:
    """Final norm, the full [T, V] logits and mean cross-entropy, as Hugging Face computes it."""
    hn, _ = rmsnorm_forward(x, weights.final_norm, arch.rms_eps)
    logits = hn @ weights.lm_head.T                                   # [T, V]
    targets = shift_labels(labels)
    if not bool((targets != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # no target: loss 0, zero gradients (as mesp_step)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)


def autograd_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
                  labels: Tensor) -> StepResult:
    leaves = leaf_lora(lora)
    rope = block_rope(arch, torch.arange(input_ids.shape[0]), weights.embed.dtype)
    x = weights.embed[input_ids]
    for i in range(arch.layers):
        x = block_forward(x, block_params(arch, weights, cfg, leaves, i), rope)
    loss = full_logits_loss(arch, weights, x, labels)
    loss.backward()
    return StepResult(loss.detach(), grads_of(leaves))
