"""The Core ML export (`--target coreml`).

Every host: each method's `.mlpackage` declares the manifest's inputs/outputs (names, dtypes, shapes)
and no states; its MIL ops are the expected set; frozen weights are stored once (no folded transposes
or head slices); compressed weights decompress to exactly our int4/int8 grid; and the converted MIL
program, evaluated op by op with coremltools' own numpy semantics for each MIL op, matches the eager
step. macOS only: predictions on the Core ML runtime against the eager step, and the compute plan.
Exports are small (2 layers, T=16) and shared per module."""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest
import torch

from toolchain.errors import BadInput
from toolchain.export.build import ExportSpec, export_program
from toolchain.export.coreml import (EXPECTED_OPS, FOLD_MAX_ELEMS, OUTPUT_SUFFIX, _exact_reciprocal, _passes,
                                     _untranspose_weights, export_coreml)
from toolchain.export.program import OptimizerSpec, QuantSpec, StepProgram, flat_state, unflatten_state
from toolchain.lcsb.plan import make_plan
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import StepOptions
from toolchain.mesp.ops.quant import dequantize, quantize
from toolchain.models import Qwen25Arch, random_weights
from toolchain.runtime import ProgramDir

ARCH = Qwen25Arch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
T = 16
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
# two LM-head chunks of 48 x 32 = 1536 elements (> FOLD_MAX_ELEMS: folding them would copy the head),
# two loss chunks and two MLP chunks, so the chunked paths are converted too
OPTIONS = StepOptions(loss_chunk=8, vocab_chunk=48, mlp_chunk=8)
on_macos = pytest.mark.skipif(sys.platform != "darwin", reason="Core ML predictions need macOS: coremltools has no "
                                                               "Core ML runtime on Linux (structure is tested there)")


def _export(tmp_path_factory, name: str, *, quant: str, optimizer: OptimizerSpec, lcsb: bool):
    weights = random_weights(ARCH, seed=3)
    lora = init_lora(ARCH, CFG, seed=4, zero_b=False)
    plan = make_plan(ARCH.layers, 1, "cyclic") if lcsb else None
    spec = ExportSpec(source="test", init="random", seed=3, seq_len=T, quant=QuantSpec(quant, 16), optimizer=optimizer,
                      plan=plan, targets=("coreml",), options=OPTIONS, pad_token_id=0)
    out = tmp_path_factory.mktemp(name) / "prog"
    export_program(ARCH, weights, CFG, lora, spec, out)
    program = StepProgram(ARCH, weights, CFG, optimizer=optimizer, options=OPTIONS, quant=QuantSpec(quant, 16))
    return ProgramDir(out), program


@pytest.fixture(scope="module")
def fp32_sgd_lcsb(tmp_path_factory):
    return _export(tmp_path_factory, "fp32", quant="none", optimizer=OptimizerSpec("sgd"), lcsb=True)


@pytest.fixture(scope="module")
def int4_adamw(tmp_path_factory):
    return _export(tmp_path_factory, "int4", quant="int4", optimizer=OptimizerSpec("adamw", weight_decay=0.01), lcsb=False)


@pytest.fixture(params=["fp32_sgd_lcsb", "int4_adamw"])
def exported(request):
    return request.getfixturevalue(request.param)


def _entry(pdir: ProgramDir) -> dict:
    return next(p for p in pdir.manifest["programs"] if p["target"] == "coreml")


def _package(pdir: ProgramDir, method: str):
    """(spec, MIL program) of a method's saved package, read back from disk."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load

    model = ct.models.MLModel(str(pdir.path / _entry(pdir)["methods"][method]), skip_model_load=True)
    spec = model.get_spec()
    return spec, load(spec, spec.specificationVersion, file_weights_dir=model.weights_dir)


def _operations(block):
    for op in block.operations:
        yield op
        for b in op.blocks:
            yield from _operations(b)


# -- structure (every host) -----------------------------------------------------------------------------

def test_packages_declare_the_manifest_io_and_no_states(exported):
    from coremltools.proto import FeatureTypes_pb2 as ft

    pdir, _ = exported
    entry = _entry(pdir)
    assert entry["deployment_target"] == "iOS18" and entry["compute_precision"] == "float32"
    assert entry["states"] == [] and entry["bytes"] > 0
    assert sorted(entry["methods"]) == pdir.train_methods()
    dtypes = {ft.ArrayFeatureType.INT32: "int32", ft.ArrayFeatureType.FLOAT32: "float32"}
    for name in pdir.train_methods():
        method = pdir.method(name)
        spec, _ = _package(pdir, name)
        got_in = [(f.name, dtypes.get(f.type.multiArrayType.dataType), list(f.type.multiArrayType.shape))
                  for f in spec.description.input]
        want_in = [(io["name"], "int32" if io["dtype"] == "int64" else io["dtype"], io["shape"]) for io in method["inputs"]]
        assert got_in == want_in
        assert [(i["name"], i["dtype"], i["shape"]) for i in entry["inputs"]] == want_in
        got_out = [(f.name, dtypes.get(f.type.multiArrayType.dataType), list(f.type.multiArrayType.shape))
                   for f in spec.description.output]
        want_out = [("loss", "float32", [1])] + [(io["name"] + OUTPUT_SUFFIX, "float32", io["shape"])
                                                 for io in method["outputs"][1:]]
        assert got_out == want_out
        assert entry["method_outputs"][name] == [n for n, _, _ in want_out]
        assert len(spec.description.state) == 0
        pkg = pdir.path / entry["methods"][name]
        assert sorted(str(f.relative_to(pkg)) for f in pkg.rglob("*") if f.is_file()) == [
            "Data/com.apple.CoreML/model.mlmodel", "Data/com.apple.CoreML/weights/weight.bin", "Manifest.json"]
    by_name = {o["name"]: o for o in entry["outputs"]}
    for io in (io for m in pdir.manifest["methods"] for io in m["outputs"][1:]):
        assert by_name[io["name"] + OUTPUT_SUFFIX]["entry"] == io["name"]


def test_sgd_phase_methods_return_only_their_layers(fp32_sgd_lcsb):
    pdir, _ = fp32_sgd_lcsb
    for k, layers in enumerate(pdir.manifest["lcsb"]["phases"]):
        outs = _entry(pdir)["method_outputs"][f"train_step_p{k}"][1:]
        assert outs and all(n.startswith(tuple(f"lora_{i}_" for i in layers)) for n in outs)


def test_mil_ops_are_the_expected_set(exported):
    pdir, _ = exported
    entry = _entry(pdir)
    for name in pdir.train_methods():
        _, prog = _package(pdir, name)
        ops = {}
        for op in _operations(prog.functions["main"]):
            ops[op.op_type] = ops.get(op.op_type, 0) + 1
        print(name, ops)
        assert set(ops) <= EXPECTED_OPS, f"unexpected MIL ops {sorted(set(ops) - EXPECTED_OPS)}"
        assert entry["mil_ops"][name] == dict(sorted(ops.items()))
        assert "linear" not in ops  # every `linear(x, W^T)` was rewritten to `matmul(x, W)`
        n_quant = ops.get("constexpr_blockwise_shift_scale", 0)
        assert n_quant == (7 * ARCH.layers if pdir.manifest["quant"]["kind"] != "none" else 0)


def test_frozen_weights_are_stored_once(exported):
    """A constant above FOLD_MAX_ELEMS that is not one of the program's buffers would be a folded copy
    of a weight (W^T for the backward, a slice of the LM head)."""
    pdir, program = exported
    buffers = {"b_program_" + n.removesuffix("_q").removesuffix("_scale") for n, _ in program.named_buffers()}
    for name in pdir.train_methods():
        _, prog = _package(pdir, name)
        big = [re.sub(r"_quantized_(data|scale)_\d+$", "", op.name) for op in _operations(prog.functions["main"])
               if op.op_type == "const" and op.outputs[0].val is not None and np.size(op.outputs[0].val) > FOLD_MAX_ELEMS]
        assert big and set(big) <= buffers, sorted(set(big) - buffers)
        assert len(big) == len(set(big))


def test_quant_must_be_the_programs(tmp_path):
    program = StepProgram(ARCH, random_weights(ARCH, seed=3), CFG, quant=QuantSpec("int4", 16))
    with pytest.raises(BadInput, match="int8 weights of a int4 program"):
        export_coreml(program, None, T, tmp_path, quant=QuantSpec("int8", 16))
    assert not any(tmp_path.iterdir())


def test_compressed_weights_are_our_int4_grid(int4_adamw):
    """Re-quantizing our dequantized grid with coremltools' symmetric per-block [1, group] scheme gives
    back our q and scales: the decompressed weights equal the in-graph dequantization bit for bit."""
    pdir, program = int4_adamw
    _, prog = _package(pdir, "train_step")
    seen = 0
    for op in _operations(prog.functions["main"]):
        if op.op_type == "constexpr_blockwise_shift_scale":
            layer, field = op.name.removeprefix("b_program_w_").removesuffix("_quantized").split("_", 1)
            ours = dequantize(program._frozen(int(layer), field)).numpy()
            np.testing.assert_array_equal(op.materialized_val_inference(), ours)
            assert -7 <= op.data.val.min() and op.data.val.max() <= 7
            seen += 1
    assert seen == 7 * ARCH.layers


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_compression_pass_reproduces_our_grid(kind):
    """The same pass on a one-matmul MIL program, for both widths (int8 is not exported above)."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    g = torch.Generator().manual_seed(0)
    w = dequantize(quantize(torch.randn(24, 64, generator=g), kind, 16)).numpy()

    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 64))], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.matmul(x=mb.const(val=w, name="w"), y=x, transpose_y=True)

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT32, pass_pipeline=_passes(["w"], QuantSpec(kind, 16)),
                       skip_model_load=True)
    ops = [op for op in model._mil_program.functions["main"].operations if op.op_type == "constexpr_blockwise_shift_scale"]
    assert len(ops) == 1
    np.testing.assert_array_equal(ops[0].materialized_val_inference(), w)


def test_untranspose_rewrites_linear_of_a_transposed_weight():
    """`linear(x, transpose(W))` -> `matmul(x, W)`: same values, and W stays the only constant."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    rng = np.random.default_rng(0)
    w, x0 = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(3, 8))], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.linear(x=x, weight=mb.transpose(x=mb.const(val=w, name="w"), perm=[1, 0]))

    assert _untranspose_weights(prog) == 1
    ops = list(prog.functions["main"].operations)
    mm = next(op for op in ops if op.op_type == "matmul")
    assert mm.y.op.name == "w" and not any(op.op_type == "linear" for op in ops)
    np.testing.assert_allclose(_run_mil(prog.functions["main"], {"x": x0})[mm.outputs[0].name], x0 @ w, rtol=1e-6)


class _Reciprocal(torch.nn.Module):
    def forward(self, x):
        return 1.0 / x  # exports as aten.reciprocal (RoPE's 1 / theta^(2i/d))


def _reciprocal_through_mil(x0: np.ndarray, *, rewrite: bool) -> np.ndarray:
    import coremltools as ct

    ep = torch.export.export(_Reciprocal(), (torch.from_numpy(x0),), strict=False).run_decompositions({})
    if rewrite:
        assert _exact_reciprocal(ep) == 1
    prog = ct.convert(ep, inputs=[ct.TensorType(name="x", shape=x0.shape, dtype=np.float32)], convert_to="milinternal",
                      minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT32,
                      pass_pipeline=ct.PassPipeline.EMPTY)
    func = prog.functions["main"]
    return _run_mil(func, {"x": x0})[func.outputs[0].name]


def test_exact_reciprocal():
    """coremltools converts `aten.reciprocal` to MIL `inverse` = 1 / (x + 1e-4); rewritten, it is 1 / x."""
    x0 = np.array([1.0, 2.0, 1e-3], dtype=np.float32)
    assert abs(_reciprocal_through_mil(x0, rewrite=False)[2] - 1 / 1.1e-3) < 1  # the converter's epsilon
    np.testing.assert_array_equal(_reciprocal_through_mil(x0, rewrite=True), np.float32(1) / x0)


# -- numerics of the converted graph (every host) ---------------------------------------------------------

# MIL ops whose coremltools value inference is missing: the same formulas in numpy.
_NUMPY_OPS = {
    "silu": lambda x: (x / (1 + np.exp(-x))).astype(x.dtype),
    "sigmoid": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "softmax": lambda x, axis: (lambda e: (e / e.sum(axis, keepdims=True)).astype(x.dtype))(
        np.exp(x - x.max(axis, keepdims=True))),
}


def _run_mil(func, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate a MIL function op by op: each op is rebuilt with constant inputs so coremltools computes
    it with its reference (numpy) value inference. Not the Core ML runtime: this checks the conversion."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function

    env = dict(feeds)
    with Function({}, opset_version=func.opset_version):
        for op in func.operations:
            if op.op_type == "const":
                env[op.outputs[0].name] = op.outputs[0].val
                continue
            if op.op_type.startswith("constexpr"):
                env[op.outputs[0].name] = op.materialized_val_inference()
                continue
            kw = {k: [env.get(x.name, x.val) for x in v] if isinstance(v, (list, tuple)) else env.get(v.name, v.val)
                  for k, v in op.inputs.items()}
            # numpy 2 refuses numpy bools as `keepdims`
            kw = {k: bool(v) if isinstance(v, (np.bool_, np.ndarray)) and v.dtype == bool and v.ndim == 0 else v
                  for k, v in kw.items()}
            res = getattr(mb, op.op_type)(**kw)
            for out, r in zip(op.outputs, res if isinstance(res, (list, tuple)) else [res]):
                env[out.name] = r.val if r.val is not None else _NUMPY_OPS[op.op_type](**kw)
    return env


def _state_and_row(program: StepProgram, seed: int):
    """A non-trivial state (B != 0, AdamW moments > 0, step 3) and a row with ignored labels."""
    g = torch.Generator().manual_seed(seed)
    flat = flat_state(program.layout, init_lora(ARCH, CFG, seed=seed, zero_b=False))
    for e in program.layout:
        part = flat[e.offset:e.offset + e.numel]
        if e.role == "exp_avg":
            part.copy_(torch.randn(e.numel, generator=g) * 1e-3)
        elif e.role == "exp_avg_sq":
            part.copy_(torch.rand(e.numel, generator=g) * 1e-5)
        elif e.role == "step":
            part.fill_(3.0)
    ids = torch.randint(0, ARCH.vocab, (T,), generator=g)
    labels = ids.clone()
    labels[:3] = -100
    return flat, ids, labels


def test_mil_program_matches_eager_step(exported):
    pdir, program = exported
    lcsb = pdir.manifest["lcsb"]
    for k, name in enumerate(pdir.train_methods()):
        layers = None if lcsb is None else tuple(lcsb["phases"][k])
        flat, ids, labels = _state_and_row(program, seed=10 + k)
        views = unflatten_state(program.layout, flat)
        lr = torch.tensor([1e-2])
        with torch.no_grad():
            loss, new = program.train_step(ids, labels, lr, views, layers)
        _, prog = _package(pdir, name)
        feeds = {"input_ids": ids.numpy().astype(np.int32), "labels": labels.numpy().astype(np.int32), "lr": lr.numpy(),
                 **{n: v.numpy() for n, v in views.items()}}
        got = _run_mil(prog.functions["main"], feeds)
        assert math.isclose(float(got["loss"][0]), float(loss[0]), rel_tol=1e-5), (name, got["loss"], loss)
        assert set(new) == {o.name.removesuffix(OUTPUT_SUFFIX) for o in prog.functions["main"].outputs[1:]}
        errors = {n: float(np.abs(got[n + OUTPUT_SUFFIX] - v.numpy()).max() / np.abs(v.numpy()).max())
                  for n, v in new.items()}
        worst = max(errors, key=errors.get)
        print(name, "worst rel error", worst, errors[worst])
        assert errors[worst] <= 1e-5, (worst, errors[worst])
        # the step really moved what it returns
        assert any(not torch.equal(v, views[n]) for n, v in new.items())


# -- the Core ML runtime (macOS) -------------------------------------------------------------------------

@pytest.mark.darwin
@on_macos
def test_coreml_predictions_train_like_eager(exported):
    """Three steps as an app makes them (ProgramDir.call_train_method) on Core ML (CPU, float32)."""
    import coremltools as ct

    pdir, program = exported
    models = {m: ct.models.MLModel(str(pdir.path / f), compute_units=ct.ComputeUnit.CPU_ONLY)
              for m, f in _entry(pdir)["methods"].items()}

    def execute(method, inputs):
        spec = pdir.method(method)
        feeds = {io["name"]: (x.numpy().astype(np.int32) if io["dtype"] == "int64" else x.numpy())
                 for io, x in zip(spec["inputs"], inputs)}
        out = models[method].predict(feeds)
        return [torch.from_numpy(np.asarray(out["loss"]))] + [
            torch.from_numpy(np.asarray(out[io["name"] + OUTPUT_SUFFIX])) for io in spec["outputs"][1:]]

    state, ids, labels = _state_and_row(program, seed=20)
    eager = state.clone()
    for step in range(3):
        method, phase = pdir.method_for_step(step)
        layers = None if phase is None else tuple(pdir.manifest["lcsb"]["phases"][phase])
        loss = pdir.call_train_method(execute, method, ids, labels, 1e-2, state)
        want = program.eager_step(ids, labels, 1e-2, eager, layers)
        assert math.isclose(loss, want, rel_tol=1e-4), (step, loss, want)
    rel = float((state - eager).abs().max() / eager.abs().max())
    print("Core ML vs eager, state rel diff after 3 steps", rel)
    assert rel <= 1e-4


@pytest.mark.darwin
@on_macos
def test_coreml_compute_plan_supports_every_op(exported):
    """Core ML's own compute plan: every MIL op has a device; prints where each op type runs."""
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    pdir, _ = exported
    for name, rel in _entry(pdir)["methods"].items():
        compiled = ct.models.utils.compile_model(str(pdir.path / rel))
        plan = MLComputePlan.load_from_path(path=compiled, compute_units=ct.ComputeUnit.ALL)
        devices: dict[str, set[str]] = {}
        for op in plan.model_structure.program.functions["main"].block.operations:
            usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
            if op.operator_name.startswith("const"):
                continue
            assert usage is not None, f"{name}: no compute device for {op.operator_name}"
            devices.setdefault(op.operator_name, set()).add(type(usage.preferred_compute_device).__name__)
        print(name, {k: sorted(v) for k, v in sorted(devices.items())})


# -- why the state is float32 inputs/outputs and the compute float32 (docs/coreml.md) ----------------------

def _fp16_run(optimizer: OptimizerSpec, lr: float, steps: int, mode: str):
    """`steps` eager steps of the tiny preset on the bundled corpus (T=64, r=8 on all projections).
    mode: "fp32"; "state" (the state rounded to float16 after every step: what Core ML fp16 states
    would hold); "compute" (weights, activations and state in float16 too)."""
    from toolchain.dataset import ByteTokenizer, bundled_examples
    from toolchain.models import get_preset

    arch, cfg = get_preset("tiny"), LoraConfig(rank=8, alpha=16)
    examples = bundled_examples(ByteTokenizer(), seq_len=64)
    weights = random_weights(arch, seed=0)
    program = StepProgram(arch, weights.to(torch.float16) if mode == "compute" else weights, cfg, optimizer=optimizer)
    flat = flat_state(program.layout, init_lora(arch, cfg, seed=1))
    flat = flat.half() if mode == "compute" else flat.half().float() if mode == "state" else flat
    losses = []
    for s in range(steps):
        ex = examples[s % len(examples)]
        losses.append(program.eager_step(ex.input_ids, ex.labels, lr, flat, None))
        if mode == "state":
            flat.copy_(flat.half().float())
    return program, flat.float(), losses


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["state", "compute"])
@pytest.mark.parametrize("optimizer,lr", [(OptimizerSpec("sgd"), 0.05), (OptimizerSpec("sgd"), 3e-3),
                                          (OptimizerSpec("adamw", weight_decay=0.01), 3e-3),
                                          (OptimizerSpec("adamw", weight_decay=0.01), 1e-4)],
                         ids=["sgd-0.05", "sgd-3e-3", "adamw-3e-3", "adamw-1e-4"])
def test_float16_emulation(optimizer, lr, mode):
    """200 steps in float32 vs float16 (see _fp16_run): SGD's adapter drifts by ~5-13% of its update,
    AdamW's exp_avg_sq underflows float16 and its adapter is garbage (state) or NaN (compute)."""
    steps = 200
    program, f32, l32 = _fp16_run(optimizer, lr, steps, "fp32")
    _, f16, l16 = _fp16_run(optimizer, lr, steps, mode)
    init = flat_state(program.layout, init_lora(program.arch, program.cfg, seed=1))
    params = [e for e in program.layout if e.role == "param"]
    sl = lambda f: torch.cat([f[e.offset:e.offset + e.numel] for e in params])  # noqa: E731
    d32, d16 = sl(f32) - sl(init), sl(f16) - sl(init)
    err = float((d16 - d32).norm() / d32.norm())
    v = [f16[e.offset:e.offset + e.numel] for e in program.layout if e.role == "exp_avg_sq"]
    v_zero = float((torch.cat(v) == 0).float().mean()) if v else 0.0
    last32, last16 = sum(l32[-20:]) / 20, sum(l16[-20:]) / 20
    print(f"{mode} {optimizer.kind} lr={lr:g}: mean loss of the last 20 steps fp32 {last32:.4f} fp16 {last16:.4f}; "
          f"adapter update error {err:.4f}; exp_avg_sq == 0: {v_zero:.3f}")
    if optimizer.kind == "sgd":
        assert 0.01 < err < 0.2 and abs(last16 - last32) < 0.01
    elif mode == "state":
        assert v_zero > 0.1 and err > 100
    else:
        assert not math.isfinite(last16)
