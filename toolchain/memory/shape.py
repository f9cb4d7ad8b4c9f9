"""What the analytic memory model of a training step takes (`StepShape`) and the parts every method
holds through the step (LoRA parameters, gradients, optimizer state, rope tables), shared by the MeSP
model (estimate.py) and the autograd baselines' (estimate_autograd.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from toolchain.errors import BadInput
from toolchain.lora.config import ALL_TARGETS
from toolchain.mesp.step import StepOptions, checkpoint_groups
from toolchain.models.presets import ModelArch

__all__ = ["BYTES_PER_MB", "METHODS", "Method", "Parts", "StepShape", "lora_elems", "state_parts"]

BYTES_PER_MB = 1 << 20
METHODS = ("mesp", "mebp", "autograd")
Method = Literal["mesp", "mebp", "autograd"]
Parts = dict[str, float]
_OPTIONS = StepOptions()


@dataclass(frozen=True)
class StepShape:
    """What the peak of a training step depends on.

    Args:
        seq_len: tokens per step, T.
        rank: LoRA rank.
        targets: adapted projections. Default: all seven.
        method: "mesp" (`mesp_step`), "mebp" (per-block checkpointing + autograd, full logits) or
            "autograd" (everything stored, full logits), as `toolchain bench memory` runs them.
            Default: "mesp".
        loss_chunk: tokens per LM-head chunk (StepOptions.loss_chunk; MeSP only). Default: StepOptions'.
        vocab_chunk: vocabulary entries per LM-head chunk (StepOptions.vocab_chunk: the online-softmax
            loss); None = whole rows (`ce_chunked`). Default: StepOptions'.
        mlp_chunk: intermediate columns per MLP chunk in forward and backward (StepOptions.mlp_chunk); None =
            all f at once. Default: StepOptions'.
        lcsb_k: layers backpropagated per step; the worst selection (the top k) is assumed (MeSP only).
        backward_layers: the exact selection (overrides lcsb_k).
        grads: "layer" drops each layer's gradients after its update (the exported program, `bench
            memory`); "all" keeps every selected layer's gradients until the step returns (eager
            `mesp_step` with keep_grads=True). MeBP and autograd always hold all. Default: "layer".
        optimizer: "adamw" adds two moments per LoRA parameter. Default: "sgd".
        layers_per_checkpoint: keep every s-th selected layer's input and recompute the rest a group at a
            time (`mesp_step(layers_per_checkpoint=s)`; MeSP only). Default: 1 (every selected layer's).
        dtype_bytes: bytes per activation and LoRA element: 2 (bf16), 4 (fp32) or 8 (fp64). Default: 4.
    """

    arch: ModelArch
    seq_len: int
    rank: int
    targets: tuple[str, ...] = ALL_TARGETS
    method: Method = "mesp"
    loss_chunk: int = _OPTIONS.loss_chunk
    vocab_chunk: int | None = _OPTIONS.vocab_chunk
    mlp_chunk: int | None = _OPTIONS.mlp_chunk
    lcsb_k: int | None = None
    backward_layers: tuple[int, ...] | None = None
    grads: Literal["all", "layer"] = "layer"
    optimizer: Literal["sgd", "adamw"] = "sgd"
    layers_per_checkpoint: int = 1
    dtype_bytes: int = 4

    def __post_init__(self) -> None:
        for name in ("seq_len", "rank", "loss_chunk", "dtype_bytes", "layers_per_checkpoint"):
            if getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1, got {getattr(self, name)}")
        for name in ("mlp_chunk", "vocab_chunk"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1 or None, got {getattr(self, name)}")
        if self.dtype_bytes not in (2, 4, 8):
            raise BadInput(f"`dtype_bytes` must be 2, 4 or 8 (bf16, fp32, fp64), got {self.dtype_bytes}")
        if self.method not in METHODS:
            raise BadInput(f"unknown method {self.method!r}; choose {', '.join(METHODS)}")
        if self.lcsb_k is not None and not 1 <= self.lcsb_k <= self.arch.layers:
            raise BadInput(f"`lcsb_k` must be in 1..{self.arch.layers} (the layer count), got {self.lcsb_k}")
        if self.backward_layers is not None and not set(self.backward_layers) <= set(range(self.arch.layers)):
            raise BadInput(f"`backward_layers` must be within 0..{self.arch.layers - 1}")
        if self.method != "mesp" and (self.lcsb_k is not None or self.backward_layers is not None):
            raise BadInput(f"LCSB (`lcsb_k`, `backward_layers`) is modelled for mesp only, not {self.method}")
        if self.method != "mesp" and self.layers_per_checkpoint != 1:
            raise BadInput(f"`layers_per_checkpoint` is modelled for mesp only, not {self.method}")
        unknown = [t for t in self.targets if t not in ALL_TARGETS]
        if unknown:
            raise BadInput(f"unknown LoRA target(s) {', '.join(unknown)}; choose from {','.join(ALL_TARGETS)}")

    def selected(self) -> list[int]:
        """Layers backpropagated, descending (the order backward visits them)."""
        if self.backward_layers is not None:
            return sorted(set(self.backward_layers), reverse=True)
        k = self.arch.layers if self.lcsb_k is None else self.lcsb_k
        return list(range(self.arch.layers - 1, self.arch.layers - 1 - k, -1))

    def groups(self) -> list[list[int]]:
        """The selected layers ascending, in the step's checkpoint groups (the first of each is kept)."""
        return checkpoint_groups(sorted(self.selected()), self.layers_per_checkpoint)


def lora_elems(s: StepShape, targets) -> int:
    """LoRA parameters of one layer on `targets` (those of them that are adapted)."""
    return sum(s.rank * sum(s.arch.linear_shape(t)) for t in targets if t in s.targets)


def state_parts(s: StepShape, grads_elems: float) -> Parts:
    """Held through the whole step (elements)."""
    a = s.arch
    n = lora_elems(s, ALL_TARGETS) * a.layers
    return {"lora_params": n, "lora_grads": grads_elems, "optimizer_state": 2 * n if s.optimizer == "adamw" else 0,
            "rope_tables": 2 * s.seq_len * a.head_dim}
