"""Fixtures of the native kernel tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def lib():
    """The loaded native library; the kernel path it had is restored afterwards."""
    from toolchain.mesp.kernels import load_native_kernels

    lib = load_native_kernels()
    before = lib.toolchain_kernel_path()
    yield lib
    assert lib.toolchain_select_kernel_path(before) == 0
