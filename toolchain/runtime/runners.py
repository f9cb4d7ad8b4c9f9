"""Pick the host runner for an exported program's target. Every runner has `backend` (its name) and
`execute(method, inputs) -> outputs`; ProgramDir.call_train_method turns that into a training step."""

from __future__ import annotations

from toolchain.errors import BadInput
from toolchain.runtime.program_dir import ProgramDir

__all__ = ["open_runner", "HOST_RUNNABLE"]

HOST_RUNNABLE = ("executorch", "onnx")  # Core ML predicts only on macOS


def open_runner(pdir: ProgramDir, target: str | None = None):
    """A runner for `target` (default: the first host-runnable program in the manifest)."""
    targets = pdir.targets
    if target is None:
        runnable = [t for t in targets if t in HOST_RUNNABLE]
        if not runnable:
            raise BadInput(f"{pdir.path} has no program this host can run ({', '.join(targets)}); "
                           f"export with --target executorch or onnx")
        target = runnable[0]
    if target not in targets:
        raise BadInput(f"{pdir.path} has no {target} program (it has {', '.join(targets)})")
    if target == "executorch":
        from toolchain.runtime.executorch_runner import ExecutorchRunner

        return ExecutorchRunner(pdir.program_file("executorch"), pdir.train_methods())
    if target == "onnx":
        from toolchain.runtime.onnx_runner import OnnxRunner

        return OnnxRunner(pdir)
    raise BadInput(f"{target} programs cannot run on this host (Core ML predicts only on macOS)")
