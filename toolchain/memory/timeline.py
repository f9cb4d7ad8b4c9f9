"""The tensor timeline of one decoder block's forward and backward, taken from the real step on meta tensors.

`block_timeline(arch, targets, mlp_chunk, dtype_bytes)` runs `toolchain.mesp.mesp_step` (public functions
only: `mesp_step`, the model's `random_weights`, `init_lora`) on a one-layer copy of the architecture with
`meta` tensors (shapes, no memory, no arithmetic) under `LiveTensors` (live.py), and keeps every allocation
and free made inside `block_forward` and inside `block_backward`: whatever the block does (a new model
family's q/k norms, another attention, another MLP) is in the timeline without a line here.

Sequence length T and LoRA rank r change the sizes of the block's tensors but not what it allocates and
frees, nor in which order (its loops run over heads and MLP column chunks, fixed by the architecture and
`mlp_chunk`). So the block is traced at two (T, r) points, chosen so that every dimension of every
allocation reads unambiguously as a constant, a multiple of T or a multiple of r (T1 / r1 != T2 / r2), and
the timeline becomes one table that gives the exact bytes at any (T, r) with a few numpy operations
(`BlockTimeline.peak`): the planner's binary searches over T and r evaluate it dozens of times at no cost.
A third trace checks the table: if the step's allocations ever depend on T or r otherwise (another loop
over T, a size switch, a T - 1), building the table fails loudly (`TimelineError`) instead of answering
wrongly.

Parts: each allocation is charged to the toolchain function that made it (`block_<op>`, from the file under
toolchain/mesp/ its innermost frame is in: block_attention, block_mlp, block_linear, block_rmsnorm, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import init_lora
from toolchain.memory.live import Allocation, LiveTensors
from toolchain.mesp.step import StepOptions, mesp_step
from toolchain.models.load import random_weights

__all__ = ["TimelineError", "BlockTimeline", "PhasePeak", "block_timeline", "TRACE_POINTS"]

_PHASES = {"block_forward": "forward", "block_backward": "backward"}
_DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}
# (T, r) of the two traces that solve the table, and of the one that checks it: no 1 (a dimension of 1 can
# make a transpose contiguous, so a copy would vanish), T1 / r1 != T2 / r2, all distinct.
TRACE_POINTS = ((5, 2), (11, 3))
CHECK_POINT = (7, 4)
_VOCAB = 64   # the traced copy's vocabulary: the loss is not part of the block timeline


class TimelineError(RuntimeError):
    """The block's allocations are not the same sequence at every (T, r), or not affine in them."""


@dataclass(frozen=True)
class PhasePeak:
    bytes: float                    # the largest live total over the phase, above what was live at its start
    parts: dict[str, float]         # bytes at that point by the function that allocated them


def _part(owner: str | None) -> str:
    if owner is None:
        return "block_other"
    stem, func = owner.split(".", 1)
    if stem != "block":
        return f"block_{stem}"
    for word in ("mlp", "attention"):
        if word in func:
            return f"block_{word}"
    return f"block_{func.strip('_').removeprefix('block_')}"


def _trace(arch, targets: tuple[str, ...], mlp_chunk: int | None, dtype: torch.dtype, t: int,
           rank: int) -> list[tuple[str, object]]:
    one = dataclasses.replace(arch, layers=1, vocab=_VOCAB)
    cfg = LoraConfig(rank=rank, alpha=float(rank), targets=targets)
    with torch.device("meta"):
        weights = random_weights(one, dtype=dtype)
        lora = init_lora(one, cfg, dtype=dtype)
        ids = torch.zeros(t, dtype=torch.long)
    mode = LiveTensors(phases=_PHASES, record=True, owner_root="toolchain/mesp/")
    options = StepOptions(loss_chunk=t, vocab_chunk=None, mlp_chunk=mlp_chunk)
    with torch.no_grad(), torch.device("meta"), mode:
        mesp_step(one, weights, cfg, lora, ids, ids, options=options, on_layer_grads=lambda i, g: None,
                  keep_grads=False)
    return mode.events


def _dims(shapes: list[tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """(c, a, b) per dimension, dim = c + a T + b r with one of them nonzero, from the shapes at TRACE_POINTS."""
    (t0, r0), (t1, r1) = TRACE_POINTS
    if len({len(s) for s in shapes}) != 1:
        raise TimelineError(f"an allocation's rank changes with T or r: {shapes}")
    out = []
    for d0, d1 in zip(*shapes):
        if d0 == d1:
            out.append((d0, 0, 0))
        elif d0 % t0 == 0 and d0 // t0 * t1 == d1:
            out.append((0, d0 // t0, 0))
        elif d0 % r0 == 0 and d0 // r0 * r1 == d1:
            out.append((0, 0, d0 // r0))
        else:
            raise TimelineError(f"a dimension is neither constant nor a multiple of T or r: {shapes}")
    return out


class BlockTimeline:
    """The block's forward and backward timelines as tables of monomials: allocation i holds
    scale[i] * T**t_power[i] * r**r_power[i] bytes (module docstring)."""

    def __init__(self, traces: list[list[tuple[str, object]]]) -> None:
        kinds = [[(kind, x.index if kind == "alloc" else x) for kind, x in ev] for ev in traces]
        if any(k != kinds[0] for k in kinds[1:]):
            raise TimelineError("the step allocates and frees a different sequence of tensors at different (T, r)")
        allocs = [[x for kind, x in ev if kind == "alloc"] for ev in traces]
        self._n = len(allocs[0])
        self._scale = np.zeros(self._n)
        self._t_power = np.zeros(self._n)
        self._r_power = np.zeros(self._n)
        self._part = np.zeros(self._n, dtype=np.int64)
        part_names: list[str] = []
        for i, group in enumerate(zip(*allocs)):
            first: Allocation = group[0]
            for a in group:
                if a.nbytes != a.itemsize * math.prod(a.shape):
                    raise TimelineError(f"{a.owner}: a storage of {a.nbytes} bytes for a tensor of shape {a.shape}")
            scale, tp, rp = first.itemsize, 0, 0
            for c, at, br in _dims([a.shape for a in group]):
                scale *= c or at or br
                tp, rp = tp + (at != 0), rp + (br != 0)
            self._scale[i], self._t_power[i], self._r_power[i] = scale, tp, rp
            name = _part(first.owner)
            if name not in part_names:
                part_names.append(name)
            self._part[i] = part_names.index(name)
        self.part_names = (*part_names, "block_freed_inputs")
        self._phases = {}
        phase_of = [a.phase for a in allocs[0]]
        events = kinds[0]
        for phase in set(_PHASES.values()):
            where = [k for k, (kind, i) in enumerate(events) if kind == "alloc" and phase_of[i] == phase]
            if not where:
                raise TimelineError(f"no allocation in the block's {phase}")
            span = events[where[0]:where[-1] + 1]
            index = np.array([i for _, i in span], dtype=np.int64)
            sign = np.array([1.0 if kind == "alloc" else -1.0 for kind, _ in span])
            # a free of a tensor made before the phase (none in today's block) lowers the total: its own part
            part = np.array([len(part_names) if kind == "free" and i < index[0] else self._part[i]
                             for kind, i in span], dtype=np.int64)
            self._phases[phase] = (sign * self._scale[index], self._t_power[index], self._r_power[index], part)

    def nbytes(self, t: int, rank: int) -> np.ndarray:
        """Bytes of every allocation at (T, r), in allocation order."""
        return self._scale * float(t) ** self._t_power * float(rank) ** self._r_power

    def peak(self, phase: str, t: int, rank: int) -> PhasePeak:
        """The phase's ("forward": `block_forward`, "backward": `block_backward`) largest live total above
        what was live when it started, and its parts."""
        scale, tp, rp, part = self._phases[phase]
        signed = scale * float(t) ** tp * float(rank) ** rp
        live = np.cumsum(signed)
        k = int(np.argmax(live))
        if live[k] <= 0:
            return PhasePeak(0.0, {})
        by_part = np.bincount(part[:k + 1], weights=signed[:k + 1], minlength=len(self.part_names))
        return PhasePeak(float(live[k]), {self.part_names[j]: float(v) for j, v in enumerate(by_part) if v})

    def check(self, trace: list[tuple[str, object]], point: tuple[int, int]) -> None:
        """Raises TimelineError unless `trace` (of the step at `point`) allocates what the table says."""
        got = np.array([x.nbytes for kind, x in trace if kind == "alloc"], dtype=np.float64)
        if len(got) != self._n or not np.array_equal(got, self.nbytes(*point)):
            raise TimelineError(f"the solved block timeline does not reproduce the step at (T, r) = {point}")


@functools.lru_cache(maxsize=64)
def block_timeline(arch, targets: tuple[str, ...], mlp_chunk: int | None, dtype_bytes: int = 4) -> BlockTimeline:
    """The block timeline of `arch` with LoRA on `targets` and MLP chunks of `mlp_chunk` columns (cached per
    process: three traces of a one-layer step, see docs/planner.md).

    Raises:
        TimelineError: the traces do not fit the affine model (module docstring).
    """
    if dtype_bytes not in _DTYPES:
        raise ValueError(f"dtype_bytes must be one of {sorted(_DTYPES)}, got {dtype_bytes}")
    dtype = _DTYPES[dtype_bytes]
    model = BlockTimeline([_trace(arch, targets, mlp_chunk, dtype, t, r) for t, r in TRACE_POINTS])
    model.check(_trace(arch, targets, mlp_chunk, dtype, *CHECK_POINT), CHECK_POINT)
    return model
