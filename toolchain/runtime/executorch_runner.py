"""Host runner for the ExecuTorch program: the same C++ runtime the apps link, through its Python
bindings. Inputs are passed as they are (the program does not plan them): weights are views of the
memory-mapped weights file, state inputs views of the app's state array; nothing is copied in."""

from __future__ import annotations

from pathlib import Path

import torch

from toolchain.errors import BadInput

__all__ = ["ExecutorchRunner"]


class ExecutorchRunner:
    """`model.pte` with its methods loaded (each loaded once, then called by name)."""

    backend = "executorch"

    def __init__(self, pte: Path, method_names: list[str], *, threads: int | None = None) -> None:
        """threads: size of the runtime's thread pool (XNNPACK's threads); None keeps its default, one per
        core. The optimized (non-delegated) kernels run on one thread either way."""
        from executorch.runtime import Runtime

        if threads is not None:
            from executorch.extension.pybindings import portable_lib

            portable_lib._unsafe_reset_threadpool(threads)
        self.program = Runtime.get().load_program(Path(pte))
        missing = sorted(set(method_names) - set(self.program.method_names))
        if missing:
            raise BadInput(f"{pte} lacks method(s) {', '.join(missing)} listed in its manifest; re-export the program")
        self.methods = {name: self.program.load_method(name) for name in method_names}

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs are views of the planned arena, valid until the next call of ANY method: the Python
        bindings' `Program` shares one arena between its methods (the phones' `Module` does not), and
        `clone_outputs=False` skips the bindings' own copy. Callers copy what they keep (LayerLoop does),
        as the apps copy a method's outputs out of its arena."""
        return list(self.methods[method]._method.call(inputs, clone_outputs=False))
