"""Where a training step's memory goes, computed from the shapes (no measurement).

`bench memory` prints this next to the measured peak so that the peak can be read: what part is
the adapter and its training state, what part the per-layer checkpoints, what the single largest
transient tensor is. The rest of a measured peak is the working set of one block (recompute and
backward), the allocator's slack and the runtime's arenas.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import lora_num_params
from toolchain.memory.measure import MIB
from toolchain.mesp.step import StepOptions, inputs_alive_bound
from toolchain.models.presets import ModelArch

__all__ = ["BreakdownMode", "Breakdown", "step_breakdown"]

BreakdownMode = Literal["autograd", "mebp", "mesp", "mesp_groups", "mezo"]


class Breakdown(NamedTuple):
    """Bytes of each kind of state during one SGD training step (None: not itemized)."""

    lora_params: int          # the adapter itself
    grads: int                # gradients alive at once
    optimizer_state: int      # SGD has none (AdamW: 2 x lora_params, whatever the method)
    checkpoints: int | None   # per-layer block inputs kept between forward and backward
    largest_transient: int    # the single largest temporary tensor
    largest_transient_what: str

    def as_mb(self) -> dict[str, float | str | None]:
        out: dict[str, float | str | None] = {}
        for name, value in self._asdict().items():
            out[name if isinstance(value, str) else f"{name}_mb"] = (
                round(value / MIB, 2) if isinstance(value, int) else value)
        return out


def _loss_block(options: StepOptions, t: int, v: int) -> tuple[str, int]:
    c = min(options.loss_chunk, t)
    if options.vocab_chunk is None:
        return f"loss chunk logits [{c}, V]", c * v
    vc = min(options.vocab_chunk, v)
    return f"loss logits block [{c}, {vc}]", c * vc


def step_breakdown(mode: BreakdownMode, arch: ModelArch, cfg: LoraConfig, seq_len: int,
                   options: StepOptions = StepOptions(), *, bytes_per_value: int = 4,
                   layers_per_checkpoint: int = 1) -> Breakdown:
    """Analytic breakdown of one training step of `mode` (batch 1, SGD).

    Args:
        mode: autograd (stores every activation, full logits), mebp (per-block checkpoints, full
            logits), mesp (checkpoints, chunked loss, layer-by-layer update), mezo (two forwards).
        options: the MeSP/MeZO chunking (loss chunks; MLP chunks of intermediate columns). With quantized
            weights the step rounds MLP chunks up to the quantization group: not reflected here.
        bytes_per_value: 4 for float32.
        layers_per_checkpoint: mesp_groups' checkpoint groups: at most min(L, ceil(L / s) + s - 1) layer
            inputs alive instead of L (`inputs_alive_bound`).
    """
    t, v, f, d = seq_len, arch.vocab, arch.intermediate, arch.hidden
    params = lora_num_params(arch, cfg) * bytes_per_value
    c = f if options.mlp_chunk is None else min(options.mlp_chunk, f)    # intermediate columns per MLP chunk
    head_probs = ("attention scores of one head [T, T]", t * t)
    chunked = (_loss_block(options, t, v), (f"MLP tensor [T, {c}]", t * c), head_probs)
    if mode in ("autograd", "mebp"):
        transient = ("full logits [T, V]", t * v)
        grads = params
        checkpoints = None if mode == "autograd" else arch.layers * t * d * bytes_per_value
    elif mode in ("mesp", "mesp_groups"):
        transient = max(chunked, key=lambda item: item[1])
        grads = params // arch.layers  # one layer's gradients: the update runs right after its backward
        s = layers_per_checkpoint if mode == "mesp_groups" else 1
        checkpoints = inputs_alive_bound(arch.layers, s) * t * d * bytes_per_value
    elif mode == "mezo":
        transient = max(chunked, key=lambda item: item[1])
        grads, checkpoints = 0, 0
    else:
        raise ValueError(f"no breakdown for mode {mode!r}")
    return Breakdown(params, grads, 0, checkpoints, transient[1] * bytes_per_value, transient[0])
