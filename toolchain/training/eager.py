"""The eager trainer: MeSP steps in PyTorch, an LCSB step plan, a layer-by-layer optimizer update.

Each step takes one example (batch 1), backpropagates through the plan's layers for that step, and
updates every selected layer's LoRA in place right after its backward (`mesp_step`'s `on_layer_grads`), so
gradients of different layers never coexist. After the backward, layers that were not selected get
the optimizer's zero-gradient update when `optimizer.moves_unselected` (toolchain/optim.py). The
update of a layer never affects the step that produced its gradient: the forward and every backward
of the step read the adapter as it was when the step began.

Rows, checkpoints, resume and telemetry are the shared loop's (loop.py), as for the program trainer.
This module never prints; callers observe progress through `on_step`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp import StepOptions, mesp_step, model_loss
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights
from toolchain.optim import OptimizerConfig, OptState, init_state, update_layer
from toolchain.training.checkpoint import rows_sha256, tensors_sha256
from toolchain.training.loop import OnStep, Trainer, TrainRun, host_info
from toolchain.training.result import RunOutcome

__all__ = ["DEFAULT_OPTIMIZER", "run_optimizer", "RunState", "EagerTrainer", "start_run", "train_step", "train",
           "evaluate", "held_out_loss", "assign_update"]


# The eager trainer's optimizer when `TrainRun.optimizer` is None (the LCSB paper's: lr 1e-4, weight decay 0.01).
DEFAULT_OPTIMIZER = OptimizerConfig("adamw", weight_decay=0.01)


def run_optimizer(run: TrainRun) -> OptimizerConfig:
    """The optimizer of an eager run: `run.optimizer` (None: `DEFAULT_OPTIMIZER`), with `run.lr` when given."""
    opt = DEFAULT_OPTIMIZER if run.optimizer is None else run.optimizer
    return opt if run.lr is None else replace(opt, lr=run.lr)


def run_step_options(run: TrainRun) -> StepOptions:
    return StepOptions() if run.options is None else run.options


class RunState(NamedTuple):
    """The adapter and optimizer state of a run; `train_step` updates their tensors in place."""

    lora: LoraWeights
    opt: OptState

    def clone(self) -> RunState:
        """An independent copy (to branch two runs from one state)."""
        pair = lambda p: LoraPair(p.a.clone(), p.b.clone())  # noqa: E731
        return RunState(tuple({t: pair(p) for t, p in layer.items()} for layer in self.lora),
                        OptState(self.opt.step, tuple({t: tuple(pair(x) for x in s) for t, s in layer.items()}
                                                      for layer in self.opt.slots)))


def start_run(config: TrainRun, lora: LoraWeights) -> RunState:
    """The run's own copy of the adapter (train_step updates it in place; the caller's is left alone)."""
    own = tuple({t: LoraPair(p.a.clone(), p.b.clone()) for t, p in layer.items()} for layer in lora)
    return RunState(own, init_state(run_optimizer(config), own))


def assign_update(layer: dict[str, LoraPair], slots, new_layer: dict[str, LoraPair], new_slots) -> None:
    """Write one layer's updated LoRA pairs and optimizer slots into the run's tensors (in place)."""
    for t, p in layer.items():
        p.a.copy_(new_layer[t].a)
        p.b.copy_(new_layer[t].b)
        for old, new in zip(slots[t], new_slots[t]):
            old.a.copy_(new.a)
            old.b.copy_(new.b)


def train_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, state: RunState, example: DataRow, *,
               layers: Sequence[int] | None, config: TrainRun) -> tuple[RunState, float]:
    """One step: MeSP forward/backward through `layers` (None: all), updating each layer as it goes.

    Returns:
        The new state and the loss of `example` before the update.
    """
    opt = run_optimizer(config)
    step = state.opt.step + 1
    selected = set(range(arch.layers)) if layers is None else set(layers)

    def update(i: int, grads: dict[str, LoraPair] | None) -> None:
        # In place, right after layer i's backward: nothing of the step reads layer i's LoRA after it (the
        # backward of layer j < i uses layer j's), so only one layer's new tensors are ever transient,
        # instead of a second copy of the whole adapter and its optimizer state.
        assign_update(state.lora[i], state.opt.slots[i],
                      *update_layer(opt, state.lora[i], grads, state.opt.slots[i], step))

    with torch.no_grad():
        result = mesp_step(arch, weights, cfg, state.lora, example.input_ids, example.labels,
                           options=run_step_options(config), backward_layers=selected, on_layer_grads=update,
                           keep_grads=False, layers_per_checkpoint=config.layers_per_checkpoint)
        for i in sorted(set(range(arch.layers)) - selected):
            update(i, None)                                          # unchanged unless unselected layers move
    return RunState(state.lora, OptState(step, state.opt.slots)), float(result.loss)


def _state_tensors(state: RunState, opt: OptimizerConfig) -> dict[str, Tensor]:
    out = {}
    for i, layer in enumerate(state.lora):
        for t, pair in layer.items():
            out[f"lora.{i}.{t}.a"], out[f"lora.{i}.{t}.b"] = pair.a, pair.b
            for role, slot in zip(opt.slot_roles, state.opt.slots[i][t]):
                out[f"{role}.{i}.{t}.a"], out[f"{role}.{i}.{t}.b"] = slot.a, slot.b
    return out


class EagerTrainer(Trainer):
    """`train` as an object: `EagerTrainer(...).run(on_step=...)`; `state` is the `RunState` so far."""

    backend = "eager"

    def __init__(self, arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
                 examples: Sequence[DataRow], config: TrainRun, *, model_name: str = "custom") -> None:
        self.arch, self.weights, self.cfg, self.examples = arch, weights, cfg, examples
        self.run_options = self.config = config
        self.optimizer = run_optimizer(config)
        self.layers, self.rows, self.model_name = arch.layers, len(examples), model_name
        self._start_adapter = tensors_sha256(p for layer in lora for t in sorted(layer) for p in layer[t])
        self._state = start_run(config, lora)
        self._settings: dict[str, Any] | None = None

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def lora(self) -> LoraWeights:
        return self._state.lora

    def step(self, step: int, row: int, layers: tuple[int, ...] | None) -> tuple[float, int]:
        ex, config = self.examples[row], self.config
        ws = self.working
        if ws is not None:         # memory pressure may have lowered the knobs (loop.py, pressure.py)
            if ws.seq_len is not None and ex.input_ids.shape[0] > ws.seq_len:
                ex = DataRow(ex.input_ids[:ws.seq_len], ex.labels[:ws.seq_len])
            if ws.layers_per_checkpoint != config.layers_per_checkpoint:
                config = replace(config, layers_per_checkpoint=ws.layers_per_checkpoint)
        self._state, loss = train_step(self.arch, self.weights, self.cfg, self._state, ex, layers=layers,
                                       config=config)
        return loss, int((ex.labels != -100).sum())

    def row_tokens(self, row: int) -> int:
        return int(self.examples[row].input_ids.shape[0])

    def held_out(self, rows) -> dict[str, Any]:
        return held_out_loss(self.arch, self.weights, self.cfg, self.lora, rows, options=run_step_options(self.config))

    def snapshot(self) -> RunState:
        return self._state.clone()

    def load_snapshot(self, snap: RunState) -> None:
        self._state = snap.clone()

    def predict_peak_mb(self, ws) -> float | None:
        """The planner's checkpoint term for `ws` (memory/fit.py's `checkpoints` part: the [T, d] layer inputs alive
        at once, `inputs_alive_bound`), which is what the knobs change. Not the whole analytic peak: that traces the
        step on meta tensors once per process and keeps ~69 MB of Python objects (measured with the 24-layer
        test model), which would itself count against the budget."""
        from toolchain.mesp.step import inputs_alive_bound

        tokens = ws.seq_len or max(self.row_tokens(r) for r in range(self.rows))
        alive = inputs_alive_bound(ws.selected(self.arch.layers), ws.layers_per_checkpoint)
        return alive * tokens * self.arch.hidden * self.weights.final_norm.element_size() / 2**20

    def tensors(self) -> dict[str, Tensor]:
        return _state_tensors(self._state, self.optimizer)

    def restore(self, tensors: dict[str, Tensor], step: int, where: str) -> None:
        like = self.tensors()
        bad = sorted(set(like) ^ set(tensors)) or [k for k in like if tensors[k].shape != like[k].shape
                                                   or tensors[k].dtype != like[k].dtype]
        if bad:
            raise BadInput(f"checkpoint {where} does not fit this adapter and optimizer ({bad[0]}); "
                           f"delete it to start over")
        opt = self.optimizer
        lora = tuple({t: LoraPair(tensors[f"lora.{i}.{t}.a"], tensors[f"lora.{i}.{t}.b"]) for t in layer}
                     for i, layer in enumerate(self._state.lora))
        slots = tuple({t: tuple(LoraPair(tensors[f"{r}.{i}.{t}.a"], tensors[f"{r}.{i}.{t}.b"]) for r in opt.slot_roles)
                       for t in layer} for i, layer in enumerate(self._state.lora))
        self._state = RunState(lora, OptState(step, slots))

    def settings(self) -> dict[str, Any]:
        if self._settings is None:  # hashing the rows once per run
            w = self.weights
            plan = self.config.plan
            self._settings = {
                "trainer": "eager", "model": self.model_name, "arch": asdict(self.arch),
                "weights": tensors_sha256([w.embed[:4], w.final_norm, w.lm_head[-4:]]),
                "lora": {"rank": self.cfg.rank, "alpha": self.cfg.alpha, "targets": list(self.cfg.targets),
                         "use_rslora": self.cfg.use_rslora},
                "start_adapter": self._start_adapter, "data": rows_sha256(self.examples),
                "optimizer": self.optimizer.to_dict(), "shuffle_seed": self.config.shuffle_seed,
                "plan": None if plan is None else plan.to_dict(), "options": asdict(run_step_options(self.config))}
        return self._settings

    def run_info(self) -> dict[str, Any]:
        plan, opt = self.config.plan, self.optimizer
        info = {"model": self.model_name, "method": "mesp", "backend": "eager",
                "seq_len": max(int(ex.input_ids.shape[0]) for ex in self.examples), "rank": self.cfg.rank,
                "targets": list(self.cfg.targets), "optimizer": opt.kind, "lr": opt.lr, "quant": "none", **host_info()}
        if plan is not None and plan.policy != "full":
            info["lcsb_k"] = plan.k
        return info


def train(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, examples: Sequence[DataRow],
          config: TrainRun, *, on_step: OnStep | None = None, model_name: str = "custom") -> RunOutcome:
    """Train the adapter for `config.steps` steps.

    Args:
        lora: the starting adapter (not modified).
        examples: training rows, already checked against `arch`.
        on_step: called after every step with its log entry (progress bars).
        model_name: what telemetry and the checkpoint's settings call the model.

    Raises:
        BadInput: the plan was made for a different number of layers, there are no examples, or the
            checkpoint to resume from is not this run's.
    """
    return EagerTrainer(arch, weights, cfg, lora, examples, config, model_name=model_name).run(on_step=on_step)


def evaluate(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
             examples: Sequence[DataRow], *, options: StepOptions = StepOptions()) -> float:
    """Mean loss over `examples` (forward only), each weighted by its number of predicted tokens."""
    return held_out_loss(arch, weights, cfg, lora, examples, options=options)["loss"]


def held_out_loss(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
                  examples: Sequence[DataRow], *, options: StepOptions = StepOptions()) -> dict[str, Any]:
    """{"loss": mean over all target tokens (pooled, as `runtime.evaluate.evaluate_program`), "rows", "tokens"};
    rows without a target are skipped."""
    total, tokens, rows = 0.0, 0, 0
    with torch.no_grad():
        for ex in examples:
            n = int((ex.labels[1:] != -100).sum())
            if n == 0:
                continue
            total += float(model_loss(arch, weights, cfg, lora, ex.input_ids, ex.labels, options=options)) * n
            tokens += n
            rows += 1
    if tokens == 0:
        raise BadInput("evaluation data has no token to predict")
    return {"loss": total / tokens, "rows": rows, "tokens": tokens}
