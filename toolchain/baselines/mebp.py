"""Baseline: MeBP-style per-block gradient checkpointing (Apple, arXiv 2510.03425).

Forward keeps each block's input only; backward recomputes the whole block with autograd
(`torch.utils.checkpoint`), storing all of that block's activations during its backward.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from toolchain.baselines.autograd import full_logits_loss, grads_of, leaf_lora
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepResult, block_forward, block_params
from toolchain.mesp.block import block_rope
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights

__all__ = ["mebp_step"]


def mebp_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
              labels: Tensor) -> StepResult:
    leaves = leaf_lora(lora)
    rope = block_rope(arch, torch.arange(input_ids.shape[0]), weights.embed.dtype)
    x = weights.embed[input_ids]
    for i in range(arch.layers):
        x = checkpoint(block_forward, x, block_params(arch, weights, cfg, leaves, i), rope, use_reentrant=False)
    loss = full_logits_loss(arch, weights, x, labels)
    loss.backward()
    return StepResult(loss.detach(), grads_of(leaves))
