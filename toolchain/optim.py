"""The optimizer: one config (`OptimizerConfig`) and one pure update, shared by the eager trainer
(`toolchain/training/eager.py`) and the exported programs (`toolchain/program/spec.py`).

Formulas (step t >= 1, gradient g, parameter p), matching torch.optim:
  SGD:   g' = g + wd * p;  buf = mu * buf + g' (buf = g' at t = 1);  p -= lr * (buf if mu else g')
  AdamW: p *= 1 - lr * wd  (decoupled);  m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
         p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

LCSB semantics (arXiv 2602.13073, docs/lcsb.md): a layer outside a step's selection gets a *zero*
gradient, not "no update": its moments decay and it still moves by momentum and weight decay (the
paper's "implicit updates"). `frozen_unselected=True` leaves such layers and their slots untouched
instead, for comparison. Whether an unselected layer moves at all is `OptimizerConfig.moves_unselected`,
the one place that rule is written (the programs export `block_skip_update` exactly when it holds).
The step counter is global: bias correction uses the steps the run has taken, not the number of times
a layer was selected.

The eager trainer updates one layer at a time (`update_layer`, right after that layer's backward, so
the gradients of two layers never coexist); a program's `block_backward` calls `update_tensor` per
tensor with `lr` and `step` as graph inputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from toolchain.errors import BadInput
from toolchain.lora.weights import LoraPair, LoraWeights

__all__ = ["OptimizerKind", "OptimizerConfig", "DEFAULT_WEIGHT_DECAY", "optimizer_config",
           "LayerSlots", "OptState", "init_state", "update_tensor", "update_layer",
           "update_all", "sgd_tensor_update", "adamw_tensor_update"]

OptimizerKind = Literal["sgd", "adamw"]


@dataclass(frozen=True)
class OptimizerConfig:
    """SGD (torch.optim.SGD: L2 decay added to the gradient, optional heavy-ball momentum) or AdamW
    (torch.optim.AdamW: bias correction, decoupled decay, amsgrad off).

    Args:
        kind: "sgd" or "adamw". Default: "sgd".
        lr: learning rate (programs take lr as an input of every step; the manifest records a default).
            Default: 1e-4 (the MeSP and LCSB papers).
        momentum: SGD only, mu (0: none). Default: 0.
        betas: AdamW only, the moment decay rates. Default: (0.9, 0.999).
        eps: AdamW only, added to the denominator. Default: 1e-8.
        weight_decay: SGD: L2 coefficient added to the gradient; AdamW: p *= 1 - lr * weight_decay.
            Default: 0.
        frozen_unselected: LCSB-unselected layers (and their slots) do not move at all. Default: False.
    """

    kind: OptimizerKind = "sgd"
    lr: float = 1e-4
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    frozen_unselected: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("sgd", "adamw"):
            raise BadInput(f"unknown optimizer {self.kind!r}; choose sgd or adamw")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        _check(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "a finite number > 0")
        _check(math.isfinite(self.momentum) and 0 <= self.momentum < 1, "momentum", self.momentum, "in [0, 1)")
        if self.momentum and self.kind != "sgd":
            raise BadInput(f"optimizer `momentum` applies to sgd (AdamW has beta1 = {self.betas[0]}), got {self.momentum}")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", self.betas, "two numbers in [0, 1)")
        _check(math.isfinite(self.eps) and self.eps > 0, "eps", self.eps, "a finite number > 0")
        _check(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "weight_decay", self.weight_decay,
               "a finite number >= 0")

    @property
    def slot_roles(self) -> tuple[str, ...]:
        """The optimizer state per parameter, in order (names as in torch.optim's state dicts)."""
        if self.kind == "adamw":
            return ("exp_avg", "exp_avg_sq")
        return ("momentum_buffer",) if self.momentum else ()

    @property
    def moves_unselected(self) -> bool:
        """Whether a layer outside the LCSB selection still changes (by momentum or weight decay)."""
        return not self.frozen_unselected and (self.kind == "adamw" or bool(self.momentum) or self.weight_decay != 0)

    def to_dict(self) -> dict:
        """JSON-ready fields (checkpoints record it; `--json` prints it)."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d


# Weight decay when none is chosen: torch.optim.AdamW's 0.01, and torch.optim.SGD's 0.
DEFAULT_WEIGHT_DECAY: dict[str, float] = {"adamw": 0.01, "sgd": 0.0}


def optimizer_config(kind: OptimizerKind, *, lr: float = 1e-4, weight_decay: float | None = None,
                     momentum: float = 0.0, frozen_unselected: bool = False) -> OptimizerConfig:
    """The optimizer the command-line options ask for (`--optimizer`, `--lr`, `--weight-decay`,
    `--momentum`, `--frozen-unselected`).

    Args:
        kind: "sgd" or "adamw".
        lr: learning rate. Default: 1e-4.
        weight_decay: Default: None, `DEFAULT_WEIGHT_DECAY[kind]`.
        momentum: SGD momentum. Default: 0.
        frozen_unselected: see `OptimizerConfig`. Default: False.

    Raises:
        BadInput: momentum with AdamW, or a value `OptimizerConfig` refuses.
    """
    if kind == "adamw" and momentum:
        raise BadInput("--momentum applies to --optimizer sgd (AdamW has beta1 = 0.9)")
    return OptimizerConfig(kind, lr=lr, momentum=momentum, frozen_unselected=frozen_unselected,
                           weight_decay=DEFAULT_WEIGHT_DECAY.get(kind, 0.0) if weight_decay is None else weight_decay)


# Per target: the optimizer's slots for that pair, in `slot_roles` order.
LayerSlots = dict[str, tuple[LoraPair, ...]]


class OptState(NamedTuple):
    step: int                          # steps taken so far by the whole run (bias correction)
    slots: tuple[LayerSlots, ...]      # per layer


def _check(ok: bool, name: str, value, rule: str) -> None:
    if not ok:
        raise BadInput(f"optimizer `{name}` must be {rule}, got {value}")


def init_state(opt: OptimizerConfig, lora: LoraWeights) -> OptState:
    """Zero slots shaped like `lora`, step 0."""
    def zeros(p: LoraPair) -> LoraPair:
        return LoraPair(torch.zeros_like(p.a), torch.zeros_like(p.b))

    n = len(opt.slot_roles)
    return OptState(0, tuple({t: tuple(zeros(p) for _ in range(n)) for t, p in layer.items()} for layer in lora))


# -- per tensor: the formulas, once ------------------------------------------------------------------

def sgd_tensor_update(p: Tensor, g: Tensor, lr, *, weight_decay: float = 0.0) -> Tensor:
    """torch.optim.SGD (no momentum): p - lr * (g + weight_decay * p)."""
    if weight_decay:
        g = g + weight_decay * p
    return p - lr * g


def adamw_tensor_update(p: Tensor, g: Tensor, m: Tensor, v: Tensor, step, lr, *, betas: tuple[float, float] = (0.9, 0.999),
                        eps: float = 1e-8, weight_decay: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """torch.optim.AdamW, one step (step = t >= 1 after incrementing); returns (p, m, v).

    b^t is computed as exp(t log b) when `step` is a tensor, so a program's step input exports as plain ops.
    """
    b1, b2 = betas
    if isinstance(step, Tensor):
        bc1 = 1 - torch.exp(step * math.log(b1))
        bc2 = 1 - torch.exp(step * math.log(b2))
    else:
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
    p = p * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * (g * g)
    denom = torch.sqrt(v) / (bc2 ** 0.5 if not isinstance(bc2, Tensor) else torch.sqrt(bc2)) + eps
    return p - (lr / bc1) * m / denom, m, v


def update_tensor(opt: OptimizerConfig, p: Tensor, g: Tensor, slots: tuple[Tensor, ...], step,
                  lr=None) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One optimizer step of one tensor; pure (inputs are not modified).

    Args:
        p, g: the parameter and its gradient (zeros for an LCSB-unselected layer).
        slots: its optimizer state in `opt.slot_roles` order.
        step: the run's step number t >= 1, a Python int or a [1] tensor (programs).
        lr: overrides `opt.lr` (programs pass it as a [1] tensor input). Default: `opt.lr`.

    Returns:
        The new parameter and slots.
    """
    lr = opt.lr if lr is None else lr
    if opt.kind == "adamw":
        p, m, v = adamw_tensor_update(p, g, *slots, step, lr, betas=opt.betas, eps=opt.eps,
                                      weight_decay=opt.weight_decay)
        return p, (m, v)
    if not opt.momentum:
        return sgd_tensor_update(p, g, lr, weight_decay=opt.weight_decay), ()
    if opt.weight_decay:
        g = g + opt.weight_decay * p
    buf = opt.momentum * slots[0] + g          # = g at step 1 (buf starts at zero, no dampening)
    return sgd_tensor_update(p, buf, lr), (buf,)


# -- per layer and per adapter -----------------------------------------------------------------------

def update_layer(opt: OptimizerConfig, params: dict[str, LoraPair], grads: dict[str, LoraPair] | None,
                 slots: LayerSlots, step: int) -> tuple[dict[str, LoraPair], LayerSlots]:
    """One optimizer update of one layer's LoRA pairs; inputs are not modified.

    Args:
        params: target -> (a, b) of this layer.
        grads: the same structure, or None when the layer was not selected this step (LCSB): it is
            then updated with a zero gradient, unless `not opt.moves_unselected` (returned unchanged).
        slots: this layer's optimizer slots (`OptState.slots[layer]`).
        step: the run's global step number, 1-based (bias correction).

    Returns:
        The new params and slots of this layer.
    """
    if step < 1:
        raise ValueError(f"`step` is 1-based, got {step}")
    if grads is None and not opt.moves_unselected:
        return params, slots
    new_params, new_slots = {}, {}
    for t, p in params.items():
        g = LoraPair(torch.zeros_like(p.a), torch.zeros_like(p.b)) if grads is None else grads[t]
        a, slots_a = update_tensor(opt, p.a, g.a, tuple(s.a for s in slots[t]), step)
        b, slots_b = update_tensor(opt, p.b, g.b, tuple(s.b for s in slots[t]), step)
        new_params[t] = LoraPair(a, b)
        new_slots[t] = tuple(LoraPair(sa, sb) for sa, sb in zip(slots_a, slots_b))
    return new_params, new_slots


def update_all(opt: OptimizerConfig, lora: LoraWeights, grads: LoraWeights, state: OptState, *,
               selected: set[int] | None = None) -> tuple[LoraWeights, OptState]:
    """One step over every layer at once (for gradients computed in full beforehand).

    Args:
        grads: per layer; layers outside `selected` (None: all layers) get `update_layer(grads=None)`.
    """
    step = state.step + 1
    new_lora, new_slots = [], []
    for i, (params, slots) in enumerate(zip(lora, state.slots)):
        chosen = selected is None or i in selected
        p, s = update_layer(opt, params, grads[i] if chosen else None, slots, step)
        new_lora.append(p)
        new_slots.append(s)
    return tuple(new_lora), OptState(step, tuple(new_slots))
