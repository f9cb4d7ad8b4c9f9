"""Pick the host runner for an exported program's target (export/targets.py says which can run here).
Every runner has `backend` (its name) and `execute(method, inputs) -> outputs`; runtime/loop.py's
LayerLoop turns that into training steps."""

from __future__ import annotations

from toolchain.errors import BadInput
from toolchain.export.program import ALL_ROLES, GENERATION_ROLES, TRAINING_ROLES
from toolchain.export.targets import HOST_RUNNABLE
from toolchain.runtime.program_dir import ProgramDir

__all__ = ["open_runner", "role_methods", "HOST_RUNNABLE"]


def _executorch(pdir: ProgramDir, threads: int | None, methods: list[str]):
    from toolchain.runtime.executorch_runner import ExecutorchRunner

    return ExecutorchRunner(pdir.program_file("executorch"), methods, threads=threads)


def _onnx(pdir: ProgramDir, threads: int | None, methods: list[str]):
    from toolchain.runtime.onnx_runner import OnnxRunner

    return OnnxRunner(pdir, threads=threads, methods=methods)


def _eager(pdir: ProgramDir, threads: int | None, methods: list[str]):
    from toolchain.runtime.eager_runner import EagerRunner

    return EagerRunner(pdir.info.spec, methods)


def role_methods(pdir: ProgramDir, use: str = "train") -> list[str]:
    """The methods a use loads: "train" (the training loop), "eval" (embed, block_forward, head_loss),
    "generate" (embed, block_forward for the prompt, the generation methods), "all"."""
    roles = {"train": TRAINING_ROLES, "eval": ("embed", "block_forward", "head_loss"),
             "generate": ("embed", "block_forward") + GENERATION_ROLES, "all": ALL_ROLES}[use]
    names = [n for n, m in pdir.info.methods.items() if m.role in roles]
    if use == "generate" and not any(pdir.info.methods[n].role == "block_decode" for n in names):
        raise BadInput(f"{pdir.path} was exported without the generation methods; re-export it without --no-generate")
    return names


_RUNNERS = {"executorch": _executorch, "onnx": _onnx}
assert set(_RUNNERS) == set(HOST_RUNNABLE), "every host-runnable target needs a runner"


def open_runner(pdir: ProgramDir, target: str | None = None, *, threads: int | None = None, use: str = "train"):
    """A runner for `target` (default: the first host-runnable program in the manifest; "eager": the
    program's methods run in PyTorch, the reference) with the methods of `use` loaded (`role_methods`:
    a training run does not load the generation methods, whose arenas it would otherwise pay for)."""
    methods = role_methods(pdir, use)
    if target == "eager":
        return _eager(pdir, threads, methods)
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
    return _RUNNERS[target](pdir, threads, methods)
