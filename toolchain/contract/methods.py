"""The methods of a program as the manifest lists them: roles, and each method's inputs and outputs in
call order, each bound to where the app gets (or puts) it.

program/spec.py decides which methods a config has (`method_specs`) and what they compute; this module
is only their description, shared by the writer and every reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["TRAINING_ROLES", "PREFERENCE_ROLES", "GENERATION_ROLES", "ALL_ROLES", "IoSpec", "MethodSpec", "fused_name", "FUSED_SUFFIX"]

# The training methods, in the order one step calls them (program/spec.py's docstring).
TRAINING_ROLES = ("embed", "block_forward", "head_loss", "block_backward", "block_skip_update")
# Programs exported with --preference only: `block_backward_pair`, the backward of two sequences through one layer
# and one optimizer update on the sum of their gradients (a DPO step: program/spec.py, docs/preference.md).
PREFERENCE_ROLES = ("block_backward_pair",)
# Generation with the live adapter (mesp/decode.py): the prompt in chunks of `prefill_chunk` tokens through
# `embed_prefill` + `block_prefill` per layer (the chunk's k, v into the app's KV cache); each new token through
# `embed_token` + `block_decode` per layer; `head_logits` gives the next token's logits. The LoRA inputs are the
# same state slices the training methods take.
GENERATION_ROLES = ("embed_token", "embed_prefill", "block_prefill", "block_decode", "head_logits")
ALL_ROLES = TRAINING_ROLES + PREFERENCE_ROLES + GENERATION_ROLES
FUSED_SUFFIX = "_fused"
# The held-out rows a training run evaluates (its first ones): the host's `train --program --eval-data` and the apps
# (Contract.HELD_OUT_EVAL_ROWS / Contract.heldOutEvalRows) read the same number, so their eval events compare.
HELD_OUT_EVAL_ROWS = 32


def fused_name(name: str) -> str:
    """The name of the fused variant of method `name` (same inputs and outputs, native kernels)."""
    return name + FUSED_SUFFIX


@dataclass(frozen=True)
class IoSpec:
    """One input or output of a method, and where the app gets (or puts) it.

    `bind` kinds: "input" (input_ids, labels, lr: from the app's step), "result" (the loss), "activation" (a [T, d] tensor the
    app passes from one method to the next: x, the per-layer checkpoints, the gradient d), "weight" (a
    tensor of the weights file; `key` may contain {layer}), "state" (a slice of the flat state; `entry`
    may contain {layer}), "cache" (generation: the app's KV cache of a layer, k or v [Hk, S, D]; an output
    of S rows fills it, an output of one row is written at row `pos`)."""

    name: str
    dtype: Literal["float32", "int64", "int8", "uint8"]
    shape: tuple[int, ...]
    bind: Literal["input", "result", "activation", "weight", "state", "cache"]
    ref: str   # the input/activation name, weight key or state entry name it binds to
    rows: tuple[int, int] | None = None  # weight only: rows [start, stop) of the tensor (a view, no copy)

    def to_json(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "bind": self.bind, "ref": self.ref}
        if self.rows is not None:
            d["rows"] = list(self.rows)
        return d

    @classmethod
    def from_json(cls, d: dict) -> IoSpec:
        return cls(d["name"], d["dtype"], tuple(d["shape"]), d["bind"], d["ref"],
                   tuple(d["rows"]) if "rows" in d else None)


@dataclass(frozen=True)
class MethodSpec:
    """One method: its name, its role (ALL_ROLES; a fused variant has its stock method's role), its inputs and
    outputs in call order, and the custom kernels it calls."""

    name: str
    role: str
    inputs: tuple[IoSpec, ...]
    outputs: tuple[IoSpec, ...]
    kernels: tuple[str, ...] = ()   # custom kernels it calls (program/spec.py FUSED_KERNELS), beyond the stock ones
    # the generation variant, where not the stock or fused one: "xnnpack" (export/xnnpack_generation.py: the
    # layer's frozen weights are constants of the method, XNNPACK's int8 x int4 linear packs them at load)
    variant: str | None = None
    layer: int | None = None        # a method of one layer (its weights inside): the layer it is called for

    @property
    def executorch_only(self) -> bool:
        """Only the ExecuTorch program has it (it calls custom kernels, or is XNNPACK-delegated with its weights)."""
        return bool(self.kernels) or self.variant is not None

    def to_json(self) -> dict:
        d = {"name": self.name, "role": self.role, "inputs": [i.to_json() for i in self.inputs],
             "outputs": [o.to_json() for o in self.outputs]}
        if self.kernels:
            d["kernels"] = list(self.kernels)
        if self.variant is not None:
            d["variant"] = self.variant
        if self.layer is not None:
            d["layer"] = self.layer
        return d

    @classmethod
    def from_json(cls, d: dict) -> MethodSpec:
        return cls(d["name"], d["role"], tuple(IoSpec.from_json(x) for x in d["inputs"]),
                   tuple(IoSpec.from_json(x) for x in d["outputs"]), tuple(d.get("kernels", ())),
                   d.get("variant"), d.get("layer"))
