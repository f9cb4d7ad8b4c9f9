"""Core ML target: every method of `method_specs(spec)` -> one ML program
`coreml/<method>.mlpackage` (coremltools 9).

No package holds a weight: frozen tensors and the LoRA state are inputs, named as the method's
IoSpecs, in their order; outputs likewise (Core ML refuses a feature name used as both input and
output; the contract names the state outputs `<name>_out` already). Per method:
1. `torch.export` of `method_module(spec, name)` (integer weight inputs taken as int32, `_IntInputs`),
   then the rewrites coremltools needs: `_exact_reciprocal` (its `reciprocal` is 1 / (x + 1e-4)),
   `_mask_as_remainder` (its `bitwise_and` is boolean only; the int4 nibble unpacking uses `& 15`) and
   `_drop_aliases` (no converter for `aten.alias`);
2. coremltools' PyTorch frontend alone (no graph passes) -> MIL; int8/uint8 weight inputs retyped to
   int8 (`_int8_inputs`);
3. coremltools' default passes with float32 compute (docs/coreml.md says why: AdamW's moments
   underflow float16), constant folding limited to results of at most `FOLD_MAX_ELEMS` elements (the
   packages keep only small constants: RoPE tables, the causal mask), `skip_model_load` (Core ML
   predicts on Apple platforms only).

One package per method rather than one multifunction package (which coremltools 9.0 also builds on
Linux): with no weight inside, the functions would share only small constants, and a name -> file map
lets the app load just the methods it calls (docs/coreml.md).

Dtypes of the package inputs (`CORE_ML_DTYPES`): Core ML has no int64 inputs, so `input_ids` and
`labels` are int32 (the app passes int32); and no uint8 multi-arrays at all, int8 ones only from
iOS 26 / macOS 26 (MLMultiArrayDataType.int8; coremltools refuses int8 inputs below `iOS26`). So
`--quant none` packages target iOS 18, quantized ones iOS 26: int8 qweights are int8 inputs, int4
qweights (uint8 interleaved nibbles) are int8 inputs holding the same bytes (the app passes the mapped
bytes as `.int8`, no copy); the program reads each byte back as its unsigned value (`_IntInputs`).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor, nn

from toolchain.contract import MethodSpec
from toolchain.export.bodies import example_inputs, method_module
from toolchain.program.artifact import TargetArtifact
from toolchain.program.spec import ProgramSpec, method_specs

__all__ = ["export_coreml", "COREML_DIR", "CORE_ML_DTYPES", "EXPECTED_OPS", "FOLD_MAX_ELEMS", "deployment_target",
           "mil_op_histogram"]

COREML_DIR = "coreml"
FOLD_MAX_ELEMS = 1024   # constant folding keeps results up to 4 KB; larger ones stay ops
# manifest dtype -> dtype of the Core ML input (outputs are all float32)
CORE_ML_DTYPES = {"float32": "float32", "int64": "int32", "int8": "int8", "uint8": "int8"}

# Every MIL op the methods convert to (the test model, T=16: none/int8/int4, SGD/AdamW; the tiny preset,
# T=64, int4/AdamW; Qwen2.5-0.5B, T=256, none/AdamW and int4/SGD), checked by tests/export/test_coreml.py.
# All are ops of the iOS 15-18 MIL opsets (none custom); where each runs is Core ML's choice. `cos`/`sin`
# appear when the RoPE tables exceed FOLD_MAX_ELEMS, `floor_div` with int4. A new op here is a decision,
# not a formality.
EXPECTED_OPS = frozenset({
    "add", "cast", "clip", "concat", "const", "cos", "exp", "expand_dims", "floor_div", "gather", "greater_equal",
    "log", "matmul", "maximum", "mul", "not_equal", "pow", "real_div", "reduce_max", "reduce_mean", "reduce_sum",
    "reshape", "rsqrt", "select", "sigmoid", "silu", "sin", "slice_by_index", "softmax", "sqrt", "squeeze", "stack",
    "sub", "transpose",
})


def deployment_target(spec: ProgramSpec) -> str:
    """iOS18 (macOS 15) for float weights; iOS26 (macOS 26) when int8 weight inputs are needed."""
    return "iOS18" if spec.quant.kind == "none" else "iOS26"


def export_coreml(spec: ProgramSpec, out_dir: Path, *, on_stage=None) -> TargetArtifact:
    """Write `out_dir/coreml/<method>.mlpackage` for every method (the caller handles atomicity).

    Returns:
        The artifact; `details` (Core ML dtypes of the inputs, MIL op histogram per method, compute
        precision, deployment target) goes into the manifest's program entry.
    """
    import coremltools as ct

    note = on_stage or (lambda _s: None)
    (Path(out_dir) / COREML_DIR).mkdir(parents=True, exist_ok=True)
    methods, ops = {}, {}
    for name, method in method_specs(spec).items():
        if method.executorch_only:   # the fused (native kernels) and XNNPACK variants: ExecuTorch only
            continue
        note(f"coreml {name}: convert")
        model = _convert(spec, method)
        rel = f"{COREML_DIR}/{name}.mlpackage"
        model.save(str(Path(out_dir) / rel))
        # coremltools also writes an ExecuTorch debug-handle map beside the model; it is not an item of
        # the package (Manifest.json) and no runtime reads it
        (Path(out_dir) / rel / "executorch_debug_handle_mapping.json").unlink(missing_ok=True)
        methods[name] = rel
        ops[name] = mil_op_histogram(model._mil_program)
    used = {io.dtype for m in method_specs(spec).values() for io in m.inputs}
    details = {
        "coremltools_version": ct.__version__,
        "deployment_target": deployment_target(spec),
        "compute_precision": "float32",
        # inputs whose Core ML dtype differs from the manifest's (uint8: the same bytes, as int8)
        "input_dtypes": {d: c for d, c in CORE_ML_DTYPES.items() if d in used and d != c},
        "mil_ops": ops,
    }
    return TargetArtifact("coreml", COREML_DIR, methods=methods, details=details)


class _IntInputs(nn.Module):
    """The method with its int8/uint8 inputs taken as int32 (coremltools' PyTorch frontend has no
    8-bit inputs; `_int8_inputs` makes them int8 in the package). A uint8 input arrives as the int8
    reinterpretation of its bytes (Core ML has no uint8 arrays): `remainder(., 256)` is its value."""

    def __init__(self, method: nn.Module, spec: MethodSpec) -> None:
        super().__init__()
        self.method = method
        self.unsigned = [io.dtype == "uint8" for io in spec.inputs]

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return self.method(*(torch.remainder(x, 256) if u else x for x, u in zip(inputs, self.unsigned)))


def _convert(spec: ProgramSpec, method: MethodSpec):
    """One method -> MLModel (not loaded: Core ML predicts on Apple platforms only)."""
    import coremltools as ct
    import numpy as np

    args = tuple(x.to(torch.int32) if io.dtype in ("int8", "uint8") else x
                 for io, x in zip(method.inputs, example_inputs(method)))
    with torch.no_grad():
        ep = torch.export.export(_IntInputs(method_module(spec, method.name), method), args,
                                 strict=False).run_decompositions({})
    _exact_reciprocal(ep)
    _mask_as_remainder(ep)
    _drop_aliases(ep)
    inputs = [ct.TensorType(name=io.name, shape=io.shape, dtype=np.float32 if io.dtype == "float32" else np.int32)
              for io in method.inputs]
    outputs = [ct.TensorType(name=io.name, dtype=np.float32) for io in method.outputs]
    target = getattr(ct.target, deployment_target(spec))
    with _quiet():
        mil = ct.convert(ep, inputs=inputs, outputs=outputs, convert_to="milinternal", minimum_deployment_target=target,
                         compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline.EMPTY)
        _int8_inputs(mil, [io.name for io in method.inputs if CORE_ML_DTYPES[io.dtype] == "int8"])
        passes = ct.PassPipeline.DEFAULT
        passes.set_options("common::const_elimination", {"skip_const_by_size": str(FOLD_MAX_ELEMS)})
        return ct.convert(mil, convert_to="mlprogram", minimum_deployment_target=target,
                          compute_precision=ct.precision.FLOAT32, pass_pipeline=passes, skip_model_load=True)


def _int8_inputs(prog, names: list[str]) -> None:
    """Retype the int32 inputs `names` of the main function to int8, each followed by a cast to int32
    (exact: every int8 is an int32), so the app passes the weights file's 8-bit data as it is."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.scope import ScopeInfo

    func = prog.functions["main"]
    for name in names:
        var = func.inputs[name]
        var._sym_type = types.tensor(types.int8, var.sym_type.get_shape())
        first = var.child_ops[0]
        # the cast inherits its first reader's scopes (the torch.export provenance coremltools requires)
        with func, mb.scope(*[ScopeInfo(source=s, data=d) for s, d in first.scopes.items()]):
            wide = mb.cast(x=var, dtype="int32", before_op=func.operations[0], name=f"{name}_int32")
        func.replace_uses_of_var_after_op(anchor_op=wide.op, old_var=var, new_var=wide, force_replace=True,
                                          no_check_var_types=True)
    for t in func.input_types:
        if t.name in names:
            t.dtype = types.int8


def _exact_reciprocal(ep) -> int:
    """Rewrite `aten.reciprocal(x)` into `aten.div(full_like(x, 1), x)` in the exported graph; returns
    the count.

    coremltools converts `reciprocal` to MIL `inverse`, which computes 1 / (x + epsilon) with epsilon
    = 1e-4 by default: RoPE's inverse frequencies 1 / theta^(2i/d) came out 1e-4 too small, the cos/sin
    tables off by up to 1.4e-3 and the step's results by ~1e-5 relative. (Rewriting the MIL `inverse`
    instead is too late: the frontend has already folded the values downstream of it.)
    """
    aten = torch.ops.aten
    return _rewrite(ep, aten.reciprocal.default, lambda g, n: g.call_function(
        aten.div.Tensor, (g.call_function(aten.full_like.default, (n.args[0], 1.0)), n.args[0])))


def _mask_as_remainder(ep) -> int:
    """Rewrite `aten.bitwise_and(x, 2^k - 1)` on integers into `aten.remainder(x, 2^k)` (equal for every
    two's complement integer); returns the count. coremltools converts `bitwise_and` on booleans only;
    the int4 unpacking is `q & 15` (mesp/ops/quant.py)."""
    aten = torch.ops.aten

    def mask(g, n):
        m = n.args[1]
        if not isinstance(m, int) or m < 0 or (m + 1) & m:
            raise NotImplementedError(f"Core ML export: bitwise_and with {m!r} (only masks 2^k - 1 are rewritten)")
        return g.call_function(aten.remainder.Scalar, (n.args[0], m + 1))

    return _rewrite(ep, aten.bitwise_and.Scalar, mask)


def _drop_aliases(ep) -> int:
    """Remove `aten.alias` (a view of its input, the identity on values) from the exported graph;
    returns the count. The quantized backward has some, and coremltools has no converter for it."""
    aten = torch.ops.aten
    return _rewrite(ep, aten.alias.default, lambda g, n: n.args[0])


def _rewrite(ep, target, build) -> int:
    """Replace every call of `target` in the exported graph by `build(graph, node)`; returns the count."""
    graph = ep.graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == target:
            before = set(graph.nodes)
            with graph.inserting_before(node):
                new = build(graph, node)
            for made in set(graph.nodes) - before:  # the new nodes inherit the replaced one's metadata
                made.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            count += 1
    ep.graph_module.recompile()
    return count


def _operations(prog):
    def walk(block):
        for op in block.operations:
            yield op
            for b in op.blocks:
                yield from walk(b)

    for func in prog.functions.values():
        yield from walk(func)


def mil_op_histogram(prog) -> dict[str, int]:
    """{MIL op type: count} over every function and nested block of a MIL program."""
    return dict(sorted(Counter(op.op_type for op in _operations(prog)).items()))


@contextlib.contextmanager
def _quiet():
    """coremltools reports progress bars and pass notes on stderr; library code does not print."""
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
