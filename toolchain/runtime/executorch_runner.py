"""Host runner for the ExecuTorch program: the same C++ runtime the apps link, through its Python
bindings, driven exactly as an app drives it (load every method first, then call by name)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["ExecutorchRunner", "run_executorch_step"]


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


def run_executorch_step(program_dir: Path):
    """For `toolchain bench memory --modes executorch`: a callable(input_ids, labels) -> loss that
    runs one training step of the exported program (its first train method, manifest default lr),
    with every method loaded up front as an app does."""
    from toolchain.runtime.program_dir import ProgramDir

    pdir = ProgramDir(Path(program_dir))
    runner = ExecutorchRunner(pdir.program_file("executorch"), [m["name"] for m in pdir.manifest["methods"]])
    method = pdir.train_methods()[0]
    lr = pdir.manifest["optimizer"].get("default_lr", 1e-4)

    def step(input_ids: torch.Tensor, labels: torch.Tensor) -> float:
        return runner.train_step(method, input_ids, labels, lr)

    step.program = pdir  # the bench reads seq_len / arch from it
    return step
