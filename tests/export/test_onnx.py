"""The exported ONNX program (one graph per method, weights and LoRA state as inputs), run on ONNX
Runtime by the host's layer loop, against the eager reference runtime (the same method modules in
PyTorch, driven by the same loop) and against Hugging Face + PEFT in float64. Exports are small
(2 layers, T=16) and shared per module: ~10-15 s of CPU each with the dynamo exporter."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from helpers import hf_peft_sgd, lora_for, max_rel_diff, our_weights, random_hf_model

from toolchain.contract import MANIFEST_NAME, TRAINING_ROLES, sha256_file
from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput
from toolchain.export.build import ExportSpec, export_program
from toolchain.export.onnx import ONNX_DIR, OPSET
from toolchain.lcsb.plan import make_plan
from toolchain.lora import LoraConfig, lora_state_dict
from toolchain.models import ModelArch
from toolchain.optim import OptimizerConfig
from toolchain.program import ProgramDir
from toolchain.program.spec import QuantSpec
from toolchain.runtime import EagerRuntime, LayerLoop
from toolchain.runtime.onnx_runtime import OnnxRuntime
from toolchain.runtime.program_runtime import open_runtime
from toolchain.training import TrainRun, run_program

ARCH = ModelArch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64,
                  rope_theta=10_000.0)
T = 16
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
ADAMW = OptimizerConfig("adamw", weight_decay=0.01)


def _examples(n: int, seed: int) -> list[DataRow]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, ARCH.vocab, (T - (i % 3),), generator=g)  # rows shorter than T: exercises padding
        out.append(DataRow(ids, ids.clone()))
    return out


def _export(tmp_path_factory, name: str, *, quant="none", optimizer=OptimizerConfig()):
    """A random float64 HF model (rounded through float32), our float32 weights read from it, and the
    program exported from those weights."""
    hf = random_hf_model(ARCH, torch.Generator().manual_seed(3))
    weights = our_weights(ARCH, hf, torch.float32)
    lora = lora_for(ARCH, CFG, seed=4, dtype=torch.float32)
    out = tmp_path_factory.mktemp(name) / "prog"
    spec = ExportSpec(source="test", init="random", seed=3, seq_len=T, quant=QuantSpec(quant, 16), optimizer=optimizer,
                      pad_token_id=0, targets=("onnx",))
    export_program(ARCH, weights, CFG, lora, spec, out)
    return out, hf, lora


@pytest.fixture(scope="module")
def fp32_sgd(tmp_path_factory):
    return _export(tmp_path_factory, "fp32")


@pytest.fixture(scope="module")
def int4_adamw(tmp_path_factory):
    return _export(tmp_path_factory, "int4", quant="int4", optimizer=ADAMW)


def _run_both(prog, examples, run: TrainRun):
    """The same run on ONNX Runtime and on the eager reference runtime (both through run_program's LayerLoop)."""
    pdir = ProgramDir(prog)
    onnx = run_program(pdir, OnnxRuntime(pdir, threads=1), examples, run)
    eager = run_program(pdir, EagerRuntime(pdir.spec), examples, run)
    return pdir, onnx, eager


def test_fp32_sgd_on_onnxruntime_trains_like_eager_and_hf_peft_float64(fp32_sgd):
    prog, hf, lora = fp32_sgd
    examples, steps, lr = _examples(3, seed=5), 5, 0.05
    pdir, res, ref = _run_both(prog, examples, TrainRun(steps=steps, lr=lr))
    trained = lora_state_dict(pdir.lora_from_state(res.state))
    eager = lora_state_dict(pdir.lora_from_state(ref.state))
    hf_losses, hf_sd = hf_peft_sgd(hf, CFG, lora, examples, steps, lr)
    print("onnx vs eager", max_rel_diff(trained, eager), "onnx vs HF+PEFT float64", max_rel_diff(trained, hf_sd))
    assert set(trained) == set(hf_sd)
    assert max_rel_diff(trained, eager) <= 1e-4
    assert max_rel_diff(trained, hf_sd) <= 1e-4
    for a, b, c in zip(res.losses, ref.losses, hf_losses):
        assert math.isclose(a, b, rel_tol=1e-5) and math.isclose(a, c, rel_tol=1e-5), (a, b, c)
    assert max_rel_diff(trained, lora_state_dict(lora)) > 1e-3  # the adapter really moved


def test_int4_adamw_lcsb_matches_eager(int4_adamw):
    prog = int4_adamw[0]
    examples, steps, lr = _examples(2, seed=6), 4, 1e-2
    pdir = ProgramDir(prog)
    assert set(pdir.methods) == set(TRAINING_ROLES)  # AdamW moves unselected layers: block_skip_update too
    pdir, res, ref = _run_both(prog, examples, TrainRun(steps=steps, lr=lr, plan=make_plan(ARCH.layers, 1, "cyclic")))
    for s, (a, b) in enumerate(zip(res.losses, ref.losses)):
        assert math.isclose(a, b, rel_tol=1e-5), (s, a, b)
    assert torch.isfinite(res.state).all()
    rel = float((res.state - ref.state).abs().max() / ref.state.abs().max())
    print("state rel diff", rel)
    assert rel <= 1e-4
    views = pdir.state_views(res.state)
    assert float(views["adam_step"][0]) == steps
    init = pdir.state_views(pdir.state_init())
    # both layers' moments moved (each was selected for some steps and skip-updated on the others)
    assert all(not torch.equal(views[f"adam_v_{i}_q_proj_a"], init[f"adam_v_{i}_q_proj_a"]) for i in range(ARCH.layers))


def _graphs(prog):
    import onnx

    pdir = ProgramDir(prog)
    entry = pdir.program("onnx")
    return pdir, entry, {m: onnx.load(str(prog / f)) for m, f in entry.methods.items()}


@pytest.mark.parametrize("which", ["fp32_sgd", "int4_adamw"])
def test_graphs_take_the_weights_as_inputs_and_hold_none(which, request):
    import onnx

    prog = request.getfixturevalue(which)[0]
    pdir, entry, graphs = _graphs(prog)
    assert entry.file == ONNX_DIR and entry.details["opset"] == OPSET
    assert entry.methods == {m: f"{ONNX_DIR}/{m}.onnx" for m in pdir.methods}
    assert not list((prog / ONNX_DIR).glob("*.bin")) and not list((prog / ONNX_DIR).glob("*.data"))  # no external data
    for name, g in graphs.items():
        onnx.checker.check_model(g, full_check=True)
        method = pdir.methods[name]
        assert {o.version for o in g.opset_import if o.domain in ("", "ai.onnx")} == {OPSET}
        assert [i.name for i in g.graph.input] == [io.name for io in method.inputs]
        assert [o.name for o in g.graph.output] == [io.name for io in method.outputs]
        sizes = {t.name: len(t.raw_data) or 4 * math.prod(t.dims) for t in g.graph.initializer}
        assert all(n <= 4096 for n in sizes.values()), sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in g.graph.initializer)
        assert not any(n.metadata_props for n in g.graph.node)  # no exporter stack traces (host paths)
        weights = {io.name for io in method.inputs if io.bind == "weight"}
        # no identity Transpose of a weight (the exporter emits one for `embed[ids]`, `head[labels]`)
        assert not any(n.op_type == "Transpose" and set(n.input) & weights for n in g.graph.node), name
        if which == "int4_adamw" and name in ("block_forward", "block_backward"):
            assert "BitwiseAnd" in {n.op_type for n in g.graph.node}  # dequantized in the graph, from uint8
            assert {i.type.tensor_type.elem_type for i in g.graph.input if i.name.endswith("_q")} == {
                onnx.TensorProto.UINT8}


def _copy(prog, tmp_path):
    copy = tmp_path / "prog"
    shutil.copytree(prog, copy)
    return copy


def _edit_manifest(copy, edit) -> None:
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    edit(manifest)
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_the_session_io_check_refuses_a_mismatching_program(fp32_sgd, tmp_path):
    import onnx

    prog = fp32_sgd[0]
    # a method file that is another method's graph
    swapped = _copy(prog, tmp_path / "swapped")
    _edit_manifest(swapped, lambda m: m["programs"][0]["methods"].update(block_forward="onnx/head_loss.onnx"))
    with pytest.raises(BadInput, match="block_forward does not have the manifest's inputs/outputs; re-export"):
        OnnxRuntime(ProgramDir(swapped))
    # a graph whose output is named differently (checksums updated, so only the I/O check can catch it)
    renamed = _copy(prog, tmp_path / "renamed")
    path = renamed / ONNX_DIR / "block_forward.onnx"
    g = onnx.load(str(path))
    for node in g.graph.node:
        node.output[:] = ["x_new" if o == "x_out" else o for o in node.output]
    g.graph.output[0].name = "x_new"
    onnx.save(g, str(path))
    _edit_manifest(renamed, lambda m: m["files"].update({f"{ONNX_DIR}/block_forward.onnx": sha256_file(path)}))
    with pytest.raises(BadInput, match="block_forward does not have the manifest's inputs/outputs"):
        OnnxRuntime(ProgramDir(renamed))
    # a program without an onnx export
    other = _copy(prog, tmp_path / "other")
    _edit_manifest(other, lambda m: m["programs"][0].update(target="coreml"))
    with pytest.raises(BadInput, match="no onnx program"):
        OnnxRuntime(ProgramDir(other))


def test_open_runtime_picks_onnx_and_its_loop_trains_one_state_in_place(fp32_sgd):
    """What `toolchain train --program` and `bench memory --modes onnx` run: open_runtime + LayerLoop."""
    prog = fp32_sgd[0]
    pdir = ProgramDir(prog)
    runtime = open_runtime(pdir, threads=1)
    assert pdir.targets == ["onnx"] and runtime.backend == "onnx"
    loop, state = LayerLoop(pdir, runtime), pdir.state_init()
    ex = _examples(1, seed=7)[0]
    first = loop.train_step(ex.input_ids, ex.labels, 0.05, state)
    second = loop.train_step(ex.input_ids, ex.labels, 0.05, state)
    assert math.isfinite(first) and second < first
    assert not torch.equal(state, pdir.state_init())
