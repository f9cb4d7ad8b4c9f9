"""The small programs the `--compute` tests (test_compute_fp16.py, test_compute_int8.py) export and train: one
builder for both (3 layers, T=16, int4 group 16, LoRA r4 on five targets; the width and the step options are the
test module's), used through the `export_computes` fixture (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from toolchain.export.build import ExportSpec, export_program
from toolchain.lora import LoraConfig, init_lora
from toolchain.models import ModelArch, random_weights
from toolchain.program import ProgramDir
from toolchain.program.spec import QuantSpec
from toolchain.text.dataset import DataRow
from toolchain.training import TrainRun, run_program

COMPUTE_T = 16
COMPUTE_CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"))


def compute_arch(hidden: int, intermediate: int) -> ModelArch:
    """The --compute tests' model: 3 layers, 4 heads / 2 kv heads, vocab 96, of this width."""
    return ModelArch(hidden=hidden, layers=3, heads=4, kv_heads=2, intermediate=intermediate, vocab=96,
                     max_positions=64)


class ComputePrograms:
    """One program directory per compute (`programs["fp32"]`), all of one model, and what the tests do with them."""

    def __init__(self, arch: ModelArch, paths: dict[str, Path]) -> None:
        self.arch, self.paths = arch, paths

    def __getitem__(self, compute: str) -> Path:
        return self.paths[compute]

    def rows(self, n: int, seed: int) -> list[DataRow]:
        """`n` seeded rows of T random ids, labels = inputs."""
        g = torch.Generator().manual_seed(seed)
        return [DataRow(ids, ids.clone())
                for ids in (torch.randint(0, self.arch.vocab, (COMPUTE_T,), generator=g) for _ in range(n))]

    def train(self, compute: str, runtime_of: Callable[[ProgramDir], object], rows: Sequence[DataRow], steps: int = 2,
              lr: float = 1e-2):
        """`steps` steps of the `compute` program on `runtime_of(its ProgramDir)` (the run's result)."""
        pdir = ProgramDir(self.paths[compute])
        return run_program(pdir, runtime_of(pdir), list(rows), TrainRun(steps=steps, lr=lr))


def export_computes_into(root: Path, arch: ModelArch, computes: Sequence[str], options=None) -> ComputePrograms:
    """The programs of `arch` exported under `root`, one per compute (seeded random weights and LoRA, LoRA B
    non-zero so the adapter matters)."""
    paths = {}
    for compute in computes:
        spec = ExportSpec(source="test", init="random", seed=3, seq_len=COMPUTE_T, quant=QuantSpec("int4", 16),
                          pad_token_id=0, compute=compute, **({} if options is None else {"options": options}))
        export_program(arch, random_weights(arch, seed=3), COMPUTE_CFG, init_lora(arch, COMPUTE_CFG, seed=4, zero_b=False),
                       spec, root / compute)
        paths[compute] = root / compute
    return ComputePrograms(arch, paths)
