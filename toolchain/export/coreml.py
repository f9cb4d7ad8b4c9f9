"""Core ML target: `StepProgram` -> one ML program `.mlpackage` per train method (coremltools 9).

Per method:
1. float twin: with `--quant int8|int4` the frozen projection weights are dequantized on the host
   (`mesp.ops.quant.dense`: exactly the values the in-graph dequantization computes);
2. `torch.export` of `TrainMethod(twin, phase_layers)` with `example_inputs`, then
   `_exact_reciprocal` (coremltools converts `reciprocal` to `1 / (x + 1e-4)`);
3. coremltools' PyTorch frontend alone (no graph passes) -> MIL, then `_untranspose_weights` (the
   frontend turns `dy @ W`, W constant, into `linear(dy, transpose(W))`, which constant folding would
   store as a second, transposed copy of every backpropagated weight);
4. coremltools' default passes with float32 compute (docs/coreml.md says why), constant folding
   limited to results of at most `FOLD_MAX_ELEMS` elements (each vocabulary chunk of the LM head would
   otherwise become a constant: a second copy of the head), and with `--quant` first
   `compression::linear_quantize_weights` on the projection weights: symmetric, per block of
   `[1, group]` (scale = max|w| / 7 or / 127 per group of input columns, as ours). Re-quantizing our
   dequantized grid gives back our q and scales, so the weights are stored as 4/8-bit constexprs that
   decompress to the very values the other targets use.

The LoRA/optimizer state is float32 inputs/outputs like every target (no Core ML states: those are
float16). Core ML refuses a feature name used as both input and output, so the output of state entry
`x` is named `x_out`; the manifest's program entry maps each output to its `entry`.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from pathlib import Path

import torch

from toolchain.errors import BadInput
from toolchain.export.artifact import TargetArtifact
from toolchain.export.program import (QUANTIZED_FIELDS, QuantSpec, StepProgram, TrainMethod, example_inputs,
                                      method_name)
from toolchain.mesp.ops.quant import dense
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["export_coreml", "COREML_DIR", "OUTPUT_SUFFIX", "DEPLOYMENT_TARGET", "EXPECTED_OPS", "FOLD_MAX_ELEMS",
           "mil_op_histogram"]

COREML_DIR = "coreml"
OUTPUT_SUFFIX = "_out"        # Core ML feature names are unique across inputs and outputs
DEPLOYMENT_TARGET = "iOS18"   # per-block int4/int8 weights (constexpr_blockwise_shift_scale) need iOS 18
FOLD_MAX_ELEMS = 1024         # constant folding keeps results up to 4 KB; larger ones stay ops

# Every MIL op the step converts to (the test model; tiny, T=64; Qwen2.5-0.5B int4, T=256), checked by
# tests/export/test_coreml.py. All are ops of the iOS 15-18 MIL opsets (none custom); where each runs is
# Core ML's choice (docs/coreml.md: int32 index math, float32 compute keeps the Neural Engine out). `cos`/`sin` appear
# when the RoPE tables exceed FOLD_MAX_ELEMS. A new op here is a decision, not a formality.
EXPECTED_OPS = frozenset({
    "add", "cast", "clip", "concat", "const", "constexpr_blockwise_shift_scale", "cos", "exp", "expand_dims",
    "gather", "greater_equal", "log", "matmul", "maximum", "mul", "not_equal", "pow", "real_div", "reduce_max",
    "reduce_mean", "reduce_sum", "reshape", "rsqrt", "select", "sigmoid", "silu", "sin", "slice_by_index",
    "softmax", "sqrt", "squeeze", "stack", "sub", "transpose",
})


def export_coreml(program: StepProgram, phases: list[tuple[int, ...]] | None, seq_len: int, out_dir: Path, *,
                  quant: QuantSpec, on_stage=None) -> TargetArtifact:
    """Write `out_dir/coreml/<method>.mlpackage` for every train method.

    Args:
        program: the step program (its frozen weights may be quantized; see the module docstring).
        phases: LCSB phases (layers backpropagated by each phase method); None: one full-backprop method.
        seq_len: T of the inputs.
        quant: `program.quant`; none, or the group-wise format to store the projection weights in.
        on_stage: optional callback(stage_name) for progress reporting.

    Returns:
        The artifact; `details` (inputs, outputs, states, MIL op histogram per method, compute precision,
        compression, deployment target) goes into the manifest's program entry.
    """
    import coremltools as ct

    if quant != program.quant:
        raise BadInput(f"Core ML export asked for {quant.kind} weights of a {program.quant.kind} program; "
                       "pass the program's own QuantSpec")
    note = on_stage or (lambda _s: None)
    twin = _float_twin(program)
    (Path(out_dir) / COREML_DIR).mkdir(parents=True, exist_ok=True)
    methods, ops, outputs = {}, {}, {}
    for k, layers in enumerate(phases or [None]):
        name = method_name(None if phases is None else k)
        note(f"coreml {name}: convert" + (f" + {quant.kind} weights" if quant.kind != "none" else ""))
        model = _convert(twin, layers, seq_len, quant)
        rel = f"{COREML_DIR}/{name}.mlpackage"
        model.save(str(Path(out_dir) / rel))
        # coremltools also writes an ExecuTorch debug-handle map beside the model (40% of a tiny
        # package); it is not an item of the package (Manifest.json) and no runtime reads it
        (Path(out_dir) / rel / "executorch_debug_handle_mapping.json").unlink(missing_ok=True)
        methods[name] = rel
        ops[name] = mil_op_histogram(model._mil_program)
        outputs[name] = [e.name for e in twin.updated_entries(layers)]
    details = {
        "coremltools_version": ct.__version__,
        "deployment_target": DEPLOYMENT_TARGET,
        "compute_precision": "float32",
        "compression": None if quant.kind == "none" else {
            "method": "linear_quantize_weights", "mode": "linear_symmetric", "dtype": quant.kind,
            "granularity": "per_block", "block_size": [1, quant.group], "weights": list(QUANTIZED_FIELDS)},
        "inputs": _input_specs(program, seq_len),
        "outputs": _output_specs(program, outputs),
        "method_outputs": {m: ["loss"] + [e + OUTPUT_SUFFIX for e in names] for m, names in outputs.items()},
        "states": [],
        "mil_ops": ops,
    }
    return TargetArtifact("coreml", COREML_DIR, methods=methods, details=details)


def _float_twin(program: StepProgram) -> StepProgram:
    """The program with its quantized projection weights dequantized (the same values the step uses)."""
    if program.quant.kind == "none":
        return program
    mw = program.model_weights()
    layers = tuple(LayerWeights(*(dense(w) for w in lw)) for lw in mw.layers)
    weights = ModelWeights(mw.embed, layers, mw.final_norm, mw.lm_head)
    return StepProgram(program.arch, weights, program.cfg, optimizer=program.optimizer, options=program.options)


def _convert(program: StepProgram, layers: tuple[int, ...] | None, seq_len: int, quant: QuantSpec):
    """One method -> MLModel (not loaded: Core ML predicts on Apple platforms only)."""
    import coremltools as ct
    import numpy as np

    args = example_inputs(program, seq_len)
    with torch.no_grad():
        ep = torch.export.export(TrainMethod(program, layers), args, strict=False).run_decompositions({})
    _exact_reciprocal(ep)
    names = ["input_ids", "labels", "lr"] + [e.name for e in program.layout]
    inputs = [ct.TensorType(name=n, shape=tuple(a.shape), dtype=np.int32 if a.dtype == torch.int64 else np.float32)
              for n, a in zip(names, args)]
    outputs = [ct.TensorType(name=n, dtype=np.float32)
               for n in ["loss"] + [e.name + OUTPUT_SUFFIX for e in program.updated_entries(layers)]]
    weights = {f"w_{i}_{f}" for i in range(program.arch.layers) for f in QUANTIZED_FIELDS}
    weight_names = sorted(ph for ph, fqn in ep.graph_signature.inputs_to_buffers.items()
                          if fqn.split(".", 1)[1] in weights)
    if len(weight_names) != len(weights):
        raise RuntimeError(f"found {len(weight_names)} of the {len(weights)} projection weights in the exported graph")
    target = getattr(ct.target, DEPLOYMENT_TARGET)
    with _quiet():
        mil = ct.convert(ep, inputs=inputs, outputs=outputs, convert_to="milinternal", minimum_deployment_target=target,
                         compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline.EMPTY)
        _untranspose_weights(mil)
        model = ct.convert(mil, convert_to="mlprogram", minimum_deployment_target=target,
                           compute_precision=ct.precision.FLOAT32, pass_pipeline=_passes(weight_names, quant),
                           skip_model_load=True)
    _check_weights(model._mil_program, weight_names, quant)
    return model


def _passes(weight_names: list[str], quant: QuantSpec):
    """coremltools' default passes, folding constants only up to FOLD_MAX_ELEMS, with the projection
    weights first compressed (symmetric per-block [1, group], i.e. our groups) when `quant` asks."""
    import coremltools as ct
    import coremltools.optimize.coreml as cto

    passes = ct.PassPipeline.DEFAULT
    passes.set_options("common::const_elimination", {"skip_const_by_size": str(FOLD_MAX_ELEMS)})
    if quant.kind != "none":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype=quant.kind, granularity="per_block",
                                         block_size=[1, quant.group], weight_threshold=0)
        passes.insert_pass(0, "compression::linear_quantize_weights")
        passes.set_options("compression::linear_quantize_weights",
                           {"config": cto.OptimizationConfig(op_name_configs={n: op for n in weight_names})})
    return passes


def _check_weights(prog, weight_names: list[str], quant: QuantSpec) -> None:
    """Every projection weight is still one constant (float) or one compressed constexpr (quant)."""
    kind = "const" if quant.kind == "none" else "constexpr_blockwise_shift_scale"
    found = {op.name.removesuffix("_quantized") for op in _operations(prog) if op.op_type == kind}
    missing = sorted(set(weight_names) - found)
    if missing:
        # coremltools folds or renames constants in its passes, and skips (with a log line) weights the
        # quantization block does not divide
        raise RuntimeError(f"Core ML conversion lost {len(missing)} frozen weight(s) as {kind}, e.g. {missing[0]}")


def _untranspose_weights(prog) -> int:
    """Rewrite `linear(x, transpose(W, [1, 0]))` (zero bias) into `matmul(x, W)`; returns the count.

    `x @ W` and `linear(x, W^T)` are the same product, but folding `transpose(W)` would store W^T
    beside W (which the forward uses as is).
    """
    import numpy as np
    from coremltools.converters.mil import Builder as mb

    count = 0
    for op in list(_operations(prog)):
        if op.op_type != "linear" or op.weight.op is None or op.weight.op.op_type != "transpose":
            continue
        t = op.weight.op
        if list(t.perm.val) != [1, 0] or (op.bias is not None and np.any(op.bias.val != 0)):
            continue
        _replace(op, lambda: mb.matmul(x=op.x, y=t.x, before_op=op, name=op.name + "_matmul"))
        count += 1
    return count


def _exact_reciprocal(ep) -> int:
    """Rewrite `aten.reciprocal(x)` into `aten.div(full_like(x, 1), x)` in the exported graph; returns
    the count.

    coremltools converts `reciprocal` to MIL `inverse`, which computes 1 / (x + epsilon) with epsilon
    = 1e-4 by default: RoPE's inverse frequencies 1 / theta^(2i/d) came out 1e-4 too small, the cos/sin
    tables off by up to 1.4e-3 and the step's results by ~1e-5 relative. (Rewriting the MIL `inverse`
    instead is too late: the frontend has already folded the values downstream of it.)
    """
    aten = torch.ops.aten
    graph = ep.graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == aten.reciprocal.default:
            with graph.inserting_before(node):
                ones = graph.call_function(aten.full_like.default, (node.args[0], 1.0))
                div = graph.call_function(aten.div.Tensor, (ones, node.args[0]))
            ones.meta, div.meta = dict(node.meta), dict(node.meta)
            node.replace_all_uses_with(div)
            graph.erase_node(node)
            count += 1
    ep.graph_module.recompile()
    return count


def _replace(op, build) -> None:
    """Replace `op`'s single output by the var `build()` makes, right before it, then remove `op`."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil.scope import ScopeInfo

    block = op.enclosing_block
    with block:
        # the new ops inherit the old op's scopes (the torch.export provenance coremltools requires)
        with mb.scope(*[ScopeInfo(source=s, data=d) for s, d in op.scopes.items()]):
            new = build()
        block.replace_uses_of_var_after_op(anchor_op=op, old_var=op.outputs[0], new_var=new)
        block.remove_ops([op])


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


def _input_specs(program: StepProgram, seq_len: int) -> list[dict]:
    ids = {"dtype": "int32", "shape": [seq_len]}  # Core ML has no int64 inputs: the app passes int32 ids
    return ([{"name": "input_ids", **ids}, {"name": "labels", **ids, "description": "-100 = no target"},
             {"name": "lr", "dtype": "float32", "shape": [1]}]
            + [{"name": e.name, "dtype": "float32", "shape": list(e.shape)} for e in program.layout])


def _output_specs(program: StepProgram, outputs: dict[str, list[str]]) -> list[dict]:
    """Every output some method has, in state order: `loss`, then `<entry>_out` with its `entry`."""
    produced = {n for names in outputs.values() for n in names}
    return [{"name": "loss", "dtype": "float32", "shape": [1]}] + [
        {"name": e.name + OUTPUT_SUFFIX, "entry": e.name, "dtype": "float32", "shape": list(e.shape)}
        for e in program.layout if e.name in produced]


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
