"""ONNX target: every method of `method_specs(spec)` -> its own `onnx/<method>.onnx`.

No graph holds a weight: the frozen tensors (views of the app's memory-mapped weights.safetensors)
and the LoRA state are graph inputs, so each file is a few hundred KB whatever the model size, the
export time does not depend on the layer count, and there is no external-data file.

Pipeline per method:
  1. `torch.export.export(method_module(spec, name), example_inputs(method), strict=False)`, the
     same graph capture as the ExecuTorch target;
  2. `torch.onnx.export(ep, dynamo=True, opset_version=OPSET, optimize=False)`: ATen -> ONNX
     (onnxscript's translation), graph inputs/outputs named exactly as the method's IoSpecs;
  3. constant folding and dead-code removal only (`_optimize` says what of onnxscript's optimizer is
     left out, and why), identity `Transpose`s removed (`_drop_identity_transposes`), the exporter's
     stack traces (host paths) stripped;
  4. saved and checked with `onnx.checker` (full check, shape inference included); the graph's
     input/output names are checked against the MethodSpec.

Names: an ONNX graph is in SSA form, so one name cannot be both a graph input and a graph output;
the MethodSpecs never reuse one (state outputs are `<input>_out`, block_forward returns `x_out`,
the backward methods take `dout` and return `dx`), which `_check_names` asserts.

Why dynamo and not the TorchScript exporter: the TorchScript exporter is deprecated since torch
2.9 (it is ~6-8x faster on these small graphs, with a similar node count: 1283 vs 1496 nodes for a
small int4 block_backward before folding); dynamo shares torch.export's capture with ExecuTorch.

Opset: 20, pinned (torch 2.13's default for the dynamo exporter; ONNX Runtime >= 1.17 runs it, on
Linux, Android and iOS). The int4 nibble unpacking uses BitwiseAnd (opset >= 18).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from toolchain.contract import MethodSpec
from toolchain.export.bodies import example_inputs, method_module
from toolchain.program.artifact import TargetArtifact
from toolchain.program.spec import ProgramSpec, method_specs

__all__ = ["export_onnx", "ONNX_DIR", "OPSET", "FOLD_MAX_ELEMS", "MAX_INITIALIZER_BYTES"]

ONNX_DIR = "onnx"
OPSET = 20
# Constant folding keeps results of at most FOLD_MAX_ELEMS elements (RoPE tables at T=256, index
# constants); larger constants (the causal mask, `zeros_like` of a [T, d] activation: 0.9 MB at
# 0.5B, T=256) stay ops computed per call instead of initializers stored in the file and the session.
FOLD_MAX_ELEMS = 1 << 14
MAX_INITIALIZER_BYTES = 1 << 18  # a guard: nothing of a weight's size may ever be an initializer


def _to_onnx(spec: ProgramSpec, method: MethodSpec):
    """One method as an onnx_ir Model."""
    args = example_inputs(method)
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms" x4
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "training mode" and pytree deprecation chatter
            ep = torch.export.export(method_module(spec, method.name).eval(), args, strict=False)
            onx = torch.onnx.export(ep, args, dynamo=True, opset_version=OPSET,
                                    input_names=[i.name for i in method.inputs],
                                    output_names=[o.name for o in method.outputs], optimize=False,
                                    external_data=False, verbose=False)
    finally:
        registry_log.setLevel(level)
    model = onx.model
    _optimize(model)
    _drop_identity_transposes(model)
    for node in model.graph:
        node.metadata_props.clear()  # the exporter's stack traces (host paths): most of the file's size
    _check_names(model, method)
    big = [(n, v.const_value.nbytes) for n, v in model.graph.initializers.items()
           if v.const_value is not None and v.const_value.nbytes > MAX_INITIALIZER_BYTES]
    if big:
        raise RuntimeError(f"ONNX export of {method.name} produced large initializers {big[:3]}; "
                           f"weights must stay inputs")
    return model


def _check_names(model, method: MethodSpec) -> None:
    want_in, want_out = [i.name for i in method.inputs], [o.name for o in method.outputs]
    if set(want_in) & set(want_out):
        raise RuntimeError(f"{method.name}: names both input and output {sorted(set(want_in) & set(want_out))} "
                           f"(an ONNX graph cannot have them)")
    got_in, got_out = [v.name for v in model.graph.inputs], [v.name for v in model.graph.outputs]
    if got_in != want_in or got_out != want_out:
        raise RuntimeError(f"ONNX export of {method.name} changed its inputs/outputs: "
                           f"{got_in} -> {got_out}, expected {want_in} -> {want_out}")


def _drop_identity_transposes(model) -> None:
    """Remove `Transpose` nodes whose perm is the identity. The exporter's translation of advanced
    indexing (`embed[input_ids]`, `head[labels]`) emits one on the whole indexed tensor, and ONNX
    Runtime copies it: a 519 MiB transient per use with Qwen2.5-0.5B's [151936, 896] embedding (and,
    the tensor now being a graph input, an anonymous copy of a memory-mapped weight). One whose output
    is a graph output stays (it would need a rename; the exporter emits one on embed's [T, d] result)."""
    outputs = {id(v) for v in model.graph.outputs}
    dead = []
    for node in model.graph:
        perm = node.attributes.get("perm")
        if (node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and perm is not None
                and list(perm.as_ints()) == list(range(len(perm.as_ints()))) and id(node.outputs[0]) not in outputs):
            node.outputs[0].replace_all_uses_with(node.inputs[0])
            dead.append(node)
    model.graph.remove(dead, safe=True)


def _optimize(model) -> None:
    """Constant folding (only constants: every weight is a graph input) and clean-up:
    `onnxscript.optimizer.optimize_ir` without its pattern rewrites. Those include `x + 0 -> x`
    matched with math.isclose(c, 0, abs_tol=1e-8), which deletes AdamW's `+ eps` (eps = 1e-8): the
    denominator of a parameter with a zero gradient and zero moments becomes 0 / 0 = NaN (onnxscript
    0.7.2; what torch.onnx.export's `optimize=True` runs). Nor its common-subexpression elimination:
    the MeSP backward recomputes on purpose what it does not keep (the block from its checkpoint, per
    MLP chunk); merging equal subexpressions would extend tensors' lifetimes past the exported plan."""
    import onnx_ir.passes.common as common
    from onnx_ir.passes import Sequential
    from onnxscript.optimizer import fold_constants_ir

    for _ in range(2):
        if not fold_constants_ir(model, onnx_shape_inference=True, output_size_limit=FOLD_MAX_ELEMS).modified:
            break
    Sequential(common.RemoveUnusedNodesPass(), common.DeduplicateInitializersPass())(model)


def export_onnx(spec: ProgramSpec, out_dir: Path, *, on_stage=None) -> TargetArtifact:
    """Export every method to `out_dir/onnx/<method>.onnx` (the caller handles atomicity of the directory)."""
    import onnx
    import onnx_ir as ir

    note = on_stage or (lambda _s: None)
    root = Path(out_dir) / ONNX_DIR
    root.mkdir(parents=True, exist_ok=True)
    methods, nodes = {}, {}
    for name, method in method_specs(spec).items():
        if method.executorch_only:   # the fused (native kernels) and XNNPACK variants: ExecuTorch only
            continue
        note(f"torch.onnx.export {name}")
        model = _to_onnx(spec, method)
        nodes[name] = sum(1 for _ in model.graph)
        path = root / f"{name}.onnx"
        ir.save(model, path)
        note(f"onnx.checker {name}")
        onnx.checker.check_model(str(path), full_check=True)
        methods[name] = f"{ONNX_DIR}/{name}.onnx"
    return TargetArtifact("onnx", ONNX_DIR, methods=methods,
                          details={"opset": OPSET, "exporter": "torch.onnx.export(dynamo=True)", "nodes": nodes})
