"""One small exported program (ONNX target: the quickest export) shared by the training tests."""

from __future__ import annotations

import pytest
import torch

from toolchain.text.dataset import DataRow
from toolchain.export.build import ExportSpec, export_program
from toolchain.lora import LoraConfig, init_lora
from toolchain.models import ModelArch, random_weights
from toolchain.optim import OptimizerConfig

ARCH = ModelArch(hidden=16, layers=3, heads=4, kv_heads=2, intermediate=24, vocab=40, max_positions=32)
CFG = LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "down_proj"))
SEQ_LEN = 12
OPTIMIZER = OptimizerConfig("adamw", lr=1e-2, weight_decay=0.01)


def examples(n: int, seed: int) -> list[DataRow]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, ARCH.vocab, (SEQ_LEN - i % 3,), generator=g)
        out.append(DataRow(ids, ids.clone()))
    return out


@pytest.fixture(scope="session")
def program(tmp_path_factory):
    """(program dir, frozen weights, starting adapter) of an AdamW program for ARCH."""
    weights = random_weights(ARCH, seed=0)
    lora = init_lora(ARCH, CFG, seed=1, zero_b=False)
    out = tmp_path_factory.mktemp("program") / "prog"
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=SEQ_LEN, optimizer=OPTIMIZER, targets=("onnx",),
                      default_lr=OPTIMIZER.lr)
    export_program(ARCH, weights, CFG, lora, spec, out)
    return out, weights, lora
