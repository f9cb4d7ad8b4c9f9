"""Peak memory of a region of code, counted the way phones count it (Linux host stand-in).

Phones charge an app for its dirty anonymous memory (iOS `phys_footprint`, Android `RssAnon` /
"Private Dirty"); clean file-backed pages, such as memory-mapped frozen weights, are not counted.
Linux exposes the same split in `/proc/self/status`:

    peak_anon = VmHWM - RssFile - RssShmem

VmHWM is the resident high-water mark of all pages; writing "5" to `/proc/self/clear_refs` resets
it to the current RSS. File pages must be resident and stable across the measured region (run a
warm-up step first so every mapped weight page has been touched), otherwise the subtraction is
off by the pages that came or went; `Measurement.file_drift_bytes` reports that drift.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from toolchain.errors import BadInput

__all__ = ["MIB", "ProcStatus", "parse_status", "read_status", "reset_peak", "release_free_memory",
           "PHONE_LIKE_MALLOC_ENV", "Measurement", "measure_peak"]

MIB = 1024 * 1024  # "MB" in our tables is MiB (2**20 bytes), as iOS/Android tools print it

STATUS_PATH = Path("/proc/self/status")
CLEAR_REFS_PATH = Path("/proc/self/clear_refs")

_FIELDS = {"VmHWM": "vm_hwm", "VmRSS": "vm_rss", "RssAnon": "rss_anon", "RssFile": "rss_file",
           "RssShmem": "rss_shmem"}


class ProcStatus(NamedTuple):
    """The memory lines of a `/proc/<pid>/status`, in bytes."""

    vm_hwm: int     # peak resident set size since start or the last reset
    vm_rss: int     # resident set size = rss_anon + rss_file + rss_shmem
    rss_anon: int   # resident anonymous pages (heap, tensors): what phones charge
    rss_file: int   # resident file-backed pages (libraries, memory-mapped weights)
    rss_shmem: int  # resident shared memory

    @property
    def peak_anon(self) -> int:
        """VmHWM - RssFile - RssShmem: the anonymous part of the peak (file pages assumed stable)."""
        return self.vm_hwm - self.rss_file - self.rss_shmem


def parse_status(text: str) -> ProcStatus:
    """Parse the text of a `/proc/<pid>/status` file (values printed in kB).

    Raises:
        BadInput: a required line is missing (kernels before 4.5 lack RssAnon/RssFile/RssShmem).
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            number, _, unit = rest.strip().partition(" ")
            if unit.strip() != "kB":
                raise BadInput(f"/proc status line {line.strip()!r} is not in kB")
            values[_FIELDS[key]] = int(number) * 1024
    missing = [k for k, v in _FIELDS.items() if v not in values]
    if missing:
        raise BadInput(f"/proc status lacks {', '.join(missing)} (needs Linux >= 4.5)")
    return ProcStatus(**values)


def read_status(path: Path = STATUS_PATH) -> ProcStatus:
    try:
        return parse_status(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"{path} does not exist: measuring peak memory needs Linux /proc") from None


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0)."""
    try:
        CLEAR_REFS_PATH.write_text("5")
    except OSError as e:
        raise BadInput(f"cannot reset the peak RSS through {CLEAR_REFS_PATH} ({e.strerror}); "
                       "needs Linux /proc") from None


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def release_free_memory() -> None:
    """Give memory that glibc malloc keeps in its free lists back to the kernel (`malloc_trim(0)`).

    Called before a measured region so that freed-but-retained heap from earlier work does not
    hide in the baseline RSS. A no-op where malloc_trim does not exist (non-glibc).
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


# Environment for a process whose peak should reflect live memory, as on phones. glibc raises its
# mmap threshold dynamically (up to 32 MB) after large frees, so freed tensors then stay in the heap
# and the resident peak depends on how the heap fragmented: for one and the same MeSP step it
# varied between 70 and 200 MB from one step to the next. Phone allocators (iOS libmalloc's large
# allocations, Android scudo's secondary allocator) map large blocks individually and unmap them on
# free; a fixed threshold (which also turns the dynamic one off) makes glibc do the same. It must be
# set when the process starts: switching later leaves the fragmented heap in use. It costs page
# faults (about +20-30% CPU time on a Qwen2.5-0.5B step), so time is measured without it.
PHONE_LIKE_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


@dataclass
class Measurement:
    """What `measure_peak` saw (bytes). Filled when the `with` block exits."""

    start: ProcStatus | None = None
    end: ProcStatus | None = None

    @property
    def peak_anon_bytes(self) -> int:
        """Anonymous peak inside the region (absolute: includes what was resident before it)."""
        return self.end.peak_anon

    @property
    def anon_before_bytes(self) -> int:
        return self.start.rss_anon

    @property
    def anon_after_bytes(self) -> int:
        return self.end.rss_anon

    @property
    def file_drift_bytes(self) -> int:
        """RssFile at the end minus at the start; far from 0 means file pages were not stable."""
        return self.end.rss_file - self.start.rss_file


@contextlib.contextmanager
def measure_peak(*, trim: bool = True) -> Iterator[Measurement]:
    """Measure the peak anonymous memory of the `with` block.

    Args:
        trim: call `release_free_memory()` before resetting the high-water mark. Default: True.

    Yields:
        A `Measurement`, complete once the block has exited.
    """
    m = Measurement()
    if trim:
        release_free_memory()
    reset_peak()
    m.start = read_status()
    yield m
    m.end = read_status()
