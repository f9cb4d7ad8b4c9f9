"""The eager training loop: MeSP steps, an LCSB step plan, and a layer-by-layer optimizer update.

Each step takes one example (batch 1), backpropagates through the plan's layers for that step, and
updates every selected layer's LoRA right after its backward (`mesp_step`'s `on_layer_grads`), so
gradients of different layers never coexist. After the backward, layers that were not selected get a
zero-gradient update (momentum and weight decay still move them), or none with `frozen_unselected`.
The update of a layer never affects the step that produced its gradient: the forward and every
backward of the step read the adapter as it was when the step began.

This module sits above `toolchain.mesp` and `toolchain.lcsb` (it joins the two) and below `bench/`
and `cli/`. It never prints; callers observe progress through `on_step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from toolchain.dataset import Example
from toolchain.errors import BadInput
from toolchain.lcsb.optim import AdamW, OptimizerConfig, OptState, init_state, update_layer
from toolchain.lcsb.plan import StepPlan, make_plan
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp import StepOptions, mesp_step, model_loss
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import ModelWeights

__all__ = ["TrainConfig", "RunState", "StepLog", "TrainResult", "data_order", "start_run", "train_step", "train",
           "evaluate"]


@dataclass(frozen=True)
class TrainConfig:
    """How to train (the model, adapter and data are arguments of `train`).

    Args:
        steps: optimizer steps, one example each.
        optimizer: `SGD(...)` or `AdamW(...)`. Default: AdamW(lr=1e-4, weight_decay=0.01).
        plan: the LCSB step plan; None means full backprop every step.
        frozen_unselected: leave non-selected layers (and their moments) untouched instead of
            giving them a zero-gradient update. Default: False (the LCSB paper's semantics).
        shuffle_seed: visit the rows in a seeded random order, reshuffled every pass; None keeps
            file order. Default: None.
        options: static step options (loss/MLP chunking).
    """

    steps: int
    optimizer: OptimizerConfig = field(default_factory=AdamW)
    plan: StepPlan | None = None
    frozen_unselected: bool = False
    shuffle_seed: int | None = None
    options: StepOptions = field(default_factory=StepOptions)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise BadInput(f"`steps` must be >= 1, got {self.steps}")


class RunState(NamedTuple):
    lora: LoraWeights
    opt: OptState


class StepLog(NamedTuple):
    step: int                  # 1-based
    loss: float                # loss of this step's example, before its update
    row: int                   # index of the example in the data
    layers: tuple[int, ...]    # layers backpropagated through
    step_s: float              # wall time of the step (forward, backward, update)


class TrainResult(NamedTuple):
    lora: LoraWeights
    opt: OptState
    log: tuple[StepLog, ...]

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.log]


def data_order(rows: int, steps: int, *, shuffle_seed: int | None = None) -> list[int]:
    """Row index of each step: file order cycling, or a fresh seeded permutation per pass."""
    if rows < 1:
        raise BadInput("no training rows")
    if shuffle_seed is None:
        return [s % rows for s in range(steps)]
    gen = torch.Generator().manual_seed(shuffle_seed)
    order: list[int] = []
    while len(order) < steps:
        order.extend(torch.randperm(rows, generator=gen).tolist())
    return order[:steps]


def start_run(config: TrainConfig, lora: LoraWeights) -> RunState:
    return RunState(lora, init_state(config.optimizer, lora))


def train_step(arch: Qwen25Arch, weights: ModelWeights, cfg: LoraConfig, state: RunState, example: Example,
               layers: Sequence[int] | None, config: TrainConfig) -> tuple[RunState, float]:
    """One step: MeSP forward/backward through `layers` (None: all), updating each layer as it goes.

    Returns:
        The new state and the loss of `example` before the update.
    """
    step = state.opt.step + 1
    lora: list[dict[str, LoraPair]] = list(state.lora)
    slots = list(state.opt.slots)
    selected = set(range(arch.layers)) if layers is None else set(layers)

    def update(i: int, grads: dict[str, LoraPair]) -> None:  # right after layer i's backward
        lora[i], slots[i] = update_layer(config.optimizer, lora[i], grads, slots[i], step)

    with torch.no_grad():
        result = mesp_step(arch, weights, state.lora, cfg, example.input_ids, example.labels,
                           options=config.options, backward_layers=selected, on_layer_grads=update, keep_grads=False)
        for i in sorted(set(range(arch.layers)) - selected):
            lora[i], slots[i] = update_layer(config.optimizer, lora[i], None, slots[i], step,
                                             frozen=config.frozen_unselected)
    return RunState(tuple(lora), OptState(step, tuple(slots))), float(result.loss)


def train(arch: Qwen25Arch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, examples: Sequence[Example],
          config: TrainConfig, *, on_step: Callable[[StepLog], None] | None = None) -> TrainResult:
    """Train the adapter for `config.steps` steps.

    Args:
        lora: the starting adapter (not modified).
        examples: training rows, already checked against `arch`.
        on_step: called after every step with its log entry (progress bars, telemetry).

    Raises:
        BadInput: the plan was made for a different number of layers, or there are no examples.
    """
    plan = config.plan or make_plan(arch.layers, None, "full")
    plan.check_layers(arch.layers)
    order = data_order(len(examples), config.steps, shuffle_seed=config.shuffle_seed)
    state = start_run(config, lora)
    log = []
    for s, row in enumerate(order):
        layers = plan.layers_at(s)
        t0 = time.perf_counter()
        state, loss = train_step(arch, weights, cfg, state, examples[row], layers, config)
        entry = StepLog(s + 1, loss, row, layers, time.perf_counter() - t0)
        log.append(entry)
        if on_step is not None:
            on_step(entry)
    return TrainResult(state.lora, state.opt, tuple(log))


def evaluate(arch: Qwen25Arch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
             examples: Sequence[Example], *, options: StepOptions = StepOptions()) -> float:
    """Mean loss over `examples` (forward only), each weighted by its number of predicted tokens."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            n = int((ex.labels[1:] != -100).sum())
            total += float(model_loss(arch, weights, lora, cfg, ex.input_ids, ex.labels, options=options)) * n
            tokens += n
    if tokens == 0:
        raise BadInput("evaluation data has no token to predict")
    return total / tokens
