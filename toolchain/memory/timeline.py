"""The tensor timeline of one decoder block's forward and backward, taken from the real step on meta tensors.

`block_timeline(arch, targets, mlp_chunk, dtype_bytes)` runs `toolchain.mesp.mesp_step` (public functions
only: `mesp_step`, the model's `empty_weights`, `init_lora`) on a one-layer copy of the architecture with
`meta` tensors (shapes, no memory, no arithmetic) under `LiveTensors` (live.py), and keeps every allocation
and free made inside `block_forward` and inside `block_backward`: whatever the block does (a new model
family's q/k norms, another attention, another MLP) is in the timeline without a line here.

Sequence length T and LoRA rank r change the sizes of the block's tensors but not what it allocates and
frees, nor in which order (its loops run over heads and MLP column chunks, fixed by the architecture and
`mlp_chunk`). So the block is traced once, at sentinel values (T*, r*) = SENTINEL: two large primes that no
model dimension is a multiple of (meta tensors make a [T*, T*] tensor free). Every dimension of every
allocation then reads unambiguously as a constant or a multiple of T*, r* or both, each allocation's bytes
become a monomial c T^p r^q, and the timeline one table that gives the exact bytes at any (T, r) with a
few numpy operations (`BlockTimeline.peak`): the planner's binary searches over T and r evaluate it dozens
of times at no cost. The one assumption, that the block allocates the same sequence at every (T, r), is
checked by `BlockTimeline.check` against a trace at any other point (tests/memory/test_timeline.py does,
and against real tensors); a dimension that is not one of these (a T - 1), or a storage that is not its tensor's size,
fails loudly (`TimelineError`) instead of answering wrongly.

Parts: each allocation is charged to the toolchain function that made it (`block_<op>`, from the file under
toolchain/mesp/ its innermost frame is in: block_attention, block_mlp, block_swiglu, block_lora_linear,
block_rmsnorm, block_rope, ...).

Cost: one trace of a one-layer step, ~3,000 (0.5B) to ~5,500 (3B) meta ops, cached per process and
(architecture, targets, MLP chunk, dtype); the first meta op of a process also loads PyTorch's meta
kernels (see docs/planner.md for the timings).
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
from toolchain.models.source import empty_weights

__all__ = ["TimelineError", "BlockTimeline", "PhasePeak", "block_timeline", "SENTINEL"]

_PHASES = {"block_forward": "forward", "block_backward": "backward"}
_DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}
# (T*, r*) of the trace: primes that no model dimension (nor a product of them: a flattened [H, D]) is a
# multiple of; T* is above every constant a block allocates, so a [T*, T*] score tensor cannot be misread.
SENTINEL = (1_000_003, 65_537)
# A constant dimension at least this large is refused (loudly, not misread): it would be a T* - 1 or an
# r* - 1 read as a constant. The largest a block of Qwen2.5 or Llama 3 up to 72B / 70B allocates is the
# 29568-wide MLP of Qwen2.5-72B (with --mlp-chunk 0).
MAX_CONSTANT_DIM = 1 << 15
_VOCAB = 64   # the traced copy's vocabulary: the loss is not part of the block timeline


class TimelineError(RuntimeError):
    """The traced block does not fit the table: see the module docstring."""


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
        weights = empty_weights(one, dtype=dtype)
        lora = init_lora(one, cfg, dtype=dtype)
        ids = torch.zeros(t, dtype=torch.long)
    mode = LiveTensors(phases=_PHASES, record=True, owner_root="toolchain/mesp/")
    options = StepOptions(loss_chunk=t, vocab_chunk=None, mlp_chunk=mlp_chunk)
    with torch.no_grad(), torch.device("meta"), mode:
        mesp_step(one, weights, cfg, lora, ids, ids, options=options, on_layer_grads=lambda i, g: None,
                  keep_grads=False)
    return mode.events


def _monomial(shape: tuple[int, ...], point: tuple[int, int]) -> tuple[int, int, int]:
    """(c, p, q) with prod(shape) = c T^p r^q: each dimension traced at `point` = (T*, r*) read as a
    constant (below MAX_CONSTANT_DIM), or a multiple of T*, r* or T* r* (the sentinels are primes no model
    dimension is a multiple of)."""
    t, r = point
    c, p, q = 1, 0, 0
    for dim in shape:
        if dim % t == 0:
            dim, p = dim // t, p + 1
        if dim % r == 0:
            dim, q = dim // r, q + 1
        if dim % t == 0 or dim % r == 0:
            raise TimelineError(f"a dimension of {shape} holds T or r twice")
        if dim >= MAX_CONSTANT_DIM:
            raise TimelineError(f"a dimension of {shape} is neither a model constant nor a multiple of T or r")
        c *= dim
    return c, p, q


class BlockTimeline:
    """The block's forward and backward timelines as tables of monomials: allocation i holds
    scale[i] * T**t_power[i] * r**r_power[i] bytes (module docstring)."""

    def __init__(self, trace: list[tuple[str, object]], point: tuple[int, int] = SENTINEL) -> None:
        allocs: list[Allocation] = [x for kind, x in trace if kind == "alloc"]
        self._n = len(allocs)
        self._scale = np.zeros(self._n)
        self._t_power = np.zeros(self._n)
        self._r_power = np.zeros(self._n)
        part_of = np.zeros(self._n, dtype=np.int64)
        part_names: list[str] = []
        for i, a in enumerate(allocs):
            if a.nbytes != a.itemsize * math.prod(a.shape):
                raise TimelineError(f"{a.owner}: a storage of {a.nbytes} bytes for a tensor of shape {a.shape}")
            c, p, q = _monomial(a.shape, point)
            self._scale[i], self._t_power[i], self._r_power[i] = a.itemsize * c, p, q
            name = _part(a.owner)
            if name not in part_names:
                part_names.append(name)
            part_of[i] = part_names.index(name)
        self.part_names = (*part_names, "block_freed_inputs")
        self._phases = {}
        events = self._order = [(kind, x.index if kind == "alloc" else x) for kind, x in trace]
        for phase in sorted(set(_PHASES.values())):
            where = [k for k, (kind, i) in enumerate(events) if kind == "alloc" and allocs[i].phase == phase]
            if not where:
                raise TimelineError(f"no allocation in the block's {phase}")
            span = events[where[0]:where[-1] + 1]
            index = np.array([i for _, i in span], dtype=np.int64)
            sign = np.array([1.0 if kind == "alloc" else -1.0 for kind, _ in span])
            # a free of a tensor made before the phase (none in today's block) lowers the total: its own part
            part = np.array([len(part_names) if kind == "free" and i < index[0] else part_of[i]
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
        """Raises TimelineError unless `trace` (of the step at `point`) allocates and frees what the table says."""
        got = np.array([x.nbytes for kind, x in trace if kind == "alloc"], dtype=np.float64)
        order = [(kind, x.index if kind == "alloc" else x) for kind, x in trace]
        if len(got) != self._n or not np.array_equal(got, self.nbytes(*point)) or order != self._order:
            raise TimelineError(f"the solved block timeline does not reproduce the step at (T, r) = {point}")


@functools.lru_cache(maxsize=64)
def block_timeline(arch, targets: tuple[str, ...], mlp_chunk: int | None, dtype_bytes: int = 4) -> BlockTimeline:
    """The block timeline of `arch` with LoRA on `targets` and MLP chunks of `mlp_chunk` columns (cached per
    process: one trace of a one-layer step, see docs/planner.md).

    Raises:
        TimelineError: the traces do not fit the affine model (module docstring).
    """
    if dtype_bytes not in _DTYPES:
        raise ValueError(f"dtype_bytes must be one of {sorted(_DTYPES)}, got {dtype_bytes}")
    dtype = _DTYPES[dtype_bytes]
    return BlockTimeline(_trace(arch, targets, mlp_chunk, dtype, *SENTINEL))
