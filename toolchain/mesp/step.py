"""The MeSP training step over the whole model: per-layer checkpoints, chunked loss, block-by-block
backward, and an optional per-layer callback (where the optimizer updates that layer's LoRA right
after its backward, so all layers' gradients never coexist).

Forward keeps only each block's input [T, d] (L of them) and the final hidden state; backward walks
the layers in reverse, recomputing one block at a time (`block_backward`). Layers outside
`backward_layers` (LCSB) are identity in backward: their gradient passes through the residual
path untouched, nothing is recomputed for them, and backward stops below the lowest selected layer.

Segments (`layers_per_checkpoint = s > 1`): of the m selected layers l_0 < ... < l_{m-1}, the forward
keeps only the inputs of l_0, l_s, l_2s, ... (ceil(m / s) of them). The backward takes the groups
[l_gs, ..., l_gs+s-1] from the top; for each it reruns the forward from the group's kept input up to
its last layer, keeping the group's inputs, then backpropagates through the group. The inputs are
the same tensors the plain forward computes (same ops, same order), so the loss and gradients are
bit-identical; the price is one more forward through the blocks between l_0 and l_{m-1} (those not
at a group start), and at most ceil(m / s) + s - 1 inputs are alive instead of m. s ~ sqrt(m) is the
classic choice (Chen et al. 2016, "Training deep nets with sublinear memory cost").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.errors import BadInput
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp.block import BlockParams, block_backward, block_forward, block_rope
from toolchain.mesp.ops import (ce_chunked_forward_backward, ce_chunked_loss, ce_online_forward_backward,
                                ce_online_loss, rmsnorm_backward, rmsnorm_forward, shift_labels)
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.quant import QuantWeight, dense, embedding_rows
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights

__all__ = ["StepOptions", "chunk_overrides", "StepResult", "mesp_step", "checkpoint_groups",
           "sqrt_layers_per_checkpoint", "inputs_alive_bound", "second_sequence_groups",
           "pair_inputs_alive_bound", "model_loss", "block_params", "head_loss_and_grad"]

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
            raise BadInput(f"`loss_chunk` must be >= 1, got {self.loss_chunk}")
        if self.vocab_chunk is not None and self.vocab_chunk < 1:
            raise BadInput(f"`vocab_chunk` must be >= 1 or None (whole rows), got {self.vocab_chunk}")
        if self.mlp_chunk is not None and self.mlp_chunk < 1:
            raise BadInput(f"`mlp_chunk` must be >= 1 or None (all columns at once), got {self.mlp_chunk}")


def chunk_overrides(*, loss_chunk: int | None = None, vocab_chunk: int | None = None,
                    mlp_chunk: int | None = None) -> dict[str, int | None]:
    """The `StepOptions` fields that command-line chunk sizes set: None leaves a field out (its
    default, or a program's value, applies); 0 turns vocabulary or MLP chunking off (the field is None).

    Returns:
        Keyword arguments for `StepOptions` (or the configs that carry its fields).
    """
    given = {"loss_chunk": loss_chunk, "vocab_chunk": vocab_chunk, "mlp_chunk": mlp_chunk}
    return {name: (value or None if name != "loss_chunk" else value)
            for name, value in given.items() if value is not None}


class StepResult(NamedTuple):
    loss: Tensor          # [] mean next-token cross-entropy
    grads: LoraWeights    # per layer; empty dicts for layers outside `backward_layers`


def block_params(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, i: int,
                 compute: Compute = FP32) -> BlockParams:
    return BlockParams(weights.layers[i], lora[i], cfg.scale, arch, compute)


def _forward_checkpoints(arch, weights, cfg, lora, input_ids, *, rope, mlp_chunk, keep: set[int],
                         compute: Compute) -> tuple[list[Tensor | None], Tensor]:
    """The forward, keeping the input of every layer in `keep` (the layers the backward will recompute;
    the others' inputs die as the forward moves on: under LCSB k of L checkpoints are held)."""
    x = embedding_rows(weights.embed, input_ids)                      # [T, d]
    checkpoints: list[Tensor | None] = []
    for i in range(arch.layers):
        checkpoints.append(x if i in keep else None)
        x = block_forward(x, block_params(arch, weights, cfg, lora, i, compute), rope, mlp_chunk)
    return checkpoints, x


def _loss_and_dh(hn: Tensor, head: Tensor | QuantWeight, targets: Tensor, options: StepOptions,
                 chunks: list[Tensor | QuantWeight] | None, compute: Compute):
    if options.vocab_chunk is None:
        return ce_chunked_forward_backward(hn, dense(head), targets, options.loss_chunk)
    return ce_online_forward_backward(hn, head, targets, options.loss_chunk, options.vocab_chunk, chunks=chunks,
                                      compute=compute)


def head_loss_and_grad(x: Tensor, final_norm: Tensor, head: Tensor, labels: Tensor, eps: float,
                       options: StepOptions = StepOptions(), *,
                       head_chunks: list[Tensor] | None = None, compute: Compute = FP32) -> tuple[Tensor, Tensor]:
    """Final RMSNorm, LM head and mean next-token cross-entropy, with the gradient back to x.

    Args:
        x: [T, d] output of the last block; labels: [T] HF-style (shifted inside).
        head_chunks: the head's vocabulary chunks, when the caller passes them (see ce_online.head_chunks).
        compute: the LM head matmuls' precision (ops/compute.py; the online cross-entropy's). Default: float32.
    Returns:
        loss [] and dx [T, d].
    """
    hn, s_fn = rmsnorm_forward(x, final_norm, eps)
    loss, dhn = _loss_and_dh(hn, head, shift_labels(labels), options, head_chunks, compute)
    del hn
    return loss, rmsnorm_backward(dhn, s_fn)


def mesp_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
              labels: Tensor, *, options: StepOptions = StepOptions(), backward_layers: Iterable[int] | None = None,
              on_layer_grads: LayerGradsHook | None = None, keep_grads: bool = True,
              layers_per_checkpoint: int = 1, compute: Compute = FP32) -> StepResult:
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
        layers_per_checkpoint: keep the input of every s-th selected layer only and recompute the others
            a group at a time (module docstring); 1 keeps every selected layer's input. Default: 1.
        compute: how the frozen-weight matmuls compute (ops/compute.py: fp16 as `--compute fp16` programs do).
            Default: float32.

    Returns:
        The loss and, per layer, its LoRA gradients (the hook may have consumed them already).
    """
    t = input_ids.shape[0]
    rope = block_rope(arch, torch.arange(t), weights.final_norm.dtype)
    selected = sorted(set(range(arch.layers)) if backward_layers is None else set(backward_layers))
    groups = checkpoint_groups(selected, layers_per_checkpoint)
    checkpoints, x = _forward_checkpoints(arch, weights, cfg, lora, input_ids, rope=rope,
                                          mlp_chunk=options.mlp_chunk, keep={g[0] for g in groups}, compute=compute)
    loss, dx = head_loss_and_grad(x, weights.final_norm, weights.lm_head, labels, arch.rms_eps, options,
                                  compute=compute)
    del x
    grads: list[dict[str, LoraPair]] = [{} for _ in range(arch.layers)]
    for group in reversed(groups):
        inputs = {group[0]: checkpoints[group[0]]}
        checkpoints[group[0]] = None  # the group's inputs are dead after its backward
        x = inputs[group[0]]
        for j in range(group[0], group[-1]):  # rerun the forward up to the group's last layer
            x = block_forward(x, block_params(arch, weights, cfg, lora, j, compute), rope, options.mlp_chunk)
            if j + 1 in group:
                inputs[j + 1] = x
        del x
        # layers between selected ones are identity in backward (LCSB stop-gradient surrogate)
        for i in reversed(group):
            dx, g = block_backward(dx, inputs.pop(i), block_params(arch, weights, cfg, lora, i, compute), rope,
                                   options.mlp_chunk)
            if on_layer_grads is not None:
                on_layer_grads(i, g)
            if keep_grads:
                grads[i] = g
            del g
    return StepResult(loss, tuple(grads))


def sqrt_layers_per_checkpoint(selected: int) -> int:
    """round(sqrt(m)) for m selected layers: about the fewest inputs alive, ceil(m / s) + s - 1."""
    return max(1, round(math.sqrt(selected)))


def inputs_alive_bound(selected: int, every: int) -> int:
    """At most this many layer inputs are alive at once with checkpoint groups of `every` over `selected`
    layers: the kept inputs below a group and the group's own, min(m, ceil(m / s) + s - 1) (the exact
    count per layer is `toolchain.memory.estimate`'s, from the groups' kept inputs)."""
    return min(selected, -(-selected // every) + every - 1)


def checkpoint_groups(selected: list[int], every: int) -> list[list[int]]:
    """The selected layers (ascending) in groups of `every`; each group's first layer is the one whose
    input the forward keeps (see the module docstring).

    Raises:
        BadInput: `every` < 1.
    """
    if every < 1:
        raise BadInput(f"layers_per_checkpoint must be >= 1 (1 keeps every selected layer's input), got {every}")
    return [selected[a:a + every] for a in range(0, len(selected), every)]


def second_sequence_groups(selected: list[int], every: int) -> list[list[int]]:
    """The checkpoint groups of the second sequence of a two-sequence step (a DPO pair: `mesp.dpo.dpo_step`,
    `LayerLoop.pair_step`), whose first sequence has `checkpoint_groups(selected, every)`.

    With groups (`every` > 1) both sequences get the same ones. With every selected input of the first sequence
    kept (`every` == 1), the second's groups are graded, small at the top and growing downwards: going down, the
    first sequence frees one input per layer, which makes room for the larger group the second rebuilds lower
    down. With G groups of sizes m_1 (the top one) .. m_G, and S_j = m_1 + .. + m_j, at the top layer of group j
    the first sequence holds n - S_{j-1} inputs (n: selected layers) and the second its G - j kept inputs below
    plus the group's m_j rebuilt ones; both together stay at most n + G (the end of the forward's count: n of
    the first, G of the second) when m_j <= j + S_{j-1}. So m = 1, 3, 7, 15, ... from the top, and the fewest
    groups covering n is the least G with 2^(G+1) - G - 2 >= n (24 layers: 4 groups, 1, 3, 7, 13 from the top,
    n + 4 inputs instead of 2n). Gradients are unchanged (a group's inputs are rebuilt before any of its layers
    is updated); the cost is one more block forward of the second sequence for each selected layer outside the
    G kept ones.
    """
    if every > 1:
        return checkpoint_groups(selected, every)
    n = len(selected)
    if n == 0:
        return []
    g = 1
    while 2 ** (g + 1) - g - 2 < n:
        g += 1
    sizes, done = [], 0                      # from the top group down
    for j in range(1, g + 1):
        m = min(j + done, n - done - (g - j))
        sizes.append(m)
        done += m
    groups, hi = [], n
    for m in sizes:
        groups.append(selected[hi - m:hi])
        hi -= m
    return groups[::-1]


def pair_inputs_alive_bound(selected: int, every: int) -> int:
    """The most layer inputs of both sequences of a two-sequence step alive at once (`second_sequence_groups`):
    n + G with every input of the first kept (G: the second's group count), else twice `inputs_alive_bound`."""
    if every > 1:
        return 2 * inputs_alive_bound(selected, every)
    return selected + len(second_sequence_groups(list(range(selected)), 1))


def model_loss(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
               labels: Tensor, *, options: StepOptions = StepOptions()) -> Tensor:
    """Forward only: the same loss `mesp_step` reports (evaluation, MeZO)."""
    t = input_ids.shape[0]
    rope = block_rope(arch, torch.arange(t), weights.final_norm.dtype)
    x = embedding_rows(weights.embed, input_ids)
    for i in range(arch.layers):
        x = block_forward(x, block_params(arch, weights, cfg, lora, i), rope, options.mlp_chunk)
    hn, _ = rmsnorm_forward(x, weights.final_norm, arch.rms_eps)
    del x
    if options.vocab_chunk is None:
        return ce_chunked_loss(hn, dense(weights.lm_head), shift_labels(labels), options.loss_chunk)
    return ce_online_loss(hn, weights.lm_head, shift_labels(labels), options.loss_chunk, options.vocab_chunk)
