"""Host runner for the ExecuTorch program: the same C++ runtime the apps link, through its Python
bindings, driven exactly as an app drives it (load every method first, then call by name)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["ExecutorchRunner"]


class ExecutorchRunner:
    """Load `model.pte` and all its methods. Loading a method (re)initializes the shared mutable
    state on this runtime, so every method is loaded up front, before the first train step."""

    def __init__(self, pte: Path, method_names: list[str]) -> None:
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(Path(pte))
        missing = sorted(set(method_names) - set(self.program.method_names))
        if missing:
            raise ValueError(f"{pte} lacks method(s) {', '.join(missing)} listed in its manifest")
        self.methods = {name: self.program.load_method(name) for name in method_names}

    def train_step(self, method: str, input_ids: torch.Tensor, labels: torch.Tensor, lr: float) -> float:
        out = self.methods[method].execute([input_ids, labels, torch.tensor([lr], dtype=torch.float32)])
        return float(out[0][0])

    def get_state(self) -> torch.Tensor:
        return self.methods["get_state"].execute([])[0].clone()

    def set_state(self, state: torch.Tensor) -> None:
        self.methods["set_state"].execute([state.to(torch.float32).contiguous()])
