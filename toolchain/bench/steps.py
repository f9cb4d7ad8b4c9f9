"""One SGD training step per benchmark mode, written the way a memory-conscious training loop runs it.

- mesp: `mesp_step` under no_grad; each layer's LoRA is updated in place right after that layer's
  backward (`on_layer_grads`) and its gradients dropped (`keep_grads=False`).
- autograd / mebp: the adapter tensors themselves are the autograd leaves (no copy of the
  adapter, unlike `baselines.autograd_step`, which must not touch its caller's tensors); after
  `backward()` every layer is updated in place and the `.grad`s are released, as
  `optimizer.step(); optimizer.zero_grad(set_to_none=True)` would.
- mezo: `mezo_step` (two forwards, in-place perturbations, seeded direction).
The forward math is the shared `block_forward` / `full_logits_loss`; only the bookkeeping is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from toolchain.baselines.autograd import full_logits_loss
from toolchain.baselines.mezo import mezo_step
from toolchain.errors import BadInput
from toolchain.lora import LoraConfig, LoraPair, LoraWeights
from toolchain.mesp import StepOptions, block_forward, block_params, mesp_step
from toolchain.mesp.block import block_rope
from toolchain.models import ModelWeights, ModelArch

__all__ = ["TrainMode", "TRAIN_MODES", "EXACT_MODES", "PROGRAM_MODES", "base_mode", "program_target", "uses_groups", "GradsHook", "prepare_lora", "sgd_hook", "collect_hook",
           "train_step"]

TrainMode = Literal["autograd", "mebp", "mesp", "mezo"]
# mesp_groups: mesp_step with checkpoint groups (`layers_per_checkpoint`, mesp/step.py): fewer kept
# layer inputs, one more forward through the blocks.
TRAIN_MODES: tuple[str, ...] = ("autograd", "mebp", "mesp", "mesp_groups", "mezo")
# An exported program on its runtime through the host's layer loop; *_groups with checkpoint groups.
PROGRAM_MODES: tuple[str, ...] = ("executorch", "executorch_groups", "onnx", "onnx_groups")
EXACT_MODES: tuple[str, ...] = ("autograd", "mebp", "mesp", "mesp_groups")  # modes whose gradients must agree

GradsHook = Callable[[int, dict[str, LoraPair]], None]


def base_mode(key: str) -> str:
    """The mode of a bench row key: the mode itself, or `mode#k` for a program mode run on the k-th --program."""
    return key.split("#", 1)[0]


def program_target(mode: str) -> str | None:
    """The runtime of a program mode (executorch, onnx; or its `#k` row key); None for the eager modes."""
    mode = base_mode(mode)
    return mode.removesuffix("_groups") if mode in PROGRAM_MODES else None


def uses_groups(mode: str) -> bool:
    """Whether `mode` (or its row key) runs with checkpoint groups (`layers_per_checkpoint` of the bench)."""
    return base_mode(mode).endswith("_groups")


def prepare_lora(mode: str, lora: LoraWeights) -> LoraWeights:
    """Make the adapter tensors autograd leaves for the autograd modes (in place, no copy)."""
    if mode in ("autograd", "mebp"):
        for layer in lora:
            for pair in layer.values():
                pair.a.requires_grad_(True)
                pair.b.requires_grad_(True)
    return lora


def sgd_hook(lora: LoraWeights, lr: float) -> GradsHook:
    """Plain SGD on one layer, in place: theta -= lr * grad."""
    def update(layer: int, grads: dict[str, LoraPair]) -> None:
        with torch.no_grad():
            for target, g in grads.items():
                lora[layer][target].a.sub_(g.a, alpha=lr)
                lora[layer][target].b.sub_(g.b, alpha=lr)
    return update


def collect_hook(store: list[dict[str, LoraPair]]) -> GradsHook:
    """Copy each layer's gradients into `store` (pre-sized, one dict per layer)."""
    def collect(layer: int, grads: dict[str, LoraPair]) -> None:
        store[layer] = {t: LoraPair(g.a.detach().clone(), g.b.detach().clone()) for t, g in grads.items()}
    return collect


def _autograd_step(arch, weights, cfg, lora, input_ids, labels, *, hook, checkpointed: bool) -> Tensor:
    rope = block_rope(arch, torch.arange(input_ids.shape[0]), weights.embed.dtype)
    x = weights.embed[input_ids]                                      # [T, d]
    for i in range(arch.layers):
        p = block_params(arch, weights, cfg, lora, i)
        x = checkpoint(block_forward, x, p, rope, use_reentrant=False) if checkpointed else block_forward(x, p, rope)
    loss = full_logits_loss(arch, weights, x, labels)
    del x
    loss.backward()
    for i, layer in enumerate(lora):
        hook(i, {t: LoraPair(p.a.grad, p.b.grad) for t, p in layer.items()})
        for p in layer.values():
            p.a.grad = None
            p.b.grad = None
    return loss.detach()


def train_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
               labels: Tensor, *, mode: str, hook: GradsHook, options: StepOptions = StepOptions(),
               seed: int = 0, lr: float = 0.0, layers_per_checkpoint: int = 1) -> float:
    """One step of `mode`; `hook(layer, grads)` receives each layer's exact gradients (not for mezo,
    which updates in place with `lr` and perturbation `seed`). `layers_per_checkpoint`: the groups of
    mode mesp_groups. Returns the loss."""
    if mode in ("mesp", "mesp_groups"):
        with torch.no_grad():
            res = mesp_step(arch, weights, cfg, lora, input_ids, labels, options=options, on_layer_grads=hook,
                            keep_grads=False,
                            layers_per_checkpoint=layers_per_checkpoint if uses_groups(mode) else 1)
        return float(res.loss)
    if mode in ("autograd", "mebp"):
        return float(_autograd_step(arch, weights, cfg, lora, input_ids, labels, hook=hook,
                                    checkpointed=mode == "mebp"))
    if mode == "mezo":
        return float(mezo_step(arch, weights, cfg, lora, input_ids, labels, seed=seed, lr=lr, options=options).loss)
    raise BadInput(f"unknown training mode {mode!r}; choose {', '.join(TRAIN_MODES)}")
