"""Host runner for the ExecuTorch program: the same C++ runtime the apps link, through its Python
bindings, driven exactly as an app drives it (ProgramDir.call_train_method does the state I/O)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["ExecutorchRunner", "run_executorch_step"]


class ExecutorchRunner:
    """`model.pte` with its train methods loaded (each loaded once, then called by name)."""

    backend = "executorch"

    def __init__(self, pte: Path, method_names: list[str]) -> None:
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(Path(pte))
        missing = sorted(set(method_names) - set(self.program.method_names))
        if missing:
            raise ValueError(f"{pte} lacks method(s) {', '.join(missing)} listed in its manifest")
        self.methods = {name: self.program.load_method(name) for name in method_names}

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # Outputs live in the method's planned arena and are overwritten by its next call: callers copy.
        return list(self.methods[method].execute([t.contiguous() for t in inputs]))


def run_executorch_step(program_dir: Path):
    """For `toolchain bench memory --modes executorch`: a callable(input_ids, labels) -> loss that
    runs one training step of the exported program (its first train method, manifest default lr),
    the state held as an app holds it."""
    from toolchain.runtime.program_dir import ProgramDir

    pdir = ProgramDir(Path(program_dir))
    runner = ExecutorchRunner(pdir.program_file("executorch"), pdir.train_methods())
    method = pdir.train_methods()[0]
    lr = pdir.manifest["optimizer"].get("default_lr", 1e-4)
    state = pdir.state_init()

    def step(input_ids: torch.Tensor, labels: torch.Tensor) -> float:
        return pdir.call_train_method(runner.execute, method, input_ids, labels, lr, state)

    step.program = pdir  # the bench reads seq_len / arch from it
    return step
