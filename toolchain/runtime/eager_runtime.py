"""The eager reference runtime: the program's own method modules run in PyTorch (no export), behind
the same `execute(method, inputs)` as the real runtimes, so `LayerLoop` drives all of them alike."""

from __future__ import annotations

import torch

from toolchain.export.bodies import method_module
from toolchain.program.spec import ProgramSpec, method_specs

__all__ = ["EagerRuntime"]


class EagerRuntime:
    backend = "eager"

    def __init__(self, spec: ProgramSpec, methods: list[str] | None = None) -> None:
        self.modules = {name: method_module(spec, name) for name in (method_specs(spec) if methods is None else methods)}

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            return list(self.modules[method](*inputs))
