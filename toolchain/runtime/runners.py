"""Pick the host runner for an exported program's target (export/targets.py says which can run here).
Every runner has `backend` (its name) and `execute(method, inputs) -> outputs`; runtime/loop.py's
LayerLoop turns that into training steps."""

from __future__ import annotations

from toolchain.errors import BadInput
from toolchain.export.targets import HOST_RUNNABLE
from toolchain.runtime.program_dir import ProgramDir

__all__ = ["open_runner", "HOST_RUNNABLE"]


def _executorch(pdir: ProgramDir, threads: int | None):
    from toolchain.runtime.executorch_runner import ExecutorchRunner

    return ExecutorchRunner(pdir.program_file("executorch"), list(pdir.info.methods), threads=threads)


def _onnx(pdir: ProgramDir, threads: int | None):
    from toolchain.runtime.onnx_runner import OnnxRunner

    return OnnxRunner(pdir, threads=threads)


_RUNNERS = {"executorch": _executorch, "onnx": _onnx}
assert set(_RUNNERS) == set(HOST_RUNNABLE), "every host-runnable target needs a runner"


def open_runner(pdir: ProgramDir, target: str | None = None, *, threads: int | None = None):
    """A runner for `target` (default: the first host-runnable program in the manifest)."""
    targets = pdir.targets
    if target is None:
        runnable = [t for t in targets if t in HOST_RUNNABLE]
        if not runnable:
            raise BadInput(f"{pdir.path} has no program this host can run ({', '.join(targets)}); "
                           f"export with --target {' or '.join(HOST_RUNNABLE)}")
        target = runnable[0]
    if target not in targets:
        raise BadInput(f"{pdir.path} has no {target} program (it has {', '.join(targets)})")
    if target not in _RUNNERS:
        raise BadInput(f"{target} programs cannot run on this host (Core ML predicts only on macOS)")
    return _RUNNERS[target](pdir, threads)
