"""SGD and AdamW over LoRA adapters as pure functions, applied one layer at a time.

The per-tensor formulas live once, in `update_rules.py` (the exported programs use them too); this
module adds the optimizer configs, their state over a whole adapter, and the per-layer form MeSP
needs: `mesp_step(..., on_layer_grads=hook)` calls the hook right after a layer's backward, the hook
updates that layer with `update_layer`, and its gradients die there, so all layers' gradients never
coexist.

LCSB semantics (arXiv 2602.13073): a layer outside the step's selection gets a *zero* gradient, not
"no update". With `grads=None`, `update_layer` still decays its moments and moves the parameters by
the remaining momentum and by weight decay (the paper's "implicit updates through AdamW momentum").
`frozen=True` leaves such a layer and its moments untouched instead, for comparison. Either way the
step counter is global: bias correction uses the number of steps the run has taken, not the number of
times this layer was selected.

Formulas (step t >= 1, gradient g, parameter p), matching torch.optim:
  SGD:   g' = g + wd * p;  buf = mu * buf + g' (buf = g' at t = 1);  p -= lr * (buf if mu else g')
  AdamW: p *= 1 - lr * wd  (decoupled);  m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
         p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.errors import BadInput
from toolchain.lcsb.update_rules import adamw_tensor_update, sgd_tensor_update
from toolchain.lora.weights import LoraPair, LoraWeights

__all__ = ["SGD", "AdamW", "OptimizerConfig", "LayerSlots", "OptState", "init_state", "update_layer", "update_all"]


@dataclass(frozen=True)
class SGD:
    """Plain or momentum SGD with L2 weight decay added to the gradient (as torch.optim.SGD).

    Args:
        lr: learning rate. Default: 1e-4 (the MeSP paper).
        momentum: heavy-ball momentum mu (0: none). Default: 0.
        weight_decay: L2 coefficient added to the gradient. Default: 0.
    """

    lr: float = 1e-4
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.lr > 0, "lr", self.lr, "> 0")
        _check(0 <= self.momentum < 1, "momentum", self.momentum, "in [0, 1)")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")

    @property
    def num_slots(self) -> int:
        return 1 if self.momentum else 0


@dataclass(frozen=True)
class AdamW:
    """Adam with bias correction and decoupled weight decay (as torch.optim.AdamW, amsgrad off).

    Args:
        lr: learning rate. Default: 1e-4 (the LCSB paper).
        beta1, beta2: moment decay rates. Default: 0.9, 0.999.
        eps: added to the denominator. Default: 1e-8.
        weight_decay: decoupled decay, p *= 1 - lr * weight_decay. Default: 0.01 (the LCSB paper).
    """

    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        _check(self.lr > 0, "lr", self.lr, "> 0")
        _check(0 <= self.beta1 < 1, "beta1", self.beta1, "in [0, 1)")
        _check(0 <= self.beta2 < 1, "beta2", self.beta2, "in [0, 1)")
        _check(self.eps > 0, "eps", self.eps, "> 0")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")

    @property
    def num_slots(self) -> int:
        return 2


OptimizerConfig = SGD | AdamW

# Per target: the optimizer's slots for that pair (AdamW: (m, v); momentum SGD: (buf,); SGD: ()).
LayerSlots = dict[str, tuple[LoraPair, ...]]


class OptState(NamedTuple):
    step: int                          # steps taken so far by the whole run (bias correction)
    slots: tuple[LayerSlots, ...]      # per layer


def _check(ok: bool, name: str, value: float, rule: str) -> None:
    if not ok:
        raise BadInput(f"optimizer `{name}` must be {rule}, got {value}")


def init_state(opt: OptimizerConfig, lora: LoraWeights) -> OptState:
    """Zero slots shaped like `lora`, step 0."""
    def zeros(p: LoraPair) -> LoraPair:
        return LoraPair(torch.zeros_like(p.a), torch.zeros_like(p.b))

    return OptState(0, tuple({t: tuple(zeros(p) for _ in range(opt.num_slots)) for t, p in layer.items()}
                             for layer in lora))


def _sgd(opt: SGD, p: Tensor, g: Tensor, slots: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
    if not opt.momentum:
        return sgd_tensor_update(p, g, opt.lr, weight_decay=opt.weight_decay), ()
    if opt.weight_decay:
        g = g + opt.weight_decay * p
    buf = opt.momentum * slots[0] + g          # = g at step 1 (buf starts at zero, no dampening)
    return sgd_tensor_update(p, buf, opt.lr), (buf,)


def _adamw(opt: AdamW, p: Tensor, g: Tensor, slots: tuple[Tensor, ...], step: int) -> tuple[Tensor, tuple[Tensor, ...]]:
    p, m, v = adamw_tensor_update(p, g, *slots, step, opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    return p, (m, v)


def _update_tensor(opt: OptimizerConfig, p: Tensor, g: Tensor, slots: tuple[Tensor, ...],
                   step: int) -> tuple[Tensor, tuple[Tensor, ...]]:
    if isinstance(opt, AdamW):
        return _adamw(opt, p, g, slots, step)
    return _sgd(opt, p, g, slots)


def update_layer(opt: OptimizerConfig, params: dict[str, LoraPair], grads: dict[str, LoraPair] | None,
                 slots: LayerSlots, step: int, *, frozen: bool = False) -> tuple[dict[str, LoraPair], LayerSlots]:
    """One optimizer update of one layer's LoRA pairs; inputs are not modified.

    Args:
        params: target -> (a, b) of this layer.
        grads: the same structure, or None when the layer was not selected this step (LCSB): it is
            then updated with a zero gradient (momentum and weight decay still move it).
        slots: this layer's optimizer slots (`OptState.slots[layer]`).
        step: the run's global step number, 1-based (bias correction).
        frozen: with `grads=None`, return params and slots unchanged instead.

    Returns:
        The new params and slots of this layer.
    """
    if step < 1:
        raise ValueError(f"`step` is 1-based, got {step}")
    if grads is None and frozen:
        return params, slots
    new_params, new_slots = {}, {}
    for t, p in params.items():
        g = LoraPair(torch.zeros_like(p.a), torch.zeros_like(p.b)) if grads is None else grads[t]
        a, slots_a = _update_tensor(opt, p.a, g.a, tuple(s.a for s in slots[t]), step)
        b, slots_b = _update_tensor(opt, p.b, g.b, tuple(s.b for s in slots[t]), step)
        new_params[t] = LoraPair(a, b)
        new_slots[t] = tuple(LoraPair(sa, sb) for sa, sb in zip(slots_a, slots_b))
    return new_params, new_slots


def update_all(opt: OptimizerConfig, lora: LoraWeights, grads: LoraWeights, state: OptState, *,
               selected: set[int] | None = None, frozen_unselected: bool = False) -> tuple[LoraWeights, OptState]:
    """One step over every layer at once (for gradients computed in full beforehand).

    Args:
        grads: per layer; layers outside `selected` (None: all layers) are updated with a zero
            gradient, or not at all with `frozen_unselected`.
    """
    step = state.step + 1
    new_lora, new_slots = [], []
    for i, (params, slots) in enumerate(zip(lora, state.slots)):
        chosen = selected is None or i in selected
        p, s = update_layer(opt, params, grads[i] if chosen else None, slots, step, frozen=frozen_unselected)
        new_lora.append(p)
        new_slots.append(s)
    return tuple(new_lora), OptState(step, tuple(new_slots))
