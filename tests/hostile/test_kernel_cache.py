"""The native kernel cache and the bus-error handler (tests/hostile/kernel_cases.py): a damaged cache entry is
rebuilt, what cannot be rebuilt away is one `Error:` line naming the cache path and how to clear it, and a bus
error names the file that faulted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kernel_cases import KCASES, KCase, good_build, run_kcase


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    try:
        lib = good_build()
    except Exception as e:   # noqa: BLE001 - no compiler here: nothing to cache
        pytest.skip(f"the kernel library cannot be built here ({e})")
    copy = tmp_path_factory.mktemp("good") / lib.parent.name / lib.name   # the key directory name kept
    copy.parent.mkdir()
    shutil.copy2(lib, copy)
    return copy


@pytest.mark.parametrize("case", KCASES, ids=[c.id for c in KCASES])
def test_kernel_cache_case(case: KCase, good: Path, tmp_path: Path, monkeypatch) -> None:
    got = run_kcase(case, good, tmp_path, monkeypatch)
    assert got.ok, f"{got.detail}\n{got.summary}"


def test_every_kernel_case_has_a_unique_id_and_each_class_two_cases() -> None:
    assert len({c.id for c in KCASES}) == len(KCASES)
    classes = {"truncated": ["kcache-truncated-half", "kcache-truncated-empty"],
               "another library": ["kcache-other-library", "kcache-other-library-2"],
               "a directory": ["kcache-dir-empty", "kcache-dir-full"],
               "record mismatch": ["kcache-record-mismatch", "kcache-record-garbage"],
               "SIGBUS on the kernel library": ["sigbus-kernel-library", "sigbus-kernel-library-weights-guarded"],
               "SIGBUS on a mapped data file": ["sigbus-weights", "sigbus-other-file"]}
    ids = {c.id for c in KCASES}
    assert all(set(v) <= ids for v in classes.values())
