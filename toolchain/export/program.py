"""The target-neutral training program: the explicit MeSP step as an `nn.Module` that holds the
frozen weights as constant buffers and takes the LoRA state (and optimizer moments) as inputs.

Methods (the app-facing contract, recorded in manifest.json):
  train_step[_p{k}](input_ids [T] int64, labels [T] int64, lr [1] float32, *state) -> (loss [1], *updated)
      One forward + MeSP backward + optimizer update applied layer by layer right after that layer's
      backward (so all layers' gradients never coexist). `state` is every entry of `state_layout`
      (LoRA A/B, then AdamW moments and step), one tensor each; `updated` is the new value of each
      entry the method changes (`updated_entries`), in layout order. One method per LCSB phase `k`
      (only the phase's layers are backpropagated); a single `train_step` when LCSB is off.

Why state in / state out (functional) rather than mutable buffers: the stock ExecuTorch `Module`
of the Android and iOS runtimes gives every method its own memory arenas, so mutable buffers are not
shared between LCSB phase methods; ONNX has no mutable state at all, and Core ML states are fp16
only (unsound for AdamW moments). Functional state is the one contract all three runtimes run
unchanged: the app owns one flat float32 array (checkpointing is writing it), passes its slices as
inputs, and copies each output back into its slice.
Rows shorter than T are padded by the app: input_ids with `pad_token_id`, labels with -100 (causal
attention: trailing padding changes nothing before it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from toolchain.errors import BadInput
from toolchain.lcsb.update_rules import adamw_tensor_update, sgd_tensor_update
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import peft_key
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp import StepOptions, mesp_step
from toolchain.mesp.ops.quant import QuantWeight, quantize, with_chunk_rows
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["OptimizerSpec", "QuantSpec", "StepProgram", "StateEntry", "state_layout", "method_name", "flat_state",
           "unflatten_state", "TrainMethod", "example_inputs"]

# The projection matrices; embeddings/LM head stay float (a quantized LM head would need the whole
# [V, d] matrix dequantized per loss chunk), as do norms and biases.
QUANTIZED_FIELDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class QuantSpec:
    """Frozen projection weights: float32 (`none`), or group-wise int8 / int4 (see mesp/ops/quant.py)."""

    kind: Literal["none", "int8", "int4"] = "none"
    group: int = 64
    # Dequantize at most this many weights at once: 16 MiB as float32. Each chunk is ~13 graph nodes,
    # repeated in every MLP token chunk, forward, recompute and backward; ExecuTorch's edge passes
    # cost ~20 ms per node. The Qwen2.5-0.5B int4 step: 4 MiB chunks with interleaved nibbles, 3.9k
    # nodes per layer (export > 50 CPU-min); planar nibbles, 3.2k; 16 MiB chunks, 1.9k (27 CPU-min;
    # gate/up: 2 chunks of 8.3 MiB instead of 5 of 3.3).
    chunk_elems: int = 1 << 22

    def __post_init__(self) -> None:
        if self.kind not in ("none", "int8", "int4"):
            raise BadInput(f"unknown quantization {self.kind!r}; choose none, int8 or int4")
        if self.group < 2 or self.group % 2:
            raise BadInput(f"quantization group must be an even number >= 2, got {self.group}")
        if self.chunk_elems < 1:
            raise BadInput(f"dequantization chunk must hold at least one weight, got {self.chunk_elems}")

    def check(self, arch: Qwen25Arch) -> None:
        if self.kind != "none":
            for width in (arch.hidden, arch.intermediate):
                if width % self.group:
                    raise BadInput(f"quantization group {self.group} does not divide the model width {width}; "
                                   f"pick a group that divides {arch.hidden} and {arch.intermediate}")


@dataclass(frozen=True)
class OptimizerSpec:
    """The in-program optimizer. AdamW follows torch.optim.AdamW (bias correction, decoupled decay).

    LCSB: parameters of layers outside a phase get a zero gradient and still move by momentum and
    weight decay (the paper's semantics).
    """

    kind: Literal["sgd", "adamw"] = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    frozen_unselected: bool = False  # True: LCSB-unselected parameters do not move at all (comparison)

    def __post_init__(self) -> None:
        if self.kind not in ("sgd", "adamw"):
            raise BadInput(f"unknown optimizer {self.kind!r}; choose sgd or adamw")


@dataclass(frozen=True)
class StateEntry:
    """One tensor of the flat state vector."""

    name: str            # buffer name inside the program
    key: str             # PEFT key of the parameter it belongs to (moments too)
    role: Literal["param", "exp_avg", "exp_avg_sq", "step"]
    shape: tuple[int, ...]
    offset: int          # in elements
    layer: int | None = None  # the decoder layer it belongs to (None: the AdamW step counter)
    numel: int = field(init=False)

    def __post_init__(self) -> None:
        n = 1
        for s in self.shape:
            n *= s
        object.__setattr__(self, "numel", n)


def method_name(phase: int | None) -> str:
    return "train_step" if phase is None else f"train_step_p{phase}"


def _buf(prefix: str, layer: int, target: str, which: str) -> str:
    return f"{prefix}_{layer}_{target}_{which}"


def state_layout(arch: Qwen25Arch, cfg: LoraConfig, optimizer: OptimizerSpec) -> list[StateEntry]:
    """Order and offsets of the flat state: per layer, per target, A then B; then AdamW moments in the
    same order (exp_avg, then exp_avg_sq), then the AdamW step counter."""
    entries: list[StateEntry] = []
    roles = [("lora", "param")] + ([("adam_m", "exp_avg"), ("adam_v", "exp_avg_sq")] if optimizer.kind == "adamw" else [])
    offset = 0
    for prefix, role in roles:
        for i in range(arch.layers):
            for t in cfg.targets:
                d_out, d_in = arch.linear_shape(t)
                for which, shape in (("a", (cfg.rank, d_in)), ("b", (d_out, cfg.rank))):
                    e = StateEntry(_buf(prefix, i, t, which), peft_key(i, t, which.upper()), role, shape, offset, i)
                    entries.append(e)
                    offset += e.numel
    if optimizer.kind == "adamw":
        entries.append(StateEntry("adam_step", "", "step", (1,), offset))
    return entries


def flat_state(layout: list[StateEntry], lora: LoraWeights) -> Tensor:
    """The initial flat state: the adapter's A/B in layout order, optimizer moments and step zero."""
    values = {}
    for i, layer in enumerate(lora):
        for t, pair in layer.items():
            values[_buf("lora", i, t, "a")], values[_buf("lora", i, t, "b")] = pair.a, pair.b
    return torch.cat([values[e.name].detach().reshape(-1).float() if e.name in values
                      else torch.zeros(e.numel, dtype=torch.float32) for e in layout])


def unflatten_state(layout: list[StateEntry], flat: Tensor) -> dict[str, Tensor]:
    """Views of `flat` as the named state tensors (writing a view writes `flat`)."""
    return {e.name: flat[e.offset:e.offset + e.numel].view(e.shape) for e in layout}


class StepProgram(nn.Module):
    """Frozen weights as constant buffers; the LoRA/optimizer state goes in and out of `train_step`."""

    def __init__(self, arch: Qwen25Arch, weights: ModelWeights, cfg: LoraConfig, *,
                 optimizer: OptimizerSpec = OptimizerSpec(), options: StepOptions = StepOptions(),
                 quant: QuantSpec = QuantSpec()) -> None:
        super().__init__()
        quant.check(arch)
        self.arch, self.cfg, self.optimizer, self.options, self.quant = arch, cfg, optimizer, options, quant
        self.layout = state_layout(arch, cfg, optimizer)
        self.register_buffer("embed", weights.embed)
        self.register_buffer("final_norm", weights.final_norm)
        if not weights.tied:
            self.register_buffer("lm_head", weights.lm_head)
        for i, lw in enumerate(weights.layers):
            for name, t in lw._asdict().items():
                if quant.kind != "none" and name in QUANTIZED_FIELDS:
                    qw = quantize(t.float(), quant.kind, quant.group)
                    self.register_buffer(f"w_{i}_{name}_q", qw.q)
                    self.register_buffer(f"w_{i}_{name}_scale", qw.scale)
                else:
                    self.register_buffer(f"w_{i}_{name}", t)

    # -- views of the buffers as the step's bundles ------------------------------------------------
    def model_weights(self) -> ModelWeights:
        layers = tuple(LayerWeights(**{f: self._frozen(i, f) for f in LayerWeights._fields})
                       for i in range(self.arch.layers))
        head = self.embed if self.arch.tie_embeddings else self.lm_head
        return ModelWeights(self.embed, layers, self.final_norm, head)

    def _frozen(self, layer: int, field_: str) -> Tensor | QuantWeight:
        if self.quant.kind != "none" and field_ in QUANTIZED_FIELDS:
            bits = 8 if self.quant.kind == "int8" else 4
            qw = QuantWeight(getattr(self, f"w_{layer}_{field_}_q"), getattr(self, f"w_{layer}_{field_}_scale"), bits)
            return with_chunk_rows(qw, self.quant.chunk_elems)
        return getattr(self, f"w_{layer}_{field_}")

    def _lora(self, state: dict[str, Tensor]) -> LoraWeights:
        return tuple({t: LoraPair(state[_buf("lora", i, t, "a")], state[_buf("lora", i, t, "b")])
                      for t in self.cfg.targets} for i in range(self.arch.layers))

    # -- the contract ---------------------------------------------------------------------------------
    def updated_entries(self, phase_layers: tuple[int, ...] | None) -> list[StateEntry]:
        """The state entries a method returns: those it changes. SGD without weight decay leaves the
        LCSB-unselected layers untouched; AdamW (and weight decay) move every parameter."""
        selected = set(range(self.arch.layers)) if phase_layers is None else set(phase_layers)
        o = self.optimizer
        moves_unselected = not o.frozen_unselected and (o.kind == "adamw" or o.weight_decay)
        out = []
        for e in self.layout:
            if e.layer is None or e.layer in selected or moves_unselected:
                out.append(e)
        return out

    def train_step(self, input_ids: Tensor, labels: Tensor, lr: Tensor, state: dict[str, Tensor],
                   phase_layers: tuple[int, ...] | None) -> tuple[Tensor, dict[str, Tensor]]:
        """One step; returns (loss [1], new value of every `updated_entries` tensor). `state` is not
        modified."""
        selected = set(range(self.arch.layers)) if phase_layers is None else set(phase_layers)
        new: dict[str, Tensor] = {}
        step = state["adam_step"] + 1.0 if self.optimizer.kind == "adamw" else None
        if step is not None:
            new["adam_step"] = step

        def update(layer: int, grads: dict[str, LoraPair]) -> None:
            for t, g in grads.items():
                self._update(state, new, f"{layer}_{t}_a", g.a, lr, step)
                self._update(state, new, f"{layer}_{t}_b", g.b, lr, step)

        res = mesp_step(self.arch, self.model_weights(), self._lora(state), self.cfg, input_ids, labels,
                        options=self.options, backward_layers=selected, on_layer_grads=update, keep_grads=False)
        o = self.optimizer
        if not o.frozen_unselected and (o.kind == "adamw" or o.weight_decay):
            # LCSB: unselected layers get a zero gradient and still move by momentum and weight decay.
            for i in sorted(set(range(self.arch.layers)) - selected):
                for t in self.cfg.targets:
                    for which in ("a", "b"):
                        suffix = f"{i}_{t}_{which}"
                        self._update(state, new, suffix, torch.zeros_like(state["lora_" + suffix]), lr, step)
        return res.loss.reshape(1), {e.name: new[e.name] for e in self.updated_entries(phase_layers)}

    def _update(self, state: dict[str, Tensor], new: dict[str, Tensor], suffix: str, grad: Tensor, lr: Tensor,
                step: Tensor | None) -> None:
        p = state["lora_" + suffix]
        o = self.optimizer
        if o.kind == "sgd":
            new["lora_" + suffix] = sgd_tensor_update(p, grad, lr, weight_decay=o.weight_decay)
            return
        new["lora_" + suffix], new["adam_m_" + suffix], new["adam_v_" + suffix] = adamw_tensor_update(
            p, grad, state["adam_m_" + suffix], state["adam_v_" + suffix], step, lr, betas=o.betas, eps=o.eps,
            weight_decay=o.weight_decay)

    def eager_step(self, input_ids: Tensor, labels: Tensor, lr: float, flat: Tensor,
                   phase_layers: tuple[int, ...] | None) -> float:
        """The reference for the runtimes: one step in PyTorch, updating `flat` in place as an app does."""
        views = unflatten_state(self.layout, flat)
        with torch.no_grad():
            loss, new = self.train_step(input_ids, labels, torch.tensor([lr], dtype=torch.float32), views, phase_layers)
            for name, value in new.items():
                views[name].copy_(value)
        return float(loss[0])


class TrainMethod(nn.Module):
    """One method of the contract as a plain `forward`: (input_ids, labels, lr, *state) -> (loss, *updated),
    for exporters (ExecuTorch, ONNX, Core ML) that trace a module's forward."""

    def __init__(self, program: StepProgram, phase_layers: tuple[int, ...] | None) -> None:
        super().__init__()
        self.program, self.phase_layers = program, phase_layers
        self.names = [e.name for e in program.layout]

    def forward(self, input_ids, labels, lr, *state):
        loss, new = self.program.train_step(input_ids, labels, lr, dict(zip(self.names, state)), self.phase_layers)
        return (loss, *new.values())


def example_inputs(program: StepProgram, seq_len: int) -> tuple:
    """Tracing inputs of a train method: ids/labels [T], lr [1], then every state tensor."""
    ids = torch.zeros(seq_len, dtype=torch.int64)
    lr = torch.full((1,), 1e-4, dtype=torch.float32)
    return (ids, ids.clone(), lr, *(torch.zeros(e.shape, dtype=torch.float32) for e in program.layout))
