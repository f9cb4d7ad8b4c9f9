"""Exact live-tensor accounting for tests: the peak of bytes held by tensors created under the mode.

Every op's outputs are recorded by storage; a weakref finalizer on the storage subtracts its bytes
when the last tensor using it dies. So `peak_bytes` is the largest sum of live tensor storages at
any moment (what a perfect allocator would need; real processes add allocator slack). Tensors
that existed before entering the mode (weights, LoRA params) are not counted.
"""

from __future__ import annotations

import sys
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorPeak(TorchDispatchMode):
    def __init__(self, *, where: bool = False, phases: dict[str, str] | None = None):
        """Args: where: record the stack at the peak. phases: function name -> phase name; each
        allocation is charged to the phase of the outermost listed function on the stack, and
        `phase_peak_bytes[phase]` is the largest live total seen at an allocation in that phase."""
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase_peak_bytes: dict[str, int] = {}
        self._phases = phases or {}
        self.peak_where: list[str] = []   # the Python stack (toolchain frames) at the peak, if `where`
        self._where = where
        self._sizes: dict[int, int] = {}

    def _track(self, t: torch.Tensor, inputs: set[int]) -> None:
        st = t.untyped_storage()
        key, n = st.data_ptr(), st.nbytes()
        if n == 0 or key in self._sizes or key in inputs:
            return  # empty, already counted, or a view/in-place result of an input created outside the mode
        self._sizes[key] = n
        self.live_bytes += n
        weakref.finalize(st, self._free, key, n)
        if self._phases:
            frame, phase = sys._getframe(), None
            while frame is not None:
                phase, frame = self._phases.get(frame.f_code.co_name, phase), frame.f_back
            if phase is not None:
                self.phase_peak_bytes[phase] = max(self.phase_peak_bytes.get(phase, 0), self.live_bytes)
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            if self._where:
                self.peak_where = [f"{f.name}:{f.lineno} {f.line}" for f in traceback.extract_stack()
                                   if "toolchain" in f.filename]

    def _free(self, key: int, n: int) -> None:
        if self._sizes.pop(key, None) is not None:
            self.live_bytes -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, inputs)
        return out
