"""The exported ONNX program, run on ONNX Runtime, against the eager step and against Hugging Face + PEFT
(float64). Exports are small (2 layers or 1, T=12) and shared per module: the dynamo exporter takes
~10-20 s of CPU per method even at this size."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from click.testing import CliRunner
from helpers import eager_program_run, hf_peft_sgd, lora_for, max_rel_diff, our_weights, random_hf_model

from toolchain.dataset import Example
from toolchain.errors import BadInput
from toolchain.export.build import MANIFEST_NAME, ExportSpec, export_program
from toolchain.export.onnx import OPSET, OUTPUT_SUFFIX, WEIGHTS_NAME
from toolchain.export.program import OptimizerSpec, QuantSpec, StepProgram
from toolchain.lcsb.plan import make_plan
from toolchain.lora import LoraConfig, lora_state_dict
from toolchain.models import Qwen25Arch
from toolchain.runtime import ProgramDir, TrainRun, run_program
from toolchain.runtime.onnx_runner import OnnxRunner
from toolchain.runtime.runners import open_runner

ARCH = Qwen25Arch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64,
                  rope_theta=10_000.0)
ARCH1 = Qwen25Arch(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
T = 12
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))


def _examples(n: int, seed: int, vocab: int = 96) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (T - (i % 3),), generator=g)  # rows shorter than T: exercises padding
        out.append(Example(ids, ids.clone()))
    return out


def _export(tmp_path_factory, name: str, arch: Qwen25Arch, *, quant="none", optimizer=OptimizerSpec(), plan=None,
            targets=("onnx",)):
    """A random float64 HF model (rounded through float32), our float32 weights read from it, and the
    program exported from those weights."""
    hf = random_hf_model(arch, torch.Generator().manual_seed(3))
    weights = our_weights(arch, hf, torch.float32)
    lora = lora_for(arch, CFG, seed=4, dtype=torch.float32)
    out = tmp_path_factory.mktemp(name) / "prog"
    spec = ExportSpec(source="test", init="random", seed=3, seq_len=T, quant=QuantSpec(quant, 16), optimizer=optimizer,
                      plan=plan, pad_token_id=0, targets=targets)
    export_program(arch, weights, CFG, lora, spec, out)
    return out, hf, weights, lora


@pytest.fixture(scope="module")
def fp32_sgd(tmp_path_factory):
    return _export(tmp_path_factory, "fp32", ARCH)


@pytest.fixture(scope="module")
def int4_adamw_lcsb(tmp_path_factory):
    return _export(tmp_path_factory, "int4", ARCH, quant="int4", optimizer=OptimizerSpec("adamw", weight_decay=0.01),
                   plan=make_plan(ARCH.layers, 1, "cyclic"))


def _run(prog, examples, steps, lr):
    pdir = ProgramDir(prog)
    return pdir, run_program(pdir, OnnxRunner(pdir, threads=1), examples, TrainRun(steps=steps, lr=lr))




def test_fp32_sgd_on_onnxruntime_trains_like_eager_and_hf_peft_float64(fp32_sgd):
    prog, hf, weights, lora = fp32_sgd
    examples, steps, lr = _examples(3, seed=5), 5, 0.05
    pdir, res = _run(prog, examples, steps, lr)
    trained = lora_state_dict(pdir.lora_from_state(res.state))
    eager_losses, eager_flat = eager_program_run(pdir, StepProgram(ARCH, weights, CFG), lora, examples, steps, lr)
    eager = lora_state_dict(pdir.lora_from_state(eager_flat))
    hf_losses, hf_sd = hf_peft_sgd(hf, CFG, lora, examples, steps, lr)
    print("onnx vs eager", max_rel_diff(trained, eager), "onnx vs HF+PEFT float64", max_rel_diff(trained, hf_sd))
    assert max_rel_diff(trained, eager) <= 1e-4
    assert max_rel_diff(trained, hf_sd) <= 1e-4
    for a, b, c in zip(res.losses, eager_losses, hf_losses):
        assert math.isclose(a, b, rel_tol=1e-5) and math.isclose(a, c, rel_tol=1e-5), (a, b, c)
    assert max_rel_diff(trained, lora_state_dict(lora)) > 1e-3  # the adapter really moved


def test_int4_adamw_lcsb_phase_methods_match_eager(int4_adamw_lcsb):
    prog, _, weights, lora = int4_adamw_lcsb
    examples, steps, lr = _examples(2, seed=6), 4, 1e-2
    pdir, res = _run(prog, examples, steps, lr)
    assert pdir.train_methods() == ["train_step_p0", "train_step_p1"]
    program = StepProgram(ARCH, weights, CFG, optimizer=OptimizerSpec("adamw", weight_decay=0.01),
                          quant=QuantSpec("int4", 16))
    eager_losses, eager_flat = eager_program_run(pdir, program, lora, examples, steps, lr)
    for s, (a, b) in enumerate(zip(res.losses, eager_losses)):
        assert math.isclose(a, b, rel_tol=1e-5), (s, a, b)
    assert torch.isfinite(res.state).all()
    rel = float((res.state - eager_flat).abs().max() / eager_flat.abs().max())
    print("state rel diff", rel)
    assert rel <= 1e-4
    assert float(res.state[-1]) == steps  # adam_step, the last entry


def test_int8_program_matches_eager(tmp_path_factory):
    prog, _, weights, lora = _export(tmp_path_factory, "int8", ARCH1, quant="int8",
                                     optimizer=OptimizerSpec("sgd", weight_decay=0.1))
    examples, steps, lr = _examples(2, seed=9), 3, 0.05
    pdir, res = _run(prog, examples, steps, lr)
    program = StepProgram(ARCH1, weights, CFG, optimizer=OptimizerSpec("sgd", weight_decay=0.1),
                          quant=QuantSpec("int8", 16))
    eager_losses, eager_flat = eager_program_run(pdir, program, lora, examples, steps, lr)
    for a, b in zip(res.losses, eager_losses):
        assert math.isclose(a, b, rel_tol=1e-5)
    assert float((res.state - eager_flat).abs().max() / eager_flat.abs().max()) <= 1e-4


def _graphs(prog):
    import onnx

    pdir = ProgramDir(prog)
    entry = next(p for p in pdir.manifest["programs"] if p["target"] == "onnx")
    return pdir, entry, {m: onnx.load(str(prog / f), load_external_data=False) for m, f in entry["methods"].items()}


def test_graphs_have_the_manifest_io_one_shared_weights_file_and_pass_the_checker(int4_adamw_lcsb):
    import onnx

    prog = int4_adamw_lcsb[0]
    pdir, entry, graphs = _graphs(prog)
    assert entry["opset"] == OPSET and entry["weights_file"] == f"onnx/{WEIGHTS_NAME}"
    assert entry["methods"] == {m: f"onnx/{m}.onnx" for m in ("train_step_p0", "train_step_p1")}
    locations = set()
    for name, g in graphs.items():
        onnx.checker.check_model(str(prog / entry["methods"][name]), full_check=True)
        assert {o.version for o in g.opset_import if o.domain in ("", "ai.onnx")} == {OPSET}
        spec = pdir.method(name)
        assert [i.name for i in g.graph.input] == [io["name"] for io in spec["inputs"]]
        assert [o.name for o in g.graph.output] == (["loss"] + [io["name"] + OUTPUT_SUFFIX for io in spec["outputs"][1:]])
        external = [t for t in g.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert any(t.name == "program.embed" for t in external)
        # every initializer of 1 KiB or more is external
        assert all(len(t.raw_data) < 1024 for t in g.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL)
        locations |= {kv.value for t in external for kv in t.external_data if kv.key == "location"}
        assert not any(n.metadata_props for n in g.graph.node)  # no exporter stack traces (host paths)
        # no identity Transpose (the exporter emits one on the whole embedding for `head[labels]`)
        perms = [list(a.ints) for n in g.graph.node if n.op_type == "Transpose" for a in n.attribute if a.name == "perm"]
        assert perms and all(p != list(range(len(p))) for p in perms)
    assert locations == {WEIGHTS_NAME}
    # the weights are stored once for both phase methods (twice would be >= 2x)
    frozen_bytes = pdir.manifest["memory_plan"]["constant_bytes"]
    assert (prog / "onnx" / WEIGHTS_NAME).stat().st_size < 1.5 * frozen_bytes


def test_int4_weights_stay_packed_in_the_weights_file(int4_adamw_lcsb):
    """The dequantization runs inside the graph (BitwiseAnd on the uint8 nibbles); nothing derived
    from a frozen weight is folded into a new initializer at export."""
    import onnx

    _, _, graphs = _graphs(int4_adamw_lcsb[0])
    for g in graphs.values():
        ops = {n.op_type for n in g.graph.node}
        assert "BitwiseAnd" in ops
        packed = [t for t in g.graph.initializer if t.name.endswith("_proj_q")]
        assert packed and all(t.data_type == onnx.TensorProto.UINT8 for t in packed)
        shapes = {tuple(ARCH.linear_shape(t)) for t in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj")}
        assert not any(t.data_type == onnx.TensorProto.FLOAT and tuple(t.dims) in shapes for t in g.graph.initializer)


def test_cli_train_with_an_onnx_program(fp32_sgd, tmp_path):
    from toolchain.cli import cli
    from toolchain.lora import load_adapter

    prog = fp32_sgd[0]
    data = tmp_path / "data.jsonl"
    examples = _examples(3, seed=7)
    data.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist()}) + "\n" for ex in examples))
    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, ["train", "--program", str(prog), "--data", str(data), "--steps", "3",
                                      "--lr", "0.05", "--adapter-out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    _, expected = _run(prog, examples, 3, 0.05)
    assert doc["losses"] == pytest.approx(expected.losses, rel=1e-6)
    _, trained = load_adapter(out, ARCH)
    torch.testing.assert_close(lora_state_dict(trained), lora_state_dict(ProgramDir(prog).lora_from_state(expected.state)))


def test_open_runner_picks_onnx_and_rejects_a_program_without_it(fp32_sgd, tmp_path):
    prog = fp32_sgd[0]
    pdir = ProgramDir(prog)
    assert pdir.targets == ["onnx"]
    assert open_runner(pdir).backend == "onnx"
    copy = tmp_path / "prog"
    shutil.copytree(prog, copy)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["programs"][0]["target"] = "coreml"
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BadInput, match="no onnx program"):
        OnnxRunner(ProgramDir(copy))


def test_a_graph_whose_outputs_differ_from_the_manifest_is_rejected(fp32_sgd, tmp_path):
    prog = fp32_sgd[0]
    copy = tmp_path / "prog"
    shutil.copytree(prog, copy)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["methods"][0]["outputs"] = manifest["methods"][0]["outputs"][:-1]
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BadInput, match="inputs/outputs"):
        OnnxRunner(ProgramDir(copy))


def test_bench_onnx_mode_needs_a_program():
    from toolchain.bench.memory import MemoryBenchConfig, check_config

    with pytest.raises(BadInput, match="--modes onnx needs --program"):
        check_config(MemoryBenchConfig(modes=("mesp", "onnx")))


@pytest.mark.slow
def test_one_manifest_describes_executorch_and_onnx_programs_that_train_alike(tmp_path_factory):
    from toolchain.runtime.executorch_runner import ExecutorchRunner

    prog, _, _, _ = _export(tmp_path_factory, "both", ARCH1, targets=("executorch", "onnx"))
    pdir = ProgramDir(prog)
    assert pdir.targets == ["executorch", "onnx"]
    examples, steps, lr = _examples(2, seed=11), 3, 0.05
    et = run_program(pdir, ExecutorchRunner(pdir.program_file("executorch"), pdir.train_methods()), examples,
                     TrainRun(steps=steps, lr=lr))
    ox = run_program(pdir, OnnxRunner(pdir), examples, TrainRun(steps=steps, lr=lr))
    assert ox.losses == pytest.approx(et.losses, rel=1e-5)
    assert float((ox.state - et.state).abs().max() / et.state.abs().max()) <= 1e-5
