"""The MeSP training step over the whole model: per-layer checkpoints, chunked loss, block-by-block
backward, and an optional per-layer callback (where the optimizer updates that layer's LoRA right
after its backward, so all layers' gradients never coexist).

Forward keeps only each block's input [T, d] (L of them) and the final hidden state; backward walks
the layers in reverse, recomputing one block at a time (`block_backward`). Layers outside
`backward_layers` (LCSB) are identity in backward: their gradient passes through the residual
path untouched, nothing is recomputed for them, and backward stops below the lowest selected layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp.block import BlockParams, block_backward, block_forward
from toolchain.mesp.ops import (ce_chunked_forward_backward, ce_chunked_loss, ce_online_forward_backward,
                                ce_online_loss, rmsnorm_backward, rmsnorm_forward, rope_tables, shift_labels)
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import ModelWeights

__all__ = ["StepOptions", "StepResult", "mesp_step", "model_loss", "block_params", "head_loss_and_grad"]

LayerGradsHook = Callable[[int, dict[str, LoraPair]], None]


@dataclass(frozen=True)
class StepOptions:
    """Static knobs of the step (memory/speed trade-offs; they never change the result).

    Args:
        loss_chunk: tokens per LM-head/cross-entropy chunk. Default: 256.
        vocab_chunk: vocabulary entries per LM-head chunk (`ce_online`: online softmax over
            vocabulary chunks; peak logits [loss_chunk, vocab_chunk]); None: whole vocabulary
            rows (`ce_chunked`; peak logits [loss_chunk, V]). Default: 1024.
        mlp_chunk: intermediate columns per MLP chunk, in the forward and in the recompute+backward
            (None: all f at once): peak MLP tensors are [T, mlp_chunk], and each MLP weight is read
            (dequantized) once per pass (see mesp/block.py). Default: 256.

    The defaults were measured on Qwen2.5-0.5B, seq 256 (`toolchain bench memory`, see
    docs/benchmarks.md): [256, 1024] head chunks run both head matmuls about as fast as full logits
    (token chunks of 32 were ~60% slower) and bound the logits and XNNPACK's per-call packing of a head
    chunk to 1 and 3.5 MiB; 256-column MLP chunks keep its tensors at [T, 256] and read each MLP weight
    once per pass, which is what makes quantized weights cheap (token chunks of 64 dequantized every MLP
    weight 4 times per pass at T = 256).
    """

    loss_chunk: int = 256
    vocab_chunk: int | None = 1024
    mlp_chunk: int | None = 256

    def __post_init__(self) -> None:
        if self.loss_chunk < 1:
            raise ValueError(f"`loss_chunk` must be >= 1, got {self.loss_chunk}")
        if self.vocab_chunk is not None and self.vocab_chunk < 1:
            raise ValueError(f"`vocab_chunk` must be >= 1 or None, got {self.vocab_chunk}")
        if self.mlp_chunk is not None and self.mlp_chunk < 1:
            raise ValueError(f"`mlp_chunk` must be >= 1 or None, got {self.mlp_chunk}")


class StepResult(NamedTuple):
    loss: Tensor          # [] mean next-token cross-entropy
    grads: LoraWeights    # per layer; empty dicts for layers outside `backward_layers`


def block_params(arch: Qwen25Arch, weights: ModelWeights, lora: LoraWeights, cfg: LoraConfig, i: int) -> BlockParams:
    return BlockParams(weights.layers[i], lora[i], cfg.scale, arch)


def _forward_checkpoints(arch, weights, lora, cfg, input_ids, rope, mlp_chunk,
                         keep: set[int]) -> tuple[list[Tensor | None], Tensor]:
    """The forward, keeping the input of every layer in `keep` (the layers the backward will recompute;
    the others' inputs die as the forward moves on: under LCSB k of L checkpoints are held)."""
    x = weights.embed[input_ids]                                      # [T, d]
    checkpoints: list[Tensor | None] = []
    for i in range(arch.layers):
        checkpoints.append(x if i in keep else None)
        x = block_forward(x, block_params(arch, weights, lora, cfg, i), rope, mlp_chunk)
    return checkpoints, x


def _loss_and_dh(hn: Tensor, head: Tensor, targets: Tensor, options: StepOptions, chunks: list[Tensor] | None):
    if options.vocab_chunk is None:
        return ce_chunked_forward_backward(hn, head, targets, options.loss_chunk)
    return ce_online_forward_backward(hn, head, targets, options.loss_chunk, options.vocab_chunk, chunks=chunks)


def head_loss_and_grad(x: Tensor, final_norm: Tensor, head: Tensor, labels: Tensor, eps: float,
                       options: StepOptions = StepOptions(), *,
                       head_chunks: list[Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Final RMSNorm, LM head and mean next-token cross-entropy, with the gradient back to x.

    Args:
        x: [T, d] output of the last block; labels: [T] HF-style (shifted inside).
        head_chunks: the head's vocabulary chunks, when the caller passes them (see ce_online.head_chunks).
    Returns:
        loss [] and dx [T, d].
    """
    hn, s_fn = rmsnorm_forward(x, final_norm, eps)
    loss, dhn = _loss_and_dh(hn, head, shift_labels(labels), options, head_chunks)
    del hn
    return loss, rmsnorm_backward(dhn, s_fn)


def mesp_step(arch: Qwen25Arch, weights: ModelWeights, lora: LoraWeights, cfg: LoraConfig, input_ids: Tensor,
              labels: Tensor, *, options: StepOptions = StepOptions(), backward_layers: Iterable[int] | None = None,
              on_layer_grads: LayerGradsHook | None = None, keep_grads: bool = True) -> StepResult:
    """Loss and exact LoRA gradients of one sequence, MeSP-style.

    Args:
        input_ids: [T] token ids.
        labels: [T] HF-style labels (usually = input_ids; -100 ignored); shifted inside.
        backward_layers: layers to backpropagate through (LCSB); None means all.
        on_layer_grads: called as `(layer, grads)` right after each selected layer's backward,
            in descending layer order (e.g. to apply the optimizer update to that layer at once).
        keep_grads: keep every layer's gradients for the result. False (with `on_layer_grads`
            consuming them) drops each layer's gradients after its hook call, so only one layer's
            gradients are ever alive; the result's `grads` are then all empty dicts. Default: True.

    Returns:
        The loss and, per layer, its LoRA gradients (the hook may have consumed them already).
    """
    t = input_ids.shape[0]
    rope = rope_tables(torch.arange(t), arch.head_dim, arch.rope_theta, weights.embed.dtype)
    selected = set(range(arch.layers)) if backward_layers is None else set(backward_layers)
    checkpoints, x = _forward_checkpoints(arch, weights, lora, cfg, input_ids, rope, options.mlp_chunk, selected)
    loss, dx = head_loss_and_grad(x, weights.final_norm, weights.lm_head, labels, arch.rms_eps, options)
    del x
    grads: list[dict[str, LoraPair]] = [{} for _ in range(arch.layers)]
    lowest = min(selected, default=arch.layers)
    for i in reversed(range(lowest, arch.layers)):
        x_in = checkpoints[i]
        checkpoints[i] = None  # the checkpoint is dead after this layer's backward
        if i not in selected:
            continue  # identity backward through the residual path (LCSB stop-gradient surrogate)
        dx, g = block_backward(dx, x_in, block_params(arch, weights, lora, cfg, i), rope, options.mlp_chunk)
        if on_layer_grads is not None:
            on_layer_grads(i, g)
        if keep_grads:
            grads[i] = g
        del g
    return StepResult(loss, tuple(grads))


def model_loss(arch: Qwen25Arch, weights: ModelWeights, lora: LoraWeights, cfg: LoraConfig, input_ids: Tensor,
               labels: Tensor, *, options: StepOptions = StepOptions()) -> Tensor:
    """Forward only: the same loss `mesp_step` reports (evaluation, MeZO)."""
    t = input_ids.shape[0]
    rope = rope_tables(torch.arange(t), arch.head_dim, arch.rope_theta, weights.embed.dtype)
    x = weights.embed[input_ids]
    for i in range(arch.layers):
        x = block_forward(x, block_params(arch, weights, lora, cfg, i), rope, options.mlp_chunk)
    hn, _ = rmsnorm_forward(x, weights.final_norm, arch.rms_eps)
    del x
    if options.vocab_chunk is None:
        return ce_chunked_loss(hn, weights.lm_head, shift_labels(labels), options.loss_chunk)
    return ce_online_loss(hn, weights.lm_head, shift_labels(labels), options.loss_chunk, options.vocab_chunk)
