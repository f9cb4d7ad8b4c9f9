"""ONNX target: `StepProgram` -> one `onnx/<method>.onnx` per method + one shared `onnx/weights.bin`.

Pipeline per method (each LCSB phase is one method):
  1. `torch.export.export(TrainMethod(program, phase_layers), example_inputs, strict=False)`, the same
     graph capture as the ExecuTorch target;
  2. `torch.onnx.export(..., dynamo=True, opset_version=OPSET, optimize=False)`: ATen -> ONNX
     (onnxscript's translation), then constant folding that never touches a frozen weight, and dead
     code removal (see `_optimize` for what of onnxscript's optimizer is left out, and why);
  3. frozen weights (initializers) moved to external data in ONE file shared by every method, written
     once per distinct tensor (identified by content), each large tensor at a 64 KiB-aligned offset;
  4. `<method>.onnx` saved (graph only, a few hundred KB) and checked with `onnx.checker` (full check,
     shape inference included, by path so that external data of any size is fine).

Why external data always (not only past the 2 GB protobuf limit): the weights file is what ONNX
Runtime memory-maps (clean file-backed pages, not counted by the phones' footprint metrics), and it
is shared by the LCSB phase methods, so k phases do not store the weights k times.

Names: graph inputs are exactly the manifest's (`input_ids`, `labels`, `lr`, then every state entry).
Graph outputs are `loss`, then `<entry name>` + OUTPUT_SUFFIX for each updated entry, in manifest
order: an ONNX graph is in SSA form, so one name cannot be both a graph input and a graph output
(the exporter would otherwise write a model `onnx.checker` rejects).

Opset: 20, pinned (torch 2.13's default for the dynamo exporter; ONNX Runtime >= 1.17 runs it, on
Linux, Android and iOS). The int4 nibble unpacking uses BitwiseAnd (opset >= 18) and Div.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path

import torch

from toolchain.export.artifact import TargetArtifact
from toolchain.export.program import StepProgram, TrainMethod, example_inputs, method_name

__all__ = ["export_onnx", "ONNX_DIR", "WEIGHTS_NAME", "OPSET", "OUTPUT_SUFFIX", "output_names"]

ONNX_DIR = "onnx"
WEIGHTS_NAME = "weights.bin"
OPSET = 20
OUTPUT_SUFFIX = "_out"  # the same suffix as the Core ML target (export/coreml.py)
_INLINE_BYTES = 1024          # initializers smaller than this stay inside the .onnx file
_ALIGN = 1 << 16              # offset alignment of large tensors (the largest common page/mapping granularity)
_ALIGN_FROM_BYTES = 1 << 16   # tensors at least this large are aligned (smaller ones packed at 64 bytes)


def output_names(program: StepProgram, phase_layers: tuple[int, ...] | None) -> list[str]:
    """Graph output names of a method: `loss`, then each updated state entry + OUTPUT_SUFFIX."""
    return ["loss"] + [e.name + OUTPUT_SUFFIX for e in program.updated_entries(phase_layers)]


class _SharedWeights:
    """Appends each distinct initializer once to one external-data file and points models at it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: dict[tuple, tuple[int, int]] = {}   # (dtype, shape, sha256) -> (offset, length)
        self.size = 0
        self.file = path.open("wb")

    def close(self) -> None:
        self.file.close()

    def externalize(self, model) -> None:
        """Replace the model's large initializers by references into the shared file."""
        import onnx_ir as ir

        for name, value in model.graph.initializers.items():
            tensor = value.const_value
            if tensor is None or tensor.nbytes < _INLINE_BYTES:
                continue
            data = tensor.tobytes()
            key = (tensor.dtype, tuple(tensor.shape), hashlib.sha256(data).hexdigest())
            if key not in self.offsets:
                self.offsets[key] = (self._append(data), len(data))
            offset, length = self.offsets[key]
            value.const_value = ir.ExternalTensor(WEIGHTS_NAME, offset, length, tensor.dtype, shape=tensor.shape,
                                                  name=name, base_dir=str(self.path.parent))
        self.file.flush()

    def _append(self, data: bytes) -> int:
        align = _ALIGN if len(data) >= _ALIGN_FROM_BYTES else 64
        offset = -(-self.size // align) * align
        if offset > self.size:
            self.file.write(b"\0" * (offset - self.size))
        self.file.write(data)
        self.size = offset + len(data)
        return offset


def _to_onnx(program: StepProgram, phase_layers: tuple[int, ...] | None, args: tuple):
    """One method as an onnx_ir Model (weights still in memory)."""
    in_names = ["input_ids", "labels", "lr"] + [e.name for e in program.layout]
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms" x4
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "training mode" and pytree deprecation chatter
            method = TrainMethod(program, phase_layers).eval()
            ep = torch.export.export(method, args, strict=False)
            onx = torch.onnx.export(ep, args, dynamo=True, opset_version=OPSET, input_names=in_names,
                                    output_names=output_names(program, phase_layers), optimize=False,
                                    external_data=False, verbose=False)
    finally:
        registry_log.setLevel(level)
    model = onx.model
    frozen = {f"program.{name}" for name, _ in program.named_buffers()}
    missing = frozen - set(model.graph.initializers)
    if missing:  # every frozen buffer is used by the step; a rename in the exporter would break the rule below
        raise RuntimeError(f"ONNX export lost frozen weight initializers: {sorted(missing)[:3]}")

    def should_fold(node) -> bool | None:
        # Never precompute anything from a frozen weight: folding would dequantize int4/int8 weights or
        # copy LM-head slices into new float32 initializers (at small sizes, under the folder's limits).
        return False if any(v is not None and v.name in frozen for v in node.inputs) else None

    _optimize(model, should_fold)
    _drop_identity_transposes(model)
    for node in model.graph:
        node.metadata_props.clear()  # the exporter's stack traces (host paths): most of the file's size
    return model


def _drop_identity_transposes(model) -> None:
    """Remove `Transpose` nodes whose perm is the identity. The exporter's translation of advanced
    indexing (`head[labels]`, the embedding lookup) emits one on the whole indexed tensor, and ONNX
    Runtime copies it: a 519 MiB transient per use with Qwen2.5-0.5B's [151936, 896] embedding."""
    outputs = {id(v) for v in model.graph.outputs}
    dead = []
    for node in model.graph:
        perm = node.attributes.get("perm")
        if (node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and perm is not None
                and list(perm.as_ints()) == list(range(len(perm.as_ints()))) and id(node.outputs[0]) not in outputs):
            node.outputs[0].replace_all_uses_with(node.inputs[0])
            dead.append(node)
    model.graph.remove(dead, safe=True)


def _optimize(model, should_fold) -> None:
    """Constant folding (guarded by `should_fold`) and clean-up: `onnxscript.optimizer.optimize_ir`
    without its pattern rewrites. Those include `x + 0 -> x` matched with math.isclose(c, 0,
    abs_tol=1e-8), which deletes AdamW's `+ eps` (eps = 1e-8): the denominator of a parameter with a
    zero gradient and zero moments becomes 0 / 0 = NaN (onnxscript 0.7.2; what torch.onnx.export's
    `optimize=True` runs). Nor its common-subexpression elimination: MeSP's recompute in backward is
    the same expression as the forward, and merging them would store the forward's activations.
    ONNX Runtime fuses what it can itself at session creation."""
    import onnx_ir.passes.common as common
    from onnx_ir.passes import Sequential
    from onnxscript.optimizer import fold_constants_ir

    for _ in range(2):
        if not fold_constants_ir(model, onnx_shape_inference=True, should_fold=should_fold).modified:
            break
    Sequential(common.RemoveUnusedNodesPass(), common.DeduplicateInitializersPass())(model)


def export_onnx(program: StepProgram, phases: list[tuple[int, ...]] | None, seq_len: int, out_dir: Path, *,
                on_stage=None) -> TargetArtifact:
    """Export every method to `out_dir/onnx/<method>.onnx`, weights in `out_dir/onnx/weights.bin`.

    Args:
        phases: LCSB phases (layers backpropagated by each phase method); None: one full-backprop method.
        on_stage: optional callback(stage_name) for progress reporting.
    """
    import onnx
    import onnx_ir as ir

    note = on_stage or (lambda _s: None)
    root = Path(out_dir) / ONNX_DIR
    root.mkdir(parents=True, exist_ok=True)
    args = example_inputs(program, seq_len)
    weights = _SharedWeights(root / WEIGHTS_NAME)
    methods = {}
    try:
        for k, layers in enumerate(phases or [None]):
            name = method_name(None if phases is None else k)
            note(f"torch.onnx.export {name}")
            model = _to_onnx(program, layers, args)
            weights.externalize(model)
            path = root / f"{name}.onnx"
            ir.save(model, path)
            note(f"onnx.checker {name}")
            onnx.checker.check_model(str(path), full_check=True)
            methods[name] = f"{ONNX_DIR}/{name}.onnx"
    finally:
        weights.close()
    return TargetArtifact("onnx", ONNX_DIR, methods=methods,
                          details={"opset": OPSET, "weights_file": f"{ONNX_DIR}/{WEIGHTS_NAME}",
                                   "output_suffix": OUTPUT_SUFFIX})
