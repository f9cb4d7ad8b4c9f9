"""The Core ML export (`--target coreml`).

Every host: each method's `.mlpackage` declares exactly the manifest's inputs and outputs (names, order,
shapes; Core ML dtypes: int32 ids/labels, int8 for int8/uint8 weights), no states, no stored weight (only
small constants); its MIL ops are the expected set; and the converted MIL program, evaluated op by op
with coremltools' own numpy semantics for each MIL op (not the Core ML runtime), equals the method's
eager module on random inputs, and drives `LayerLoop` through whole training steps like `EagerRuntime`.
macOS only: predictions on the Core ML runtime, and the compute plan.
Exports are small (2 layers, T=16) and shared per module."""

from __future__ import annotations

import functools
import math
import sys
import types

import numpy as np
import pytest
import torch

from toolchain.contract import TRAINING_ROLES, IoSpec, MethodSpec
from toolchain.export.bodies import method_module
from toolchain.export.build import ExportSpec, export_program
from toolchain.export.coreml import (CORE_ML_DTYPES, EXPECTED_OPS, FOLD_MAX_ELEMS, _convert, _exact_reciprocal,
                                     _mask_as_remainder, deployment_target)
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import StepOptions
from toolchain.models import ModelArch, random_weights
from toolchain.optim import OptimizerConfig
from toolchain.program import ProgramDir
from toolchain.program.spec import (ProgramSpec, QuantSpec, flat_state, method_specs, state_layout,
                                      unflatten_state)
from toolchain.runtime import EagerRuntime, LayerLoop
from toolchain.training import pad_row

ARCH = ModelArch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
T = 16
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
# two LM-head chunks, two loss chunks and eight MLP column chunks, so the chunked paths are converted too
OPTIONS = StepOptions(loss_chunk=8, vocab_chunk=48, mlp_chunk=8)
on_macos = pytest.mark.skipif(sys.platform != "darwin", reason="Core ML predictions need macOS: coremltools has no "
                                                               "Core ML runtime on Linux (structure is tested there)")


def _export(tmp_path_factory, name: str, *, quant: str, optimizer: OptimizerConfig) -> ProgramDir:
    weights = random_weights(ARCH, seed=3)
    lora = init_lora(ARCH, CFG, seed=4, zero_b=False)
    spec = ExportSpec(source="test", init="random", seed=3, seq_len=T, quant=QuantSpec(quant, 16), optimizer=optimizer,
                      targets=("coreml",), options=OPTIONS, pad_token_id=0)
    out = tmp_path_factory.mktemp(name) / "prog"
    export_program(ARCH, weights, CFG, lora, spec, out)
    return ProgramDir(out)


@pytest.fixture(scope="module")
def fp32_sgd(tmp_path_factory):
    return _export(tmp_path_factory, "fp32", quant="none", optimizer=OptimizerConfig("sgd"))


@pytest.fixture(scope="module")
def int4_adamw(tmp_path_factory):
    return _export(tmp_path_factory, "int4", quant="int4", optimizer=OptimizerConfig("adamw", weight_decay=0.01))


@pytest.fixture(params=["fp32_sgd", "int4_adamw"])
def exported(request):
    return request.getfixturevalue(request.param)


def _entry(pdir: ProgramDir) -> dict:
    return pdir.program("coreml")


def _load(path):
    """(spec, MIL program) of a saved package, read back from disk."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load

    model = ct.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()
    return spec, load(spec, spec.specificationVersion, file_weights_dir=model.weights_dir)


_packages: dict = {}


def _package(pdir: ProgramDir, method: str):
    key = (str(pdir.path), method)
    if key not in _packages:
        _packages[key] = _load(pdir.path / _entry(pdir).methods[method])
    return _packages[key]


def _operations(block):
    for op in block.operations:
        yield op
        for b in op.blocks:
            yield from _operations(b)


# -- structure (every host) -----------------------------------------------------------------------------

def test_packages_declare_the_manifest_io_and_no_states(exported):
    from coremltools.proto import FeatureTypes_pb2 as ft

    pdir = exported
    entry = _entry(pdir)
    quant = pdir.spec.quant.kind
    assert entry.details["deployment_target"] == ("iOS18" if quant == "none" else "iOS26")
    assert entry.details["compute_precision"] == "float32" and entry.bytes > 0
    assert entry.details["input_dtypes"] == ({"int64": "int32"} if quant == "none" else {"int64": "int32", "uint8": "int8"})
    assert entry.methods == {m: f"coreml/{m}.mlpackage" for m in pdir.methods}
    dtypes = {ft.ArrayFeatureType.INT32: "int32", ft.ArrayFeatureType.FLOAT32: "float32",
              ft.ArrayFeatureType.INT8: "int8"}
    for name, method in pdir.methods.items():
        spec, _ = _package(pdir, name)
        feature = lambda f: (f.name, dtypes.get(f.type.multiArrayType.dataType),  # noqa: E731
                             list(f.type.multiArrayType.shape))
        assert [feature(f) for f in spec.description.input] == [
            (io.name, CORE_ML_DTYPES[io.dtype], list(io.shape)) for io in method.inputs]
        assert [feature(f) for f in spec.description.output] == [
            (io.name, "float32", list(io.shape)) for io in method.outputs]
        assert len(spec.description.state) == 0
        pkg = pdir.path / entry.methods[name]
        files = sorted(str(f.relative_to(pkg)) for f in pkg.rglob("*") if f.is_file())
        # the weight blob holds constants only (none at all in embed)
        assert [f for f in files if f != "Data/com.apple.CoreML/weights/weight.bin"] == [
            "Data/com.apple.CoreML/model.mlmodel", "Manifest.json"]
    assert ("block_skip_update" in pdir.methods) == pdir.moves_unselected


def test_mil_ops_are_the_expected_set(exported):
    pdir = exported
    for name in pdir.methods:
        _, prog = _package(pdir, name)
        ops: dict[str, int] = {}
        for op in _operations(prog.functions["main"]):
            ops[op.op_type] = ops.get(op.op_type, 0) + 1
        print(name, ops)
        assert set(ops) <= EXPECTED_OPS, f"unexpected MIL ops {sorted(set(ops) - EXPECTED_OPS)}"
        assert _entry(pdir).details["mil_ops"][name] == dict(sorted(ops.items()))


def test_no_weight_is_stored_in_a_package(exported):
    """Weights are inputs: every constant is small (RoPE tables, masks, scalars), each package's weight
    blob is a few KB, and no frozen weight input is transposed (that would be a runtime copy of it)."""
    pdir = exported
    weights_bytes = pdir.weights_bytes
    total = 0
    for name, method in pdir.methods.items():
        _, prog = _package(pdir, name)
        func = prog.functions["main"]
        sizes = [np.size(op.outputs[0].val) for op in _operations(func)
                 if op.op_type == "const" and op.outputs[0].val is not None]
        assert max(sizes) <= FOLD_MAX_ELEMS, (name, max(sizes))
        blob = pdir.path / _entry(pdir).methods[name] / "Data/com.apple.CoreML/weights/weight.bin"
        size = blob.stat().st_size if blob.exists() else 0
        assert size <= 16 * 1024, (name, size)
        total += size
        weight_inputs = {io.name for io in method.inputs if io.bind == "weight"}
        assert all(func.inputs[n].child_ops for n in weight_inputs), name  # each one is read by the program
        for op in _operations(func):
            if op.op_type == "transpose":
                assert op.x.name not in weight_inputs, (name, op.x.name)
    print(f"weight blobs of all packages: {total} B; weights file {weights_bytes} B")


@pytest.mark.parametrize("kind", ["none", "int8", "int4"])
def test_deployment_target_follows_the_weight_dtype(kind):
    spec = ProgramSpec(ARCH, CFG, T, quant=QuantSpec(kind, 16))
    assert deployment_target(spec) == ("iOS18" if kind == "none" else "iOS26")


# -- the MIL program, evaluated op by op (every host) ---------------------------------------------------------

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

    from coremltools.converters.mil.mil import types as mil_types

    for name, var in func.inputs.items():  # the feeds are what the package declares
        assert feeds[name].shape == tuple(var.shape), (name, feeds[name].shape, var.shape)
        assert feeds[name].dtype == mil_types.nptype_from_builtin(var.dtype), (name, feeds[name].dtype, var.dtype)
    env = dict(feeds)
    with Function({}, opset_version=func.opset_version):
        for op in func.operations:
            if op.op_type == "const":
                env[op.outputs[0].name] = op.outputs[0].val
                continue
            kw = {k: [env.get(x.name, x.val) for x in v] if isinstance(v, (list, tuple)) else env.get(v.name, v.val)
                  for k, v in op.inputs.items()}
            # numpy 2 refuses numpy bools as `keepdims`
            kw = {k: bool(v) if isinstance(v, (np.bool_, np.ndarray)) and v.dtype == bool and v.ndim == 0 else v
                  for k, v in kw.items()}
            res = getattr(mb, op.op_type)(**kw)
            for out, r in zip(op.outputs, res if isinstance(res, (list, tuple)) else [res]):
                env[out.name] = r.val if r.val is not None else _NUMPY_OPS[op.op_type](**kw)
    return {v.name: env[v.name] for v in func.outputs}


def _feeds(method: MethodSpec, inputs) -> dict[str, np.ndarray]:
    """What an app passes to Core ML: int32 ids/labels, the weights' 8-bit bytes as int8, float32."""
    out = {}
    for io, x in zip(method.inputs, inputs):
        x = x.contiguous()
        if io.dtype == "int64":
            out[io.name] = x.numpy().astype(np.int32)
        elif io.dtype == "uint8":
            out[io.name] = x.view(torch.int8).numpy()   # the same bytes: no copy on a device either
        else:
            out[io.name] = x.numpy()
    return out


class MilRuntime:
    """Runs the packages' MIL programs op by op behind `execute(method, inputs)`, for LayerLoop."""

    backend = "coreml-mil"

    def __init__(self, pdir: ProgramDir) -> None:
        self.pdir = pdir
        self.calls: list[str] = []

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls.append(method)
        spec = self.pdir.methods[method]
        got = _run_mil(_package(self.pdir, method)[1].functions["main"], _feeds(spec, inputs))
        return [torch.from_numpy(np.asarray(got[io.name], dtype=np.float32).copy()) for io in spec.outputs]


def _random_input(io: IoSpec, g: torch.Generator, quant: str) -> torch.Tensor:
    """Random values of realistic size (dequantized weights ~0.2, all int4 nibbles and int8 values)."""
    n = io.name
    if io.dtype == "int64":
        x = torch.randint(0, ARCH.vocab, io.shape, generator=g)
        if n == "labels":
            x[:3] = -100
        return x
    if io.dtype == "uint8":
        return torch.randint(0, 256, io.shape, generator=g, dtype=torch.uint8)   # bytes >= 128 too
    if io.dtype == "int8":
        return torch.randint(-127, 128, io.shape, generator=g, dtype=torch.int8)
    if n == "lr":
        return torch.tensor([1e-2])
    if n == "step":
        return torch.tensor([3.0])
    if n.startswith("adam_v"):
        return torch.rand(io.shape, generator=g) * 1e-5
    if n.endswith("_scale"):
        return (0.5 + torch.rand(io.shape, generator=g)) * 0.2 / (127 if quant == "int8" else 8)
    if n.endswith("norm"):
        return 1 + 0.1 * torch.randn(io.shape, generator=g)
    scale = {"adam": 1e-3, "lora": 0.1, "w_": 0.2}
    return torch.randn(io.shape, generator=g) * next((s for p, s in scale.items() if n.startswith(p)), 1.0)


def _head_chunks_consistent(method: MethodSpec, inputs: list[torch.Tensor]) -> None:
    """head_i (or head_i_q / head_i_scale of an int4 head) are row slices of head (head_q / head_scale), as the
    app binds them."""
    by_name = {io.name: (io, x) for io, x in zip(method.inputs, inputs)}
    for io, x in list(by_name.values()):
        if io.rows is not None:
            whole = "head" + next((sfx for sfx in ("_q", "_scale") if io.name.endswith(sfx)), "")
            x.copy_(by_name[whole][1][io.rows[0]:io.rows[1]])


def _check_method(spec: ProgramSpec, name: str, func, seed: int) -> None:
    method = method_specs(spec)[name]
    g = torch.Generator().manual_seed(seed)
    inputs = [_random_input(io, g, spec.quant.kind) for io in method.inputs]
    _head_chunks_consistent(method, inputs)
    with torch.no_grad():
        want = method_module(spec, name)(*inputs)
    got = _run_mil(func, _feeds(method, inputs))
    assert list(got) == [io.name for io in method.outputs]
    errors = {}
    for io, w in zip(method.outputs, want):
        w = w.numpy()
        errors[io.name] = float(np.abs(got[io.name].reshape(w.shape) - w).max() / max(np.abs(w).max(), 1e-30))
    worst = max(errors, key=errors.get)
    print(name, spec.quant.kind, spec.optimizer.kind, "worst rel error", worst, errors[worst])
    assert errors[worst] <= 2e-6, (name, worst, errors[worst])  # measured <= 8e-7 (fp32 summation order)


@pytest.mark.parametrize("method", ["embed", "block_forward", "head_loss", "block_backward", "block_skip_update"])
def test_mil_program_matches_the_method_module(exported, method):
    pdir = exported
    if method not in pdir.methods:
        pytest.skip(f"{method} is not a method of this program (SGD without weight decay)")
    _check_method(pdir.spec, method, _package(pdir, method)[1].functions["main"],
                  seed=TRAINING_ROLES.index(method))


def test_int8_weights_convert_and_match(tmp_path):
    """int8 qweights are int8 package inputs (iOS 26); the quantized methods only (the others do not
    depend on the weight format)."""
    from coremltools.proto import FeatureTypes_pb2 as ft

    spec = ProgramSpec(ARCH, CFG, T, quant=QuantSpec("int8", 16), optimizer=OptimizerConfig("sgd", weight_decay=0.1),
                       options=OPTIONS)
    for k, name in enumerate(("block_forward", "block_backward")):
        model = _convert(spec, method_specs(spec)[name])
        model.save(str(tmp_path / f"{name}.mlpackage"))
        mspec, prog = _load(tmp_path / f"{name}.mlpackage")
        int8 = [f.name for f in mspec.description.input if f.type.multiArrayType.dataType == ft.ArrayFeatureType.INT8]
        assert int8 == [io.name for io in method_specs(spec)[name].inputs if io.dtype == "int8"] and len(int8) == 7
        _check_method(spec, name, prog.functions["main"], seed=40 + k)


def _state_views_init(pdir: ProgramDir, seed: int) -> torch.Tensor:
    """A non-trivial state: B != 0 (exported), AdamW moments > 0, step 3."""
    g = torch.Generator().manual_seed(seed)
    state = pdir.state_init()
    for e in pdir.state_entries:
        part = state[e.offset:e.offset + e.numel]
        if e.role == "exp_avg":
            part.copy_(torch.randn(e.numel, generator=g) * 1e-3)
        elif e.role == "exp_avg_sq":
            part.copy_(torch.rand(e.numel, generator=g) * 1e-5)
        elif e.role == "step":
            part.fill_(3.0)
    return state


@pytest.mark.parametrize("selected", [None, (1,)], ids=["all-layers", "lcsb-layer1"])
def test_layer_loop_on_the_mil_programs_trains_like_eager(exported, selected):
    """Two whole steps driven by the host LayerLoop (bindings to the weights file's views, chaining,
    LCSB skip and skip-update) on the MIL programs and on EagerRuntime, from the same state."""
    from toolchain.text.dataset import DataRow

    pdir = exported
    mil_runtime = MilRuntime(pdir)
    mil, eager = LayerLoop(pdir, mil_runtime), LayerLoop(pdir, EagerRuntime(pdir.spec))
    state = _state_views_init(pdir, seed=20)
    ref = state.clone()
    g = torch.Generator().manual_seed(21)
    for step in range(2):
        ids = torch.randint(0, ARCH.vocab, (T - 2 * step,), generator=g)
        ids, labels = pad_row(DataRow(ids, ids.clone()), T, pdir.pad_token_id, "row")
        loss = mil.train_step(ids, labels, 1e-2, state, selected)
        want = eager.train_step(ids, labels, 1e-2, ref, selected)
        assert math.isclose(loss, want, rel_tol=1e-6), (step, loss, want)
    rel = float((state - ref).abs().max() / ref.abs().max())
    print(pdir.spec.quant.kind, pdir.spec.optimizer.kind, selected, "MIL vs eager state rel diff", rel)
    assert rel <= 1e-6  # measured <= 1e-7
    assert not torch.equal(state, _state_views_init(pdir, seed=20))  # the step moved the state
    if selected is not None and pdir.moves_unselected:
        assert "block_skip_update" in mil_runtime.calls


# -- the conversion fixes, on small programs (every host) -------------------------------------------------------

class _Reciprocal(torch.nn.Module):
    def forward(self, x):
        return 1.0 / x  # exports as aten.reciprocal (RoPE's 1 / theta^(2i/d))


class _Mask(torch.nn.Module):
    def forward(self, q):
        return torch.cat((torch.bitwise_and(q, 15), torch.div(q, 16, rounding_mode="floor")), dim=0).float()


def _through_mil(module, x0: np.ndarray, rewrite) -> np.ndarray:
    import coremltools as ct

    ep = torch.export.export(module, (torch.from_numpy(x0),), strict=False).run_decompositions({})
    if rewrite is not None:
        assert rewrite(ep) == 1
    prog = ct.convert(ep, inputs=[ct.TensorType(name="x", shape=x0.shape, dtype=x0.dtype)], convert_to="milinternal",
                      minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT32,
                      pass_pipeline=ct.PassPipeline.EMPTY)
    func = prog.functions["main"]
    return _run_mil(func, {"x": x0})[func.outputs[0].name]


def test_exact_reciprocal():
    """coremltools converts `aten.reciprocal` to MIL `inverse` = 1 / (x + 1e-4); rewritten, it is 1 / x."""
    x0 = np.array([1.0, 2.0, 1e-3], dtype=np.float32)
    assert abs(_through_mil(_Reciprocal(), x0, None)[2] - 1 / 1.1e-3) < 1  # the converter's epsilon
    np.testing.assert_array_equal(_through_mil(_Reciprocal(), x0, _exact_reciprocal), np.float32(1) / x0)


def test_mask_as_remainder():
    """coremltools converts `bitwise_and` on booleans only; `x & 15` -> `x mod 16`, also for negative x."""
    x0 = np.array([0, 15, 16, 200, 255, -1, -128], dtype=np.int32)
    with pytest.raises(NotImplementedError, match="bitwise_and"):
        _through_mil(_Mask(), x0, None)
    want = torch.cat((torch.from_numpy(x0) & 15, torch.from_numpy(x0) // 16)).float().numpy()
    np.testing.assert_array_equal(_through_mil(_Mask(), x0, _mask_as_remainder), want)


# -- the Core ML runtime (macOS) -------------------------------------------------------------------------

class CoreMLRuntime:
    """The packages on the Core ML runtime (CPU, float32) behind `execute(method, inputs)`."""

    backend = "coreml"

    def __init__(self, pdir: ProgramDir) -> None:
        import coremltools as ct

        self.pdir = pdir
        self.models = {m: ct.models.MLModel(str(pdir.path / f), compute_units=ct.ComputeUnit.CPU_ONLY)
                       for m, f in _entry(pdir).methods.items()}

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        spec = self.pdir.methods[method]
        out = self.models[method].predict(_feeds(spec, inputs))
        return [torch.from_numpy(np.asarray(out[io.name], dtype=np.float32)) for io in spec.outputs]


@pytest.mark.darwin
@on_macos
def test_coreml_predictions_train_like_eager(exported):
    """Three steps through LayerLoop on Core ML against EagerRuntime (quantized programs need macOS 26)."""
    from toolchain.text.dataset import DataRow

    pdir = exported
    loop, eager = LayerLoop(pdir, CoreMLRuntime(pdir)), LayerLoop(pdir, EagerRuntime(pdir.spec))
    state = _state_views_init(pdir, seed=30)
    ref = state.clone()
    g = torch.Generator().manual_seed(31)
    for step, selected in enumerate([None, (1,), (0,)]):
        ids = torch.randint(0, ARCH.vocab, (T,), generator=g)
        ids, labels = pad_row(DataRow(ids, ids.clone()), T, 0, "row")
        loss = loop.train_step(ids, labels, 1e-2, state, selected)
        want = eager.train_step(ids, labels, 1e-2, ref, selected)
        assert math.isclose(loss, want, rel_tol=1e-4), (step, loss, want)
    rel = float((state - ref).abs().max() / ref.abs().max())
    print("Core ML vs eager, state rel diff after 3 steps", rel)
    assert rel <= 1e-4


@pytest.mark.darwin
@on_macos
def test_coreml_compute_plan_supports_every_op(exported):
    """Core ML's own compute plan: every MIL op has a device; prints where each op type runs."""
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    pdir = exported
    for name, rel in _entry(pdir).methods.items():
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

def _eager_loop(arch: ModelArch, cfg: LoraConfig, optimizer: OptimizerConfig, weights, dtype: torch.dtype):
    """LayerLoop over the eager methods of a program that is not exported (weights in memory)."""
    from toolchain.program.weights_file import weight_tensors

    spec = ProgramSpec(arch, cfg, 64, optimizer=optimizer)
    layout = state_layout(arch, cfg, optimizer)
    tensors = {k: v.to(dtype) for k, v in weight_tensors(weights, QuantSpec()).items()}
    pdir = types.SimpleNamespace(methods=method_specs(spec), moves_unselected=optimizer.moves_unselected,
                                 step_entry="adam_step" if optimizer.kind == "adamw" else None,
                                 weights=lambda: tensors, arch=arch, path="(eager)",
                                 state_views=lambda flat: unflatten_state(layout, flat))
    return LayerLoop(pdir, EagerRuntime(spec)), layout


@functools.cache
def _fp16_run(optimizer: OptimizerConfig, lr: float, steps: int, mode: str):
    """`steps` eager steps of the tiny preset on the bundled corpus (T=64, r=8 on all projections).
    mode: "fp32"; "state" (the state rounded to float16 after every step: what Core ML fp16 states
    would hold); "compute" (weights, activations and state in float16 too)."""
    from toolchain.text.dataset import bundled_examples
    from toolchain.models import get_preset
    from toolchain.text.tokenizer import ByteTokenizer

    arch, cfg = get_preset("tiny"), LoraConfig(rank=8, alpha=16)
    examples = bundled_examples(ByteTokenizer(), seq_len=64)
    loop, layout = _eager_loop(arch, cfg, optimizer, random_weights(arch, seed=0),
                               torch.float16 if mode == "compute" else torch.float32)
    init = flat_state(layout, init_lora(arch, cfg, seed=1))
    flat = init.half() if mode == "compute" else init.half().float() if mode == "state" else init.clone()
    losses = []
    for s in range(steps):
        ex = examples[s % len(examples)]
        ids, labels = pad_row(ex, 64, 0, "row")
        losses.append(loop.train_step(ids, labels, lr, flat, None))
        if mode == "state":
            flat.copy_(flat.half().float())
    return layout, init, flat.float(), losses


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["state", "compute"])
@pytest.mark.parametrize("optimizer,lr", [(OptimizerConfig("sgd"), 0.05), (OptimizerConfig("sgd"), 3e-3),
                                          (OptimizerConfig("adamw", weight_decay=0.01), 3e-3),
                                          (OptimizerConfig("adamw", weight_decay=0.01), 1e-4)],
                         ids=["sgd-0.05", "sgd-3e-3", "adamw-3e-3", "adamw-1e-4"])
def test_float16_emulation(optimizer, lr, mode):
    """200 steps in float32 vs float16 (see _fp16_run): SGD's adapter drifts by ~5-13% of its update,
    AdamW's exp_avg_sq underflows float16 and its adapter is garbage (state) or NaN (compute)."""
    steps = 200
    layout, init, f32, l32 = _fp16_run(optimizer, lr, steps, "fp32")
    _, _, f16, l16 = _fp16_run(optimizer, lr, steps, mode)
    params = [e for e in layout if e.role == "param"]
    sl = lambda f: torch.cat([f[e.offset:e.offset + e.numel] for e in params])  # noqa: E731
    d32, d16 = sl(f32) - sl(init), sl(f16) - sl(init)
    err = float((d16 - d32).norm() / d32.norm())
    v = [f16[e.offset:e.offset + e.numel] for e in layout if e.role == "exp_avg_sq"]
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
