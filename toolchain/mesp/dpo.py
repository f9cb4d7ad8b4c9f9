"""Direct Preference Optimization (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is
Secretly a Reward Model", eq. 7) with exact LoRA gradients, MeSP-style.

For a prompt x, a chosen response c and a rejected one r:

    lp(y)   = sum over y's tokens of log p(y_t | x, y_<t)      (the adapter on; a sum, not a mean)
    lp0(y)  = the same with the adapter disabled (the base model is the reference)
    margin  = beta ((lp(c) - lp0(c)) - (lp(r) - lp0(r)))
    loss    = -log sigmoid(margin) = softplus(-margin)

    dloss/dtheta = -beta sigmoid(-margin) (dlp(c)/dtheta - dlp(r)/dtheta)

lp0 does not depend on the adapter (a constant per pair). The mean next-token cross-entropy of the sequence
x + y with labels -100 on x is CE(y) = -lp(y) / n_y (n_y = |y| targets), so dlp(y)/dtheta = -n_y dCE(y)/dtheta:
the DPO gradient is the weighted sum  w_c dCE(c) + w_r dCE(r),  w_c = beta s n_c, w_r = -beta s n_r, s =
sigmoid(-margin), of two sequence-CE gradients. The backward from the LM head down is linear in the head's
upstream gradient, so each sequence's head gradient dx is scaled by its weight and the two backward passes
summed layer by layer: the gradients are exact, and each layer's optimizer update (`on_layer_grads`) sees the
sum of both sequences' gradients, as the math requires (running the sequences one after the other with an
update after each would not be the DPO step). Both sequences' layer checkpoints are alive together (the
forward of both precedes the backward of either: the weights need both lp), so by default the rejected sequence
keeps its layer inputs in graded checkpoint groups (`mesp.step.second_sequence_groups`: Qwen2.5-0.5B's 24 layers
hold 24 + 4 inputs at most instead of 48) and reruns each group's forward when the backward reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.errors import BadInput
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp.block import block_backward, block_forward, block_rope
from toolchain.mesp.ops import shift_labels
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.quant import embedding_rows
from toolchain.mesp.step import (LayerGradsHook, StepOptions, block_params, checkpoint_groups, head_loss_and_grad,
                                 model_loss, second_sequence_groups)
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights
from toolchain.text.dataset import DataRow

__all__ = ["DpoResult", "check_beta", "pair_rows", "sequence_logp", "dpo_margin_and_weights", "dpo_step",
           "zero_adapter", "reference_logps"]


class DpoResult(NamedTuple):
    loss: Tensor                  # [] -log sigmoid(margin), times `scale`
    margin: Tensor                # [] beta ((lp(c) - lp0(c)) - (lp(r) - lp0(r)))
    logps: tuple[Tensor, Tensor]  # lp(c), lp(r) under the adapter, before any update
    grads: LoraWeights            # per layer; empty dicts outside `backward_layers` (or when not kept)


def check_beta(beta: float) -> float:
    """Raises BadInput unless beta is a finite number > 0."""
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise BadInput(f"--beta must be a finite number > 0, got {beta}")
    return float(beta)


def pair_rows(prompt_ids: list[int], chosen_ids: list[int], rejected_ids: list[int]) -> tuple[DataRow, DataRow]:
    """The two sequences of a pair as rows: prompt + response, labels -100 on the prompt (loss on the response)."""
    def row(resp: list[int]) -> DataRow:
        ids = torch.tensor(prompt_ids + resp, dtype=torch.int64)
        labels = torch.tensor([-100] * len(prompt_ids) + resp, dtype=torch.int64)
        return DataRow(ids, labels)

    return row(chosen_ids), row(rejected_ids)


def _targets(row: DataRow) -> int:
    return int((shift_labels(row.labels) != -100).sum())


def sequence_logp(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, row: DataRow, *,
                  options: StepOptions = StepOptions()) -> Tensor:
    """lp: the sum of the log-probabilities of the row's targets (forward only), = -n * mean CE."""
    return -_targets(row) * model_loss(arch, weights, cfg, lora, row.input_ids, row.labels, options=options)


def zero_adapter(lora: LoraWeights) -> LoraWeights:
    """The adapter disabled: every B zero (A kept), so each LoRA term B A x is exactly zero."""
    return tuple({t: LoraPair(p.a, torch.zeros_like(p.b)) for t, p in layer.items()} for layer in lora)


def reference_logps(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
                    chosen: DataRow, rejected: DataRow, *, options: StepOptions = StepOptions()) -> tuple[float, float]:
    """(lp0(c), lp0(r)): the pair's log-probabilities under the base model (adapter disabled)."""
    zero = zero_adapter(lora)
    with torch.no_grad():
        return (float(sequence_logp(arch, weights, cfg, zero, chosen, options=options)),
                float(sequence_logp(arch, weights, cfg, zero, rejected, options=options)))


def dpo_margin_and_weights(lp_c: Tensor, lp_r: Tensor, ref: tuple[float, float], beta: float, n: tuple[int, int],
                           scale: float = 1.0) -> tuple[Tensor, Tensor, float, float]:
    """(loss, margin, w_c, w_r): the DPO loss (times `scale`) and the weights of the two sequences' mean-CE
    gradients whose sum is its gradient (module docstring)."""
    margin = beta * ((lp_c - ref[0]) - (lp_r - ref[1]))
    s = float(torch.sigmoid(-margin))
    return scale * F.softplus(-margin), margin, scale * beta * s * n[0], -scale * beta * s * n[1]


def dpo_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, chosen: DataRow,
             rejected: DataRow, ref: tuple[float, float], *, beta: float, scale: float = 1.0,
             options: StepOptions = StepOptions(), backward_layers: Iterable[int] | None = None,
             on_layer_grads: LayerGradsHook | None = None, keep_grads: bool = True, layers_per_checkpoint: int = 1,
             compute: Compute = FP32, second_groups: Literal["graded", "same"] = "graded") -> DpoResult:
    """DPO loss and its exact LoRA gradients for one pair (module docstring).

    Args:
        chosen / rejected: `pair_rows` of the pair (labels -100 on the prompt).
        ref: (lp0(c), lp0(r)), e.g. from `reference_logps`.
        beta: the DPO temperature (> 0).
        scale: the step's loss weight (mixed runs: `--dpo-weight`); gradients scale with it. Default: 1.0.
        backward_layers, on_layer_grads, keep_grads, layers_per_checkpoint, compute: as `mesp_step`; the hook of
            layer i gets the sum of both sequences' weighted gradients of layer i. `layers_per_checkpoint` is
            the chosen sequence's; the rejected one's groups are `second_groups`.
        second_groups: "graded" (default): `mesp.step.second_sequence_groups`, i.e. with every input of the
            chosen sequence kept, the rejected one's in graded groups (n + G inputs alive instead of 2n, one more
            forward of the rejected sequence); "same": the chosen sequence's groups (every input of both kept at
            layers_per_checkpoint 1). The gradients are the same either way.

    Returns:
        The loss, the margin, lp(c) and lp(r), and (with keep_grads) the gradients.
    """
    beta = check_beta(beta)
    seqs = (chosen, rejected)
    selected = sorted(set(range(arch.layers)) if backward_layers is None else set(backward_layers))
    groups = (checkpoint_groups(selected, layers_per_checkpoint),
              checkpoint_groups(selected, layers_per_checkpoint) if second_groups == "same"
              else second_sequence_groups(selected, layers_per_checkpoint))
    dtype = weights.final_norm.dtype
    ropes = [block_rope(arch, torch.arange(s.input_ids.shape[0]), dtype) for s in seqs]
    checkpoints: list[dict[int, Tensor]] = []
    dxs: list[Tensor] = []
    logps: list[Tensor] = []
    for seq, rope, seq_groups in zip(seqs, ropes, groups):
        keep = {g[0] for g in seq_groups}
        x = embedding_rows(weights.embed, seq.input_ids)                              # [T, d]
        kept: dict[int, Tensor] = {}
        for i in range(arch.layers):
            if i in keep:
                kept[i] = x
            x = block_forward(x, block_params(arch, weights, cfg, lora, i, compute), rope, options.mlp_chunk)
        ce, dx = head_loss_and_grad(x, weights.final_norm, weights.lm_head, seq.labels, arch.rms_eps, options,
                                    compute=compute)
        del x
        checkpoints.append(kept)
        dxs.append(dx)
        logps.append(-_targets(seq) * ce)
    loss, margin, w_c, w_r = dpo_margin_and_weights(logps[0], logps[1], ref, beta,
                                                    (_targets(chosen), _targets(rejected)), scale)
    dxs = [dxs[0] * w_c, dxs[1] * w_r]
    tops = [{g[-1]: g for g in seq_groups} for seq_groups in groups]
    grads: list[dict[str, LoraPair]] = [{} for _ in range(arch.layers)]
    for i in reversed(selected):
        for k, rope in enumerate(ropes):     # a sequence's inputs of the group i tops, rerun from its kept one
            group = tops[k].get(i)
            if group is None:
                continue
            x = checkpoints[k][group[0]]
            for j in range(group[0], group[-1]):
                x = block_forward(x, block_params(arch, weights, cfg, lora, j, compute), rope, options.mlp_chunk)
                if j + 1 in group:
                    checkpoints[k][j + 1] = x
            del x
        params = block_params(arch, weights, cfg, lora, i, compute)
        total: dict[str, LoraPair] = {}
        for k, rope in enumerate(ropes):
            dxs[k], g = block_backward(dxs[k], checkpoints[k].pop(i), params, rope, options.mlp_chunk)
            total = g if not total else {t: LoraPair(total[t].a + g[t].a, total[t].b + g[t].b) for t in g}
            del g
        if on_layer_grads is not None:
            on_layer_grads(i, total)
        if keep_grads:
            grads[i] = total
        del total
    return DpoResult(loss, margin, (logps[0], logps[1]), tuple(grads))
