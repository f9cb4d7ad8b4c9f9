"""FLOPs of one training step, counted from the ops it runs, and the host's float32 matmul rate at the
step's own matmul shapes: what turns a step time into GFLOP/s and a utilisation.

Count. The step runs once under `torch.utils.flop_counter.FlopCounterMode`, which sums the FLOPs of
every matmul-like aten op it dispatches (mm, addmm, bmm, baddbmm, convolution, SDPA): 2 m k n per
[m, k] x [k, n] product; elementwise work (norms, softmax, SwiGLU, dequantization) is not counted. For
MeSP that is forward + per-layer recompute + backward (tests/bench/test_flops.py checks it against the
closed form derived from the architecture). A `_GemmShapes` dispatch mode records, beside it, the shape
and operand layout of every mm/addmm/bmm/baddbmm call.

Rate. Every distinct recorded shape is timed with `torch.mm` / `torch.bmm` on random float32 operands of
the same layout (the minimum of a few calls, on the threads the benchmark runs with), and

    matmul rate at the step's shapes = sum over calls of FLOPs / sum over calls of the timed seconds,

i.e. the GFLOP/s the step would reach if it did nothing but its matmuls, each at this host's kernel
speed for that shape. utilisation = (step FLOPs / step seconds) / that rate: 1.0 means the step's time
is all necessary matmul time; the rest goes to elementwise ops, dequantization, copies, the runtime.
`utilisation_cpu` is the same with the step's process CPU seconds (a loaded host inflates wall time).
`peak_gflop_per_s` is the fastest single shape (the large frozen-weight GEMMs).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["GemmShape", "StepFlops", "MatmulRate", "count_step_flops", "matmul_rate", "flops_fields"]


class GemmShape(NamedTuple):
    """One matmul as the step ran it: batch x ([m, k] @ [k, n]); `a_t` / `b_t`: operand stored
    transposed (F.linear(x, W) is mm(x, W^T) with W [n, k] read in place)."""

    batch: int
    m: int
    k: int
    n: int
    a_t: bool
    b_t: bool

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n


class StepFlops(NamedTuple):
    total: int                      # FLOPs of one step (FlopCounterMode)
    by_op: dict[str, int]           # aten op -> FLOPs
    gemms: Counter                  # GemmShape -> calls


class MatmulRate(NamedTuple):
    gflop_per_s: float              # at the step's shapes (module docstring)
    peak_gflop_per_s: float         # the fastest single shape
    shapes: int                     # distinct shapes timed


def _transposed(t: torch.Tensor) -> bool:
    """A 2-D (or the last two dims of a batched) operand laid out as the transpose of a contiguous one."""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1


class _GemmShapes(TorchDispatchMode):
    """Records every mm / addmm / bmm / baddbmm call's GemmShape."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        aten = torch.ops.aten
        packet = func._overloadpacket
        if packet in (aten.mm, aten.bmm):
            a, b = args[0], args[1]
        elif packet in (aten.addmm, aten.baddbmm):
            a, b = args[1], args[2]
        else:
            a = b = None
        if a is not None:
            batch = a.shape[0] if a.dim() == 3 else 1
            self.calls[GemmShape(batch, a.shape[-2], a.shape[-1], b.shape[-1], _transposed(a), _transposed(b))] += 1
        return func(*args, **(kwargs or {}))


def count_step_flops(step: Callable[[], Any]) -> StepFlops:
    """Run `step()` once and count its FLOPs and matmul shapes (the step's own effects happen: pass
    a step on a throw-away adapter, or accept one extra update)."""
    counter = FlopCounterMode(display=False)
    shapes = _GemmShapes()
    with counter, shapes:
        step()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return StepFlops(int(counter.get_total_flops()), by_op, shapes.calls)


def _operand(batch: int, rows: int, cols: int, transposed: bool, gen: torch.Generator) -> torch.Tensor:
    shape = (cols, rows) if transposed else (rows, cols)
    t = torch.randn(((batch,) if batch > 1 else ()) + shape, generator=gen)
    return t.transpose(-1, -2) if transposed else t


def _seconds_per_call(g: GemmShape, gen: torch.Generator, min_s: float) -> float:
    a = _operand(g.batch, g.m, g.k, g.a_t, gen)
    b = _operand(g.batch, g.k, g.n, g.b_t, gen)
    out = torch.empty((g.batch, g.m, g.n) if g.batch > 1 else (g.m, g.n))
    mm = torch.bmm if g.batch > 1 else torch.mm
    mm(a, b, out=out)                                               # warm-up (packing buffers, caches)
    best, spent, calls = float("inf"), 0.0, 0
    while calls < 3 or (spent < min_s and calls < 200):
        t0 = time.perf_counter()
        mm(a, b, out=out)
        dt = time.perf_counter() - t0
        best, spent, calls = min(best, dt), spent + dt, calls + 1
    return best


def matmul_rate(gemms: Counter, *, min_s_per_shape: float = 0.02, seed: int = 0) -> MatmulRate:
    """Time every distinct shape of `gemms` (on the current torch threads) and weight by its calls.

    Raises:
        ValueError: no matmul was recorded.
    """
    if not gemms:
        raise ValueError("the step ran no matmul: nothing to measure a rate at")
    gen = torch.Generator().manual_seed(seed)
    flops = seconds = 0.0
    peak = 0.0
    with torch.no_grad():
        for g, calls in gemms.items():
            dt = _seconds_per_call(g, gen, min_s_per_shape)
            flops += g.flops * calls
            seconds += dt * calls
            peak = max(peak, g.flops / dt)
    return MatmulRate(flops / seconds / 1e9, peak / 1e9, len(gemms))


def flops_fields(flops: StepFlops, rate: MatmulRate, step_s: float, step_cpu_s: float, *,
                 counted_from: str) -> dict[str, Any]:
    """The per-mode fields of a bench_memory result row (names carry their units): the step as GFLOP per
    wall second and per process-CPU second (on a loaded host the CPU figure is the comparable one), each
    also as a fraction of the matmul rate at the step's shapes."""
    gflop = flops.total / 1e9
    wall = gflop / step_s if step_s > 0 else 0.0
    cpu = gflop / step_cpu_s if step_cpu_s > 0 else 0.0
    return {"step_gflop": round(gflop, 4), "gflop_per_s": round(wall, 2), "gflop_per_cpu_s": round(cpu, 2),
            "matmul_gflop_per_s": round(rate.gflop_per_s, 2), "matmul_peak_gflop_per_s": round(rate.peak_gflop_per_s, 2),
            "utilisation": round(wall / rate.gflop_per_s, 4), "utilisation_cpu": round(cpu / rate.gflop_per_s, 4),
            "flops_counted_from": counted_from}
