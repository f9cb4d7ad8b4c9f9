"""Peak anonymous memory from /proc: parsing (a real Android /proc/<pid>/status), and on this host that
the peak inside a region is taken (an allocation freed before the region ends still counts), that a
known allocation is seen at its size, that the high-water mark is reset, and that memory-mapped
file pages are not counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from toolchain.errors import BadInput
from toolchain.memory.measure import MIB, measure_peak, parse_status, read_status

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "android-samples"
KNOWN_MB = 64


def _touch(t: torch.Tensor) -> float:
    return float(t.sum())  # reads every page


def test_parse_status_reads_a_real_android_status_file():
    path = SAMPLES / "proc-pid-status-android14plus-pixel7a-footos.txt"
    if not path.is_file():
        pytest.skip(f"{path} not available")
    s = parse_status(path.read_text())
    # Key values from the file (kB): VmHWM 524884, VmRSS 505536, RssAnon 114120, RssFile 363616, RssShmem 27800.
    assert (s.vm_hwm, s.vm_rss, s.rss_anon, s.rss_file, s.rss_shmem) == tuple(
        v * 1024 for v in (524884, 505536, 114120, 363616, 27800))
    assert s.vm_rss == s.rss_anon + s.rss_file + s.rss_shmem
    assert s.peak_anon == (524884 - 363616 - 27800) * 1024


def test_parse_status_without_the_rss_split_is_bad_input():
    with pytest.raises(BadInput, match="RssAnon"):
        parse_status("VmHWM:\t 100 kB\nVmRSS:\t 90 kB\n")


def test_read_status_of_this_process_adds_up():
    s = read_status()
    assert s.vm_rss == s.rss_anon + s.rss_file + s.rss_shmem
    assert s.vm_hwm >= s.vm_rss > 0


def test_a_known_allocation_is_seen_at_its_size_even_after_it_was_freed():
    # An anonymous mapping of its own, not a tensor: whether free() gives a tensor's pages back depends on
    # the heap this process built in earlier tests (a freed 64 MiB may be served from, and returned to, a
    # free chunk of glibc's heap), not on what is measured here.
    import mmap

    page = b"\1" * MIB
    with measure_peak() as m:
        block = mmap.mmap(-1, KNOWN_MB * MIB)
        for _ in range(KNOWN_MB):                                       # 64 MiB, every page written
            block.write(page)
        block.close()
    grew = (m.peak_anon_bytes - m.anon_before_bytes) / MIB
    assert KNOWN_MB - 1 <= grew <= KNOWN_MB + 6, grew
    assert (m.anon_after_bytes - m.anon_before_bytes) / MIB < 8  # it was freed: only the peak remembers it


def test_the_high_water_mark_is_reset_at_the_start_of_the_region():
    block = torch.ones(2 * KNOWN_MB * MIB // 4)  # a 128 MiB peak before the region
    _touch(block)
    del block
    with measure_peak() as m:
        small = torch.ones(MIB // 4)
        _touch(small)
    assert (m.peak_anon_bytes - m.anon_before_bytes) / MIB < 16


def test_memory_mapped_file_pages_are_not_counted(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(KNOWN_MB * MIB // 4)}, str(path))
    with measure_peak() as m:
        with safe_open(str(path), framework="pt") as f:
            w = f.get_tensor("w")     # a view of the file mapping: no anonymous copy
        total = _touch(w)
    assert total == KNOWN_MB * MIB // 4
    assert m.file_drift_bytes / MIB >= KNOWN_MB - 1                 # the pages came in as file pages...
    assert (m.peak_anon_bytes - m.anon_before_bytes) / MIB < 8      # ...and are not in the anonymous peak
    del w
