"""`toolchain export --compute int8`: the training methods multiply the int4 frozen weights with int8 activations
through the native kernels (`toolchain::int4_linear_a8`, `toolchain::int4_dyw_a8`) on the real ExecuTorch runtime,
and equal the same methods run eagerly on the kernels' PyTorch references; the manifest says `compute: int8` and
the training methods list the kernels they call; bad input and a runtime without the kernels are refused with one
clear message. A small program (3 layers, T=16, int4 group 16). The gradient bound against fp32 is the eager
step's (tests/mesp/ops/test_int8.py), since the program is the eager step."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from compute_programs import COMPUTE_T as T
from compute_programs import compute_arch

from toolchain.cli import cli
from toolchain.errors import BadInput
from toolchain.program import ProgramDir
from toolchain.program.spec import INT8_KERNELS
from toolchain.runtime import EagerRuntime
from toolchain.runtime.program_runtime import open_runtime

ARCH = compute_arch(hidden=64, intermediate=96)


@pytest.fixture(scope="module")
def programs(export_computes):
    from toolchain.mesp import StepOptions
    from toolchain.native import KernelUnavailable, load_kernels

    try:
        load_kernels()
    except KernelUnavailable as e:
        pytest.skip(f"native kernels unavailable here: {e}")
    return export_computes(ARCH, ("fp32", "int8"), options=StepOptions(loss_chunk=T, vocab_chunk=32, mlp_chunk=32))


def _executorch(pdir):
    return open_runtime(pdir, "executorch", threads=1)


def _eager(pdir):
    return EagerRuntime(pdir.spec)


def test_manifest_states_int8_and_the_training_methods_list_their_kernels(programs):
    m = json.loads((programs["int8"] / "manifest.json").read_text())
    assert m["compute"] == "int8" and ProgramDir(programs["int8"]).spec.compute == "int8"
    assert set(INT8_KERNELS) == {"toolchain::int4_linear_a8.out", "toolchain::int4_dyw_a8.out",
                                 "toolchain::int4_dyw_a8_acc.out", "toolchain::lora_linear_a8.out",
                                 "toolchain::lora_linear_a8_rows.out",
                                 "toolchain::attention_train.out", "toolchain::attention_train_backward.out",
                                 "toolchain::swiglu.out", "toolchain::swiglu_train.out",
                                 "toolchain::online_softmax_stats.out", "toolchain::exp_sub_rows.out",
                                 "toolchain::lora_backward.out", "toolchain::lora_rows_backward.out",
                                 "toolchain::rms_norm.out", "toolchain::rope_train.out",
                                 "toolchain::rope_train_backward.out", "toolchain::rms_norm_backward.out"}
    methods = {x["name"]: x for x in m["methods"]}
    for name in ("block_forward", "head_loss", "block_backward"):
        assert methods[name]["kernels"] == list(INT8_KERNELS)
    assert "kernels" not in methods["embed"]                              # a lookup: no product
    # generation is not changed by --compute (here: exported without it in both)
    m32 = json.loads((programs["fp32"] / "manifest.json").read_text())
    assert m["generate"] == m32["generate"]
    assert [p["target"] for p in m["programs"]] == ["executorch"]


def test_the_listed_kernels_are_the_native_operators_the_program_calls(programs):
    """What a runtime is asked to have (the manifest's `kernels`) is read from the program itself: every
    `toolchain::` operator in a training method's execution plan is listed for it, and every listed kernel is called
    by some method, so an app's kernel probe refuses exactly the programs its runtime cannot run."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary((programs["int8"] / "model.pte").read_bytes())
    plans = getattr(pte, "program", pte).execution_plan
    called = {plan.name: {f"{op.name}.{op.overload}" for op in plan.operators if op.name.startswith("toolchain::")}
              for plan in plans}
    methods = {x["name"]: x for x in json.loads((programs["int8"] / "manifest.json").read_text())["methods"]}
    for name, ops in called.items():
        assert ops <= set(methods[name].get("kernels", ())), (name, sorted(ops))
    assert set().union(*called.values()) == set(INT8_KERNELS)


def test_int8_program_on_the_runtime_equals_the_eager_methods(programs):
    """The runtime (native kernels) computes what the eager methods compute (the kernels' PyTorch references):
    the integer sums are exact in both; only float32 summation orders differ (the blocks' and groups' partial
    sums, XNNPACK's float GEMMs of the LoRA terms and attention); and it is not the float32 program."""
    examples = programs.rows(3, seed=5)
    res = programs.train("int8", _executorch, examples)
    ref = programs.train("int8", _eager, examples)
    res32 = programs.train("fp32", _executorch, examples)
    print(f"int8 runtime vs eager: losses {res.losses} vs {ref.losses}; state max rel "
          f"{float((res.state - ref.state).abs().max() / ref.state.abs().max()):.1e}")
    assert res.losses == pytest.approx(ref.losses, rel=1e-5)
    assert float((res.state - ref.state).abs().max() / ref.state.abs().max()) <= 1e-4
    assert res.losses != res32.losses


def test_a_runtime_without_the_native_kernels_refuses_the_int8_program(programs, monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLCHAIN_NATIVE_KERNELS", "0")
    with pytest.raises(BadInput, match=r"int8 .*block_forward.*toolchain::int4_dyw_a8\.out.*NATIVE_KERNELS is 0"):
        open_runtime(ProgramDir(programs["int8"]), "executorch")
    open_runtime(ProgramDir(programs["fp32"]), "executorch")              # an fp32 program does not need them
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": list(range(1, T + 1)), "labels": list(range(1, T + 1))}) + "\n")
    res = CliRunner().invoke(cli, ["train", "--program", str(programs["int8"]), "--steps", "1", "--data", str(data)])
    assert res.exit_code != 0 and res.output.count("Error:") == 1 and "--compute int8" in res.output, res.output


def test_a_kernel_library_that_cannot_load_refuses_it_naming_why(programs, monkeypatch):
    import toolchain.runtime.program_runtime as program_runtime

    monkeypatch.setattr(program_runtime, "_native_kernels", lambda: "no C++ compiler found (g++ or $CXX)")
    with pytest.raises(BadInput, match=r"does not have \(no C\+\+ compiler found"):
        open_runtime(ProgramDir(programs["int8"]), "executorch", use="eval")


BASE = ["export", "--model", "tiny", "--init", "random", "--seq-len", "16", "--rank", "2", "--no-generate"]


@pytest.mark.parametrize("extra, message", [
    (["--compute", "int8", "--quant", "none"], "--compute int8 needs an int4 base (--quant int4)"),
    (["--compute", "int8", "--quant", "int8"], "--compute int8 needs an int4 base (--quant int4)"),
    (["--compute", "int8", "--target", "onnx"], "--target executorch only"),
    (["--compute", "int8", "--target", "coreml"], "--target executorch only"),
    (["--compute", "int8", "--target", "executorch,onnx"], "which onnx cannot run"),
    (["--compute", "int8", "--vocab-chunk", "0"], "needs vocabulary chunks"),
])
def test_bad_int8_compute_exits_2_with_one_error_line_and_writes_nothing(tmp_path, extra, message):
    out = tmp_path / "prog"
    result = CliRunner().invoke(cli, BASE + extra + ["--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.count("Error:") == 1
    assert not out.exists() and not any(p.name.startswith(".prog.") for p in tmp_path.iterdir())
