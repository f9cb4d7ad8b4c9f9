"""Peak memory of one training step, by named parts: MeSP (`toolchain.mesp.step.mesp_step`), and the MeBP /
autograd baselines (`estimate_autograd.py`).

MeSP: the largest of the candidate peaks of the step, each the tensors held at that point plus a working set.
Notation: T seq_len, d hidden, V vocab, L layers, C loss_chunk tokens, Vc vocab_chunk, r rank.

Taken from the step itself (timeline.py): the working set of a decoder block, i.e. everything
`block_forward` and `block_backward` allocate and free, tensor by tensor, recorded by running the real step
on meta tensors (no memory, no arithmetic) and solved for T and r once per architecture, LoRA targets and
MLP chunking. Whatever a block does (a model family's q/k norms, bias or not, its attention and MLP) is
measured, not restated here; its parts are named by the op that allocated them (block_attention,
block_mlp, block_swiglu, block_lora_linear, block_rmsnorm, block_rope, ...).

Closed forms, where they are the fast bound (each is checked against the live tensors of the real step in
tests/memory/test_memory_estimate.py, overall and per phase, to 0.2%):
  the step's skeleton  which block inputs the forward keeps (every selected layer's, or each checkpoint
                       group's first), dout and the loss during a backward, the gradients held (one layer's
                       or, with grads="all", every selected layer's so far), LoRA parameters, optimizer
                       state, rope tables: a count over L layers, where tracing the whole step would run
                       L blocks (~2 x 10^5 meta ops at 3B: ~10 s; `plan fit` evaluates ~25 shapes).
                       These are the same for every model family: mesp_step's layer walk is family-free.
  loss (ce_online)     per token chunk either the vocabulary loop at A <- A a + p E_j (E[y], A, A a, p E_j,
                       the new A: 5 [C,d]; ONE [C,Vc] logits block; four [C,1] running vectors) or its end
                       (A, E[y], A / S, dh: 4 [C,d]), on top of the kept checkpoints, x and hn, the scaled dh
                       chunks done and the previous chunk's dh; or the final torch.cat. The loss runs
                       T/C x V/Vc vocabulary blocks (at T = 32k on 3B, ~2 x 10^5 meta ops per evaluation),
                       and its held part only grows with the chunk's start, so the last full chunk and the
                       last chunk are the candidates (`chunk_starts`).
  loss (ce_chunked)    (vocab_chunk None) as above with ONE [C,V] buffer per token chunk.
  final norm           the kept checkpoints, x, dh and four [T,d] temporaries of rmsnorm_backward.
  end                  every selected layer's gradients, when the step returns them (grads="all").
The loss and the final norm are shared by every model family (the LM head and the final RMSNorm).

Not modelled: dequantization transients of int8/int4 weights (eager `--quant`; `--program` memory plans
include them), the loss scalars of ce_chunked, allocator slack and the runtime itself: the caller passes
`overhead_mb` (calibrated against `toolchain bench memory`, see docs/planner.md), reported as its own
part. Frozen weights are not counted (memory-mapped clean pages, which the phones' footprint does not
count). MB = 2^20 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from toolchain.lora.config import ALL_TARGETS
from toolchain.memory.estimate_autograd import autograd_candidates
from toolchain.memory.shape import BYTES_PER_MB, METHODS, Parts, StepShape, lora_elems, state_parts
from toolchain.memory.timeline import block_timeline

__all__ = ["BYTES_PER_MB", "METHODS", "StepShape", "MemoryEstimate", "estimate_peak", "largest_fitting"]


@dataclass(frozen=True)
class MemoryEstimate:
    peak_mb: float                 # sum of parts_mb
    phase: str                     # where the peak is: "forward", "loss", "backward", ...
    layer: int | None              # the layer of a forward/backward peak
    parts_mb: dict[str, float]     # named parts of the peak (MB each)
    phases_mb: dict[str, float] = field(default_factory=dict)   # each phase's own peak

    def as_dict(self) -> dict:
        return {"peak_mb": self.peak_mb, "phase": self.phase, "layer": self.layer, "parts_mb": dict(self.parts_mb),
                "phases_mb": dict(self.phases_mb)}


def chunk_starts(t: int, chunk: int) -> list[int]:
    """Starts of the chunks that can hold a phase's peak: the held part grows with the start and
    the working set is equal for all full chunks, so the last full chunk and the last chunk."""
    last = (t - 1) // chunk * chunk
    last_full = (t // chunk - 1) * chunk
    return sorted({s for s in (last_full, last) if s >= 0})


def block_parts(s: StepShape, phase: str) -> Parts:
    """The block's forward ("forward") or backward ("backward") peak, as the real block allocates it
    (timeline.py), in elements by part, on top of what the step holds when the block starts (state,
    checkpoints x_0..x_i, dout)."""
    peak = block_timeline(s.arch, tuple(s.targets), s.mlp_chunk, s.dtype_bytes).peak(phase, s.seq_len, s.rank)
    return {name: n / s.dtype_bytes for name, n in peak.parts.items()}


def _plus(*parts: Parts) -> Parts:
    out: Parts = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _kept(s: StepShape) -> list[int]:
    """The layers whose input the forward keeps: each checkpoint group's first (every selected one when
    layers_per_checkpoint = 1)."""
    return [g[0] for g in s.groups()]


def _kept_below(s: StepShape, i: int) -> int:
    return sum(1 for j in _kept(s) if j < i)


def _forward_parts(s: StepShape, i: int, block: Parts) -> list[Parts]:
    """Layer i's forward: the block's traced peak on top of the state, the kept checkpoints below i
    and x_i (the block's input)."""
    return [_plus(state_parts(s, 0), {"checkpoints": (_kept_below(s, i) + 1) * s.seq_len * s.arch.hidden}, block)]


def _loss_base(s: StepShape) -> Parts:
    """Held through the loss: the checkpoints, x and hn, the shifted int64 [T] targets and N."""
    a, t = s.arch, s.seq_len
    return {**state_parts(s, 0), "checkpoints": len(_kept(s)) * t * a.hidden, "final_hidden": 2 * t * a.hidden,
            "loss_vectors": 8 * t / s.dtype_bytes + 1}


def _loss_chunked_parts(s: StepShape) -> list[Parts]:
    """`ce_chunked` (vocab_chunk None): one [C, V] buffer per token chunk."""
    a, t, e = s.arch, s.seq_len, s.dtype_bytes
    n_chunks = -(-t // s.loss_chunk)
    base = _loss_base(s)
    out = []
    for start in chunk_starts(t, s.loss_chunk):
        c = min(s.loss_chunk, t - start)
        # per chunk: valid (bool), tgt (int64), picked, max, sum, lse, weights [C]; the losses so far
        vectors = base["loss_vectors"] + c * (1 + 8) / e + 5 * c + start // s.loss_chunk + 1
        # the chunk's one [C, V] buffer (z, exp'd and turned into dz in place) while dz @ E is written
        out.append({**base, "hidden_grads": (start + c) * a.hidden, "loss_logits": c * a.vocab,
                    "loss_vectors": vectors})
    # torch.cat of the dh chunks (after the losses are stacked)
    out.append({**base, "hidden_grads": 2 * t * a.hidden, "loss_vectors": base["loss_vectors"] + n_chunks + 2})
    return out


def _loss_online_parts(s: StepShape) -> list[Parts]:
    """`ce_online`: token chunks of loss_chunk rows, each looping over [C, Vc] vocabulary blocks."""
    a, t, e, lc = s.arch, s.seq_len, s.dtype_bytes, s.loss_chunk
    d, vc = a.hidden, min(s.vocab_chunk, a.vocab)
    base = _loss_base(s)
    out = []
    for start in chunk_starts(t, lc):
        c, prev = min(lc, t - start), (lc if start else 0)
        # held: scaled dh of the chunks done, the previous chunk's dh, lse, z[y] and weights, the losses so far
        done = {"hidden_grads": start * d + prev * d}
        held = base["loss_vectors"] + 3 * prev + start // lc + c * (1 + 8) / e + c   # + valid, tgt, z[y] [C]
        # the vocabulary loop at A <- A a + p E_j: E[y], A, A a, p E_j, the new A [C, d]; the [C, Vc] block;
        # m, S, m', a [C, 1]
        out.append({**base, **done, "loss_rows": 5 * c * d, "loss_logits": c * vc, "loss_vectors": held + 4 * c})
        # its end: A, E[y], A / S and dh [C, d]; m, S, a, lse [C, 1]
        out.append({**base, **done, "loss_rows": 4 * c * d, "loss_vectors": held + 4 * c})
    # torch.cat of the dh chunks; the last chunk's dh, lse, z[y] and weights are still bound; the losses and their sum
    last = t - chunk_starts(t, lc)[-1]
    out.append({**base, "hidden_grads": 2 * t * d + last * d,
                "loss_vectors": base["loss_vectors"] + 3 * last + -(-t // lc) + 1})
    return out


def _final_norm_parts(s: StepShape) -> list[Parts]:
    """The final RMSNorm's backward: x, dh, and its [T, d] temporaries (xhat, g, two more)."""
    a, t = s.arch, s.seq_len
    return [{**state_parts(s, 0), "checkpoints": len(_kept(s)) * t * a.hidden, "final_hidden": 6 * t * a.hidden}]


def _backward_parts(s: StepShape, held: int, grads_above: float, block: Parts) -> list[Parts]:
    """A block's forward rerun or backward within a checkpoint group: the block's traced peak (with the
    gradients made so far) on top of the state, `held` [T, d] inputs (the kept checkpoints below the
    group, the group's inputs so far and the block's own input), dout and the loss []."""
    t, d = s.seq_len, s.arch.hidden
    return [_plus(state_parts(s, grads_above), {"checkpoints": held * t * d, "hidden_grads": t * d,
                                                "loss_vectors": 1}, block)]


def _mesp_candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    fwd, bwd = block_parts(s, "forward"), block_parts(s, "backward")
    out = [("forward", i, p) for i in range(s.arch.layers) for p in _forward_parts(s, i, fwd)]
    loss = _loss_chunked_parts(s) if s.vocab_chunk is None else _loss_online_parts(s)
    out += [("loss", None, p) for p in loss]
    out += [("final_norm", None, p) for p in _final_norm_parts(s)]
    per_layer = lora_elems(s, ALL_TARGETS)
    n_done = 0
    for group in reversed(s.groups()):
        below = _kept_below(s, group[0])
        grads_above = n_done * per_layer if s.grads == "all" else 0
        for j in range(group[0], group[-1]):   # the forward rerun up to the group's last layer
            held = below + sum(1 for m in group if m <= j) + (j not in group)
            out += [("recompute", j, p) for p in _backward_parts(s, held, grads_above, fwd)]
        for i in reversed(group):
            grads_above = n_done * per_layer if s.grads == "all" else 0
            held = below + sum(1 for m in group if m < i) + 1
            out += [("backward", i, p) for p in _backward_parts(s, held, grads_above, bwd)]
            n_done += 1
    if s.grads == "all":   # the step returns every selected layer's gradients
        out.append(("end", None, {**state_parts(s, len(s.selected()) * per_layer), "checkpoints": 0}))
    return out


def _candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    if s.method == "mesp":
        return _mesp_candidates(s)
    return autograd_candidates(s)


def estimate_peak(shape: StepShape, *, overhead_mb: float = 0.0) -> MemoryEstimate:
    """Peak memory of one training step of `shape.method`, with its breakdown.

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
