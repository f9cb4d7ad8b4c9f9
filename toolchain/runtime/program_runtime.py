"""Open the host runtime for an exported program's target (export/targets.py says which can run here).
Every runtime is a `ProgramRuntime`: `backend` (its name) and `execute(method, inputs) -> outputs`;
runtime/loop.py's LayerLoop turns that into training steps and generation."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from toolchain.contract import ALL_ROLES, GENERATION_ROLES, PREFERENCE_ROLES, TRAINING_ROLES
from toolchain.errors import BadInput
from toolchain.program.spec import XNNPACK_VARIANT
from toolchain.export.targets import HOST_RUNNABLE
from toolchain.program.directory import ProgramDir

if TYPE_CHECKING:
    import torch

__all__ = ["ProgramRuntime", "open_runtime", "role_methods", "check_signatures", "HOST_RUNNABLE"]


@runtime_checkable
class ProgramRuntime(Protocol):
    """Executes one method of a loaded program on one backend (`ExecuTorchRuntime`, `OnnxRuntime`,
    `EagerRuntime`; the apps' `ProgramRuntime` of the same name)."""

    backend: str

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]: ...


def _executorch(pdir: ProgramDir, threads: int | None, methods: list[str], verbose: bool):
    from toolchain.runtime.executorch_runtime import ExecuTorchRuntime

    try:
        runtime = ExecuTorchRuntime(pdir.program_file("executorch"), methods, threads=threads, verbose=verbose)
    except BadInput as e:
        if pdir.spec.compute != "fp16" or "cannot be loaded" not in str(e):
            raise
        # XNNPACK refuses to build a float16 GEMM it has no kernel for when the method loads (hardware without
        # float16 support, or a runtime built without it): the program cannot run here, whatever the input
        raise BadInput(f"{pdir.path} computes its frozen-weight matmuls in float16 (exported with --compute fp16) "
                       f"and this ExecuTorch runtime has no float16 kernels for them (its XNNPACK delegate did not "
                       f"load: {e}); re-export the program with --compute fp32") from None
    check_signatures(pdir, runtime.program, methods)
    return runtime


# ExecuTorch's ScalarType codes of the manifest's dtypes (executorch/runtime/core/portable_type/scalar_type.h).
_SCALAR_TYPES = {"uint8": 0, "int8": 1, "int64": 4, "float32": 6}


def check_signatures(pdir: ProgramDir, program, methods: list[str]) -> None:
    """Each loaded method of the .pte takes and returns what the manifest says (count, shapes, dtypes), so a
    .pte of another program (its checksum forged) is one BadInput here, not `set_inputs() ... 0x10` at the
    first call. `program` is the runtime's loaded Program (`metadata(name)` -> MethodMeta)."""
    pte = pdir.program_file("executorch")
    for name in methods:
        spec, meta = pdir.methods[name], program.metadata(name)
        for what, ios, count, tensor_meta in (("inputs", spec.inputs, meta.num_inputs(), meta.input_tensor_meta),
                                              ("outputs", spec.outputs, meta.num_outputs(), meta.output_tensor_meta)):
            if count != len(ios):
                raise BadInput(f"{pte}: method {name} has {count} {what}, the manifest lists {len(ios)}: the .pte is "
                               f"not this program's; re-export the program")
            for i, io in enumerate(ios):
                t = tensor_meta(i)
                shape, dtype = tuple(t.sizes()), int(t.dtype())
                if shape != tuple(io.shape) or dtype != _SCALAR_TYPES.get(io.dtype, dtype):
                    raise BadInput(f"{pte}: method {name}'s {what[:-1]} {io.name} is {list(shape)} (dtype code "
                                   f"{dtype}), the manifest says {list(io.shape)} {io.dtype}: the .pte is not this "
                                   f"program's; re-export the program")


def _onnx(pdir: ProgramDir, threads: int | None, methods: list[str], verbose: bool):
    from toolchain.runtime.onnx_runtime import OnnxRuntime

    return OnnxRuntime(pdir, threads=threads, methods=methods)


def _eager(pdir: ProgramDir, threads: int | None, methods: list[str], verbose: bool):
    from toolchain.runtime.eager_runtime import EagerRuntime

    return EagerRuntime(pdir.spec, methods)


def role_methods(pdir: ProgramDir, use: str = "train", *, fused: bool = False, xnnpack: bool = False) -> list[str]:
    """The methods a use loads: "train" (the training loop), "eval" (embed, block_forward, head_loss),
    "generate" (the generation methods), "all". `fused`: the fused generation methods replace their stock
    ones (the runtime has the native kernel); otherwise no method that needs a custom kernel is loaded.
    `xnnpack` (not with `fused`): the XNNPACK generation variant's methods (every layer's) replace theirs."""
    if fused and xnnpack:
        raise ValueError("one generation variant: fused or xnnpack")
    roles = {"train": TRAINING_ROLES + PREFERENCE_ROLES, "eval": ("embed", "block_forward", "head_loss"),
             "generate": GENERATION_ROLES, "all": ALL_ROLES}[use]
    methods = pdir.methods
    fused_roles = {m.role for m in methods.values() if _fused_variant(m)} if fused else set()
    xnn_roles = {m.role for m in methods.values() if m.variant == XNNPACK_VARIANT} if xnnpack else set()

    def wanted(m) -> bool:
        if m.variant is not None:
            return m.variant == XNNPACK_VARIANT and m.role in xnn_roles
        if _fused_variant(m):
            return m.role in fused_roles
        return m.role not in fused_roles | xnn_roles

    names = [n for n, m in methods.items() if m.role in roles and wanted(m)]
    if use == "generate" and not any(methods[n].role == "block_decode" for n in names):
        raise BadInput(f"{pdir.path} was exported without the generation methods; re-export it without --no-generate")
    return names


def _fused_variant(m) -> bool:
    """A generation method's fused variant (it has a stock twin); the training methods of a `--compute int8`
    program list kernels too, and have none."""
    return bool(m.kernels) and m.role in GENERATION_ROLES


def _check_int8_kernels(pdir: ProgramDir, methods: list[str]) -> None:
    """A `--compute int8` program's training methods call the native kernels and have no float32 twin: without
    the kernels registered here (or with $TOOLCHAIN_NATIVE_KERNELS=0) it is one BadInput naming what is missing."""
    needs = [n for n in methods if pdir.methods[n].kernels and pdir.methods[n].role not in GENERATION_ROLES]
    if not needs:
        return
    kernels = sorted({k for n in needs for k in pdir.methods[n].kernels})
    if os.environ.get("TOOLCHAIN_NATIVE_KERNELS", "1") == "0":
        why = "$TOOLCHAIN_NATIVE_KERNELS is 0"
    else:
        why = _native_kernels()
    if why is not None:
        raise BadInput(f"{pdir.path} computes its frozen-weight matmuls in int8 (exported with --compute int8): its "
                       f"methods {', '.join(needs)} call the native kernels {', '.join(kernels)}, which this runtime "
                       f"does not have ({why}); run it where toolchain/native/kernels.cpp builds, or re-export the "
                       f"program with --compute fp32")


def _native_kernels() -> str | None:
    """None when the native kernels are registered with the ExecuTorch runtime here, else why not. (A
    program's fused methods call exactly these: `ProgramDir` refuses a program whose method list, kernels
    included, is not this toolchain's.)"""
    from toolchain.native import KernelUnavailable, load_kernels

    try:
        load_kernels()
    except KernelUnavailable as e:
        if os.environ.get("TOOLCHAIN_KERNEL_PATH"):
            raise                      # a forced kernel path this CPU lacks: an error, not the stock methods
        return str(e)
    return None


_RUNTIMES = {"executorch": _executorch, "onnx": _onnx}
assert set(_RUNTIMES) == set(HOST_RUNNABLE), "every host-runnable target needs a runtime"


def open_runtime(pdir: ProgramDir, target: str | None = None, *, threads: int | None = None, use: str = "train",
                 fused: bool | None = None, verbose: bool = False, xnnpack: bool | None = None) -> ProgramRuntime:
    """A runtime for `target` (default: the first host-runnable program in the manifest; "eager": the
    program's methods run in PyTorch, the reference) with the methods of `use` loaded (`role_methods`:
    a training run does not load the generation methods, whose arenas it would otherwise pay for).

    Generation on ExecuTorch loads the fused methods (`generate.fused`) when the native kernel builds and
    loads here (`fused` None), unless `fused` is False or $TOOLCHAIN_NATIVE_KERNELS is 0; otherwise the stock ones, and the runtime's `fused_unavailable` says why
    they were wanted but not loaded. The eager runtime runs the stock methods unless `fused` is True (then
    the fused ones, on the PyTorch reference of their kernel). `verbose`: the runtime's native log lines are
    shown (`toolchain --verbose`; ExecuTorch's runtime hides them otherwise).

    Where the fused methods are not loaded and the program has the XNNPACK generation variant
    (`export --xnnpack-generation`), ExecuTorch generation loads it instead of the stock methods, unless
    `xnnpack` is False or $TOOLCHAIN_XNNPACK_GENERATION is 0: fused > xnnpack > stock. The runtime's
    `generation_variant` says which ("fused", "xnnpack" or "stock")."""
    if target == "eager":
        methods = role_methods(pdir, use, fused=fused is True and use in ("generate", "all"))
        return _loaded(_eager(pdir, threads, methods, verbose), methods, None, "fused" if fused is True else "stock")
    targets = pdir.targets
    if target is None:
        runnable = [t for t in targets if t in HOST_RUNNABLE]
        if not runnable:
            raise BadInput(f"{pdir.path} has no program this host can run ({', '.join(targets)}); "
                           f"export with --target {' or '.join(HOST_RUNNABLE)}")
        target = runnable[0]
    if target not in targets:
        raise BadInput(f"{pdir.path} has no {target} program (it has {', '.join(targets)})")
    if target not in _RUNTIMES:
        raise BadInput(f"{target} programs cannot run on this host (Core ML predicts only on macOS)")
    allowed = fused is not False and os.environ.get("TOOLCHAIN_NATIVE_KERNELS", "1") != "0"
    wants_fused = (allowed and use in ("generate", "all") and target == "executorch"
                   and any(_fused_variant(m) for m in pdir.methods.values()))
    why_not = _native_kernels() if wants_fused else None
    use_fused = wants_fused and why_not is None
    use_xnnpack = (not use_fused and xnnpack is not False and use in ("generate", "all") and target == "executorch"
                   and os.environ.get("TOOLCHAIN_XNNPACK_GENERATION", "1") != "0"
                   and any(m.variant == XNNPACK_VARIANT for m in pdir.methods.values()))
    methods = role_methods(pdir, use, fused=use_fused, xnnpack=use_xnnpack)
    if target == "executorch":
        _check_int8_kernels(pdir, methods)
    variant = "fused" if use_fused else "xnnpack" if use_xnnpack else "stock"
    return _loaded(_RUNTIMES[target](pdir, threads, methods, verbose), methods, why_not, variant)


def _loaded(runtime: ProgramRuntime, methods: list[str], fused_unavailable: str | None,
            variant: str = "stock") -> ProgramRuntime:
    runtime.methods_loaded = tuple(methods)          # runtime/generate.py picks the fused names from these
    runtime.fused_unavailable = fused_unavailable
    runtime.generation_variant = variant
    return runtime
