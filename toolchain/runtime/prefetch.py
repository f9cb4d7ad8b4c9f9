"""Ask the OS to read a layer's weight pages before the loop needs them: `madvise(MADV_WILLNEED)` over the
byte range of the memory-mapped weights file that holds one layer's tensors (the weights file keeps each layer's
tensors together, program/weights_file.py), issued one layer ahead in the layer loop (runtime/loop.py).

The frozen weights are clean file-backed pages; when the page cache cannot hold the whole file (a 7B model's
4.3 GB beside the apps of a 12 GB phone) the kernel evicts them and the next step faults them back in, one
page-fault readahead window at a time, while the method waits. WILLNEED starts the reads of the next layer
while the current one computes. Where the pages are resident it only walks the page cache (no I/O).
docs/benchmarks.md ("When the weights do not stay in memory") has the measurement; docs/android.md and
docs/ios.md say what the apps do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

from torch import Tensor

__all__ = ["MADV_WILLNEED", "LayerPrefetcher", "layer_ranges"]

MADV_WILLNEED = 3           # the same value on Linux, Android (bionic) and Darwin
_PAGE = mmap.PAGESIZE


def layer_ranges(weights: dict[str, Tensor], layers: int) -> dict[int | str, tuple[int, int]]:
    """Page-aligned (address, length) of every layer's weight tensors in the mapping (key `i`), and of the
    whole-model tensors (`"globals"`: embedding, final norm, LM head)."""
    spans: dict[int | str, list[int]] = {}
    for key, t in weights.items():
        what: int | str = int(key.split(".", 2)[1]) if key.startswith("layers.") else "globals"
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        span = spans.setdefault(what, [lo, hi])
        span[0], span[1] = min(span[0], lo), max(span[1], hi)
    out = {}
    for what, (lo, hi) in spans.items():
        start = lo - lo % _PAGE
        out[what] = (start, hi - start)
    missing = set(range(layers)) - set(out)
    if missing:
        raise ValueError(f"no weights of layer(s) {sorted(missing)[:3]} in the mapping")
    return out


class LayerPrefetcher:
    """`prefetch(layer)`: madvise(MADV_WILLNEED) over that layer's weight pages (or "globals"); a no-op where
    libc has no madvise (not Linux / Darwin). `calls` and `bytes` count what was asked."""

    def __init__(self, weights: dict[str, Tensor], layers: int) -> None:
        self.ranges = layer_ranges(weights, layers)
        self.calls = 0
        self.bytes = 0
        self._madvise = None
        if sys.platform.startswith("linux") or sys.platform == "darwin":
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            self._madvise = libc.madvise
            self._madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            self._madvise.restype = ctypes.c_int

    def __call__(self, what: int | str) -> None:
        span = self.ranges.get(what)
        if span is None or self._madvise is None:
            return
        # advice only: a failure (an old kernel, a range the OS refuses) changes nothing but the timing
        self._madvise(span[0], span[1], MADV_WILLNEED)
        self.calls += 1
        self.bytes += span[1]
