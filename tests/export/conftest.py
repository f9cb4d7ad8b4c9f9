"""Fixtures of the export tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from compute_programs import ComputePrograms, export_computes_into


@pytest.fixture(scope="module")
def export_computes(tmp_path_factory) -> Callable[..., ComputePrograms]:
    """`export_computes(arch, computes, options=None)`: the `--compute` tests' programs of `arch`, one per compute,
    exported once into a directory of this module (compute_programs.py)."""
    return lambda arch, computes, options=None: export_computes_into(tmp_path_factory.mktemp("compute"), arch,
                                                                     computes, options)
