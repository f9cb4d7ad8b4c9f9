"""Analytic peak memory of one MeSP training step (`toolchain.mesp.step.mesp_step`), by named parts.

The model counts the tensors the step's code keeps alive at each candidate peak, then takes the
largest. Notation: T seq_len, d hidden, kv = kv_heads * head_dim, G query heads per kv head,
f intermediate, V vocab, L layers, C a token chunk (mlp_chunk or T; loss_chunk), r rank.

  forward, layer i   checkpoints x_0..x_i; attention one kv group at a time (n1, q, q_rope: 3 T*d;
                     k, k_rope, v: 3 T*kv; the last group's scores and softmax [G,T,T] x2 and the
                     [T,T] mask; the other groups' outputs), or the o projection (o, o regrouped, its
                     output + LoRA term + sum); then the MLP per chunk: x1, the chunk outputs done,
                     n2 and max(4 [C,f], 3 [C,f] + the down projection's outputs).
  loss               L checkpoints, x and hn, the dh chunks done, ONE [C,V] buffer (logits turned into
                     dz in place) and the chunk's [C] vectors; or the final torch.cat of dh.
  final norm         L checkpoints, x, dh and four [T,d] temporaries of rmsnorm_backward.
  backward, layer i  checkpoints x_0..x_i, dout, the recomputed attention half (n1, q_rope, k_rope,
                     v, o, x1), and the largest of: the MLP chunk at swiglu_backward's dg (8 [C,f]:
                     g, u, da, sigmoid, du, two products, dg; 2 [C,d]; the dx chunks done);
                     attention_backward of the last kv group at ds (4 [G,T,T]: p, dp, dp - rowsum,
                     ds; the other groups' dq/dk/dv; dout, dx1, d_o); the q/k/v tail (11 [T,d]).
  end                every selected layer's gradients, when the step returns them.
  everywhere         LoRA params, their grads (all selected layers' kept until the step returns, or
                     one layer's when the update is applied right after each layer), optimizer state
                     (AdamW: 2 moments), rope tables 2 [T, head_dim].

tests/memory/test_memory_estimate.py checks these counts against the live tensors of the real step
(overall and per phase, to 0.2%): when the step changes, that test says which count to update.
Not modelled: the few [T, r] LoRA transients, dequantization transients of int8/int4 weights
(`--program` memory plans include them), allocator slack and the runtime itself: the caller passes
`overhead_mb` (calibrated against `toolchain bench memory`), reported as its own part. Frozen
weights are not counted (memory-mapped clean pages, which the phones' footprint does not count).
MB = 2^20 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from toolchain.errors import BadInput
from toolchain.lora.config import ALL_TARGETS
from toolchain.models.presets import Qwen25Arch

__all__ = ["BYTES_PER_MB", "StepShape", "MemoryEstimate", "estimate_peak", "largest_fitting"]

BYTES_PER_MB = 1 << 20
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class StepShape:
    """What the peak of a MeSP step depends on.

    Args:
        seq_len: tokens per step, T.
        rank: LoRA rank.
        targets: adapted projections. Default: all seven.
        loss_chunk: tokens per LM-head chunk (StepOptions.loss_chunk). Default: 32.
        mlp_chunk: tokens per MLP backward chunk (StepOptions.mlp_chunk); None = T. Default: None.
        lcsb_k: layers backpropagated per step; the worst selection (the top k) is assumed.
        backward_layers: the exact selection (overrides lcsb_k).
        grads: "all" keeps every selected layer's gradients until the step returns (eager
            `mesp_step`); "layer" drops them after each layer's update. Default: "all".
        optimizer: "adamw" adds two moments per LoRA parameter. Default: "sgd".
        dtype_bytes: bytes per activation and LoRA element. Default: 4 (fp32).
    """

    arch: Qwen25Arch
    seq_len: int
    rank: int
    targets: tuple[str, ...] = ALL_TARGETS
    loss_chunk: int = 32
    mlp_chunk: int | None = None
    lcsb_k: int | None = None
    backward_layers: tuple[int, ...] | None = None
    grads: Literal["all", "layer"] = "all"
    optimizer: Literal["sgd", "adamw"] = "sgd"
    dtype_bytes: int = 4

    def __post_init__(self) -> None:
        for name in ("seq_len", "rank", "loss_chunk", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1, got {getattr(self, name)}")
        if self.mlp_chunk is not None and self.mlp_chunk < 1:
            raise BadInput(f"`mlp_chunk` must be >= 1 or None, got {self.mlp_chunk}")
        if self.lcsb_k is not None and not 1 <= self.lcsb_k <= self.arch.layers:
            raise BadInput(f"`lcsb_k` must be in 1..{self.arch.layers} (the layer count), got {self.lcsb_k}")
        if self.backward_layers is not None and not set(self.backward_layers) <= set(range(self.arch.layers)):
            raise BadInput(f"`backward_layers` must be within 0..{self.arch.layers - 1}")
        unknown = [t for t in self.targets if t not in ALL_TARGETS]
        if unknown:
            raise BadInput(f"unknown LoRA target(s) {', '.join(unknown)}; choose from {','.join(ALL_TARGETS)}")

    def selected(self) -> list[int]:
        """Layers backpropagated, descending (the order backward visits them)."""
        if self.backward_layers is not None:
            return sorted(set(self.backward_layers), reverse=True)
        k = self.arch.layers if self.lcsb_k is None else self.lcsb_k
        return list(range(self.arch.layers - 1, self.arch.layers - 1 - k, -1))


@dataclass(frozen=True)
class MemoryEstimate:
    peak_mb: float                 # sum of parts_mb
    phase: str                     # where the peak is: "forward", "loss" or "backward"
    layer: int | None              # the layer of a forward/backward peak
    parts_mb: dict[str, float]     # named parts of the peak (MB each)
    phases_mb: dict[str, float] = field(default_factory=dict)   # each phase's own peak

    def as_dict(self) -> dict:
        return {"peak_mb": self.peak_mb, "phase": self.phase, "layer": self.layer, "parts_mb": dict(self.parts_mb),
                "phases_mb": dict(self.phases_mb)}


def _chunk_starts(t: int, chunk: int) -> list[int]:
    """Starts of the chunks that can hold a phase's peak: the held part grows with the start and
    the working set is equal for all full chunks, so the last full chunk and the last chunk."""
    last = (t - 1) // chunk * chunk
    last_full = (t // chunk - 1) * chunk
    return sorted({s for s in (last_full, last) if s >= 0})


def _lora_elems(s: StepShape, targets) -> int:
    return sum(s.rank * sum(s.arch.linear_shape(t)) for t in targets if t in s.targets)


def _state(s: StepShape, grads_elems: int) -> dict[str, float]:
    """Held through the whole step (elements)."""
    a = s.arch
    n = _lora_elems(s, ALL_TARGETS) * a.layers
    return {"lora_params": n, "lora_grads": grads_elems, "optimizer_state": 2 * n if s.optimizer == "adamw" else 0,
            "rope_tables": 2 * s.seq_len * a.head_dim}


def _forward_parts(s: StepShape, i: int) -> list[dict[str, float]]:
    a, t = s.arch, s.seq_len
    d, kv, f, dh = a.hidden, a.kv_dim, a.intermediate, a.head_dim
    g = a.heads // a.kv_heads                                        # query heads per kv head
    base = {**_state(s, 0), "checkpoints": (i + 1) * t * d}
    mask = t * t / s.dtype_bytes                                     # bool [T, T]
    # attention one kv group at a time: the last group's scores + softmax [G,T,T] x2, the outputs of the others;
    # then the o projection: n1, q, q_rope, o, o regrouped [T, d], its output (+ LoRA term + sum)
    o_out = 3 if "o_proj" in s.targets else 1
    out = [{**base, "attention_saved": 3 * t * d + 3 * t * kv, "attention_outputs": (a.kv_heads - 1) * g * t * dh,
            "attention_scores": 2 * g * t * t + mask},
           {**base, "attention_saved": 3 * t * d + 3 * t * kv, "attention_outputs": (2 + o_out) * t * d}]
    step = t if s.mlp_chunk is None else s.mlp_chunk
    down = 3 if "down_proj" in s.targets else 1                      # y (+ LoRA term + sum) of the down projection
    for start in (_chunk_starts(t, step) if step < t else [0]):
        c = min(step, t - start)
        held = 2 * t * d if step >= t else t * d + start * d + c * d  # x1 (+ outputs of the chunks done) + n2
        # up's LoRA sum or swiglu (g, u and two [C, f] more) vs. the down projection (g, u, a and its outputs)
        out.append({**base, "block_hidden": held, "mlp_working_set": max(4 * c * f, 3 * c * f + down * c * d)})
    return out


def _loss_parts(s: StepShape) -> list[dict[str, float]]:
    a, t, e = s.arch, s.seq_len, s.dtype_bytes
    n_chunks = -(-t // s.loss_chunk)
    labels = 8 * t / e                                               # shifted targets, int64 [T]
    base = {**_state(s, 0), "checkpoints": a.layers * t * a.hidden, "final_hidden": 2 * t * a.hidden}
    out = []
    for start in _chunk_starts(t, s.loss_chunk):
        c = min(s.loss_chunk, t - start)
        # per chunk: valid (bool), tgt (int64), picked, max, sum, lse, weights [C]; the losses so far
        vectors = labels + c * (1 + 8) / e + 5 * c + start // s.loss_chunk + 2
        # the chunk's one [C, V] buffer (z, exp'd and turned into dz in place) while dz @ E is written
        out.append({**base, "hidden_grads": (start + c) * a.hidden, "loss_logits": c * a.vocab, "loss_vectors": vectors})
    # torch.cat of the dh chunks (after the losses are stacked)
    out.append({**base, "hidden_grads": 2 * t * a.hidden, "loss_vectors": labels + n_chunks + 3})
    return out


def _final_norm_parts(s: StepShape) -> list[dict[str, float]]:
    """The final RMSNorm's backward: x, dh, and its [T, d] temporaries (xhat, g, two more)."""
    a, t = s.arch, s.seq_len
    return [{**_state(s, 0), "checkpoints": a.layers * t * a.hidden, "final_hidden": 6 * t * a.hidden}]


def _backward_parts(s: StepShape, i: int, grads_above: float) -> list[dict[str, float]]:
    a, t = s.arch, s.seq_len
    d, kv, f, dh = a.hidden, a.kv_dim, a.intermediate, a.head_dim
    g = a.heads // a.kv_heads
    mlp_grads = _lora_elems(s, _MLP)
    down_grads = _lora_elems(s, ("down_proj",))
    base = {"checkpoints": (i + 1) * t * d, "attention_saved": 4 * t * d + 2 * t * kv}
    out = []
    step = t if s.mlp_chunk is None else s.mlp_chunk
    for start in _chunk_starts(t, step):
        c = min(step, t - start)
        partial = down_grads if start == 0 else mlp_grads + down_grads  # this layer's MLP grads so far
        out.append({**_state(s, grads_above + partial), **base, "hidden_grads": t * d + start * d,
                    "mlp_working_set": 8 * c * f + 2 * c * d})
    # attention backward of the last kv group: its [G,T,T] p, dp, dp - rowsum, ds; the other groups' dq, dk, dv
    partial = mlp_grads + _lora_elems(s, ("o_proj",))
    others = (a.kv_heads - 1) * (g * t * dh + 2 * t * dh)
    out.append({**_state(s, grads_above + partial), **base, "attention_saved": 3 * t * d + 2 * t * kv,
                "hidden_grads": 3 * t * d + t * dh + others, "attention_scores": 4 * g * t * t})
    # the q/k/v tail, in the input norm's backward: n1 and o still held; dout, dx1, dq/dk/dv (one [T, d] +
    # two [T, kv]), the three projections' dx, their sum and rmsnorm_backward's four [T, d] temporaries
    out.append({**_state(s, grads_above + _lora_elems(s, ALL_TARGETS)), "checkpoints": (i + 1) * t * d,
                "attention_saved": 2 * t * d, "hidden_grads": 11 * t * d + 2 * t * kv + t})
    return out


def _candidates(s: StepShape) -> list[tuple[str, int | None, dict[str, float]]]:
    out = [("forward", i, p) for i in range(s.arch.layers) for p in _forward_parts(s, i)]
    out += [("loss", None, p) for p in _loss_parts(s)]
    out += [("final_norm", None, p) for p in _final_norm_parts(s)]
    per_layer = _lora_elems(s, ALL_TARGETS)
    for n_done, i in enumerate(s.selected()):
        grads_above = n_done * per_layer if s.grads == "all" else 0
        out += [("backward", i, p) for p in _backward_parts(s, i, grads_above)]
    if s.grads == "all":   # the step returns every selected layer's gradients
        out.append(("end", None, {**_state(s, len(s.selected()) * per_layer), "checkpoints": 0}))
    return out


def estimate_peak(shape: StepShape, *, overhead_mb: float = 0.0) -> MemoryEstimate:
    """Peak memory of one MeSP step, with its breakdown.

    Args:
        overhead_mb: runtime and allocator memory on top of the live tensors (a calibration
            constant measured with `toolchain bench memory`), reported as the part
            `runtime_overhead`. Default: 0.

    Returns:
        The largest candidate (see the module docstring), parts in MB.
    """
    scale = shape.dtype_bytes / BYTES_PER_MB
    phases: dict[str, float] = {}
    best = None
    for phase, layer, parts in _candidates(shape):
        total = sum(parts.values())
        phases[phase] = max(phases.get(phase, 0.0), total * scale + overhead_mb)
        if best is None or total > best[0]:
            best = (total, phase, layer, parts)
    total, phase, layer, parts = best
    parts_mb = {k: v * scale for k, v in parts.items() if v}
    if overhead_mb:
        parts_mb["runtime_overhead"] = overhead_mb
    return MemoryEstimate(sum(parts_mb.values()), phase, layer, parts_mb, phases)


def largest_fitting(shape: StepShape, budget_mb: float, field_name: Literal["seq_len", "rank"], hi: int, *,
                    overhead_mb: float = 0.0,
                    estimate: Callable[[StepShape], float] | None = None) -> int | None:
    """The largest value of `seq_len` or `rank` in [1, hi] whose estimated peak fits `budget_mb`
    (the peak grows with both), or None when even 1 does not fit."""
    peak = estimate or (lambda s: estimate_peak(s, overhead_mb=overhead_mb).peak_mb)

    def fits(v: int) -> bool:
        return peak(replace(shape, **{field_name: v})) <= budget_mb

    if not fits(1):
        return None
    lo, top = 1, hi
    while lo < top:
        mid = (lo + top + 1) // 2
        lo, top = (mid, top) if fits(mid) else (lo, mid - 1)
    return lo
