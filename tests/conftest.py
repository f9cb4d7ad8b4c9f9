"""Fixtures shared by the whole suite: seeded generators, random HF models, checkpoints on disk,
and the float64 HF + PEFT reference for the seeded whole-model cases (built once per session)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import helpers` from any test directory

from helpers import CaseData, Checkpoint, build_case, save_checkpoint, small_arch  # noqa: E402

from toolchain.models import ModelArch, get_preset  # noqa: E402


def pytest_configure(config) -> None:
    # The tensors here are tiny: intra-op threads only contend with each other (and with the other
    # processes on a 2-core machine), which made small steps ~30x slower. One thread, explicitly.
    torch.set_num_threads(1)
    # peft 0.21.2 calls a transformers 5 property that transformers deprecated; not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh generator with a fixed seed for each test."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def tiny_arch() -> ModelArch:
    return get_preset("tiny")


@pytest.fixture(scope="session")
def case_data() -> Callable[[int], CaseData]:
    """`case_data(seed)`: the seeded case and its reference, computed once per session."""
    store: dict[int, CaseData] = {}

    def get(seed: int) -> CaseData:
        if seed not in store:
            store[seed] = build_case(seed)
        return store[seed]

    return get


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def tmp_checkpoint(request, tmp_path) -> Checkpoint:
    """A small saved HF checkpoint, once with tied and once with untied embeddings."""
    return save_checkpoint(tmp_path / "ckpt", small_arch(tied=request.param))
