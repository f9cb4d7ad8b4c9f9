"""Live tensors of running code, counted by storage with a dispatch mode: what a perfect allocator would hold.

`LiveTensors` records every storage an op creates under the mode (a view or an in-place result shares
its input's storage and is not counted again; tensors that existed before entering the mode, such as
weights and LoRA parameters, are not counted, nor are views of them), and a weakref finalizer on the
storage marks its free when the last tensor using it dies (CPython reference counting, so a tensor dies
exactly where the code drops its last reference). It works on real tensors and on `meta` tensors (shapes
only: no memory, no arithmetic), which is how the estimator runs the real training step at 3B in a
fraction of a second per block (toolchain/memory/timeline.py).

Besides the peak, the mode can keep the whole timeline (`events`): each allocation with its shape, dtype,
storage bytes, the phase it belongs to (the outermost listed function on the Python stack) and the
toolchain function that made it; each free with the allocation it ends.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Allocation", "LiveTensors"]


@dataclass(frozen=True)
class Allocation:
    """One storage made under the mode: `index` (allocation order), `nbytes`, the shape and itemsize of the
    op output that made it, its phase (None outside every listed function) and `owner`, the innermost
    function of a file under `owner_root` on the stack (None if none)."""

    index: int
    nbytes: int
    shape: tuple[int, ...]
    itemsize: int
    phase: str | None
    owner: str | None


class LiveTensors(TorchDispatchMode):
    """Peak (and optionally the timeline) of the bytes held by tensors created under the mode.

    Args:
        phases: function name -> phase name; an allocation is charged to the phase of the outermost listed
            function on the stack, and `phase_peak_bytes[phase]` is the largest live total seen at an
            allocation in that phase.
        record: keep `events`: ("alloc", Allocation) and ("free", allocation index) in order.
        owner_root: a path fragment (e.g. "toolchain/mesp/"); with `record`, each allocation's `owner` is
            "<file stem>.<function>" of the innermost frame whose file contains it.
    """

    def __init__(self, *, phases: dict[str, str] | None = None, record: bool = False,
                 owner_root: str | None = None) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase_peak_bytes: dict[str, int] = {}
        self.events: list[tuple[str, object]] = []
        self._phases = phases or {}
        self._record = record
        self._owner_root = owner_root
        self._live: dict[int, tuple[int, int]] = {}   # storage key -> (bytes, allocation index)
        self._count = 0

    def _context(self) -> tuple[str | None, str | None]:
        frame, phase, owner = sys._getframe(), None, None
        while frame is not None:
            code = frame.f_code
            phase = self._phases.get(code.co_name, phase)
            if owner is None and self._owner_root and self._owner_root in code.co_filename:
                stem = code.co_filename.rsplit("/", 1)[-1].removesuffix(".py")
                owner = f"{stem}.{code.co_name}"
            frame = frame.f_back
        return phase, owner

    def _track(self, t: torch.Tensor, inputs: set[int]) -> None:
        st = t.untyped_storage()
        key, n = st._cdata, st.nbytes()
        if n == 0 or key in self._live or key in inputs:
            return  # empty, already counted, or a view/in-place result of an input
        index, self._count = self._count, self._count + 1
        self._live[key] = (n, index)
        self.live_bytes += n
        weakref.finalize(st, self._free, key)
        phase, owner = self._context() if (self._phases or self._record) else (None, None)
        if self._record:
            self.events.append(("alloc", Allocation(index, n, tuple(t.shape), t.element_size(), phase, owner)))
        if phase is not None:
            self.phase_peak_bytes[phase] = max(self.phase_peak_bytes.get(phase, 0), self.live_bytes)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.live_bytes -= entry[0]
            if self._record:
                self.events.append(("free", entry[1]))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))}
        out = func(*args, **kwargs)
        for t in _tensors(out):
            self._track(t, inputs)
        return out


def _tensors(obj):
    """The tensors in an op's arguments or results (nested tuples, lists and dicts): a lean tree_flatten."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)
