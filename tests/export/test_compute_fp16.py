"""`toolchain export --compute fp16`: the program's training methods multiply the frozen weights in float16 on
the real ExecuTorch runtime (XNNPACK's f16 GEMMs), equal the same methods run eagerly, and stay within the
stated bound of the float32 program (mesp/ops/half.py; tests/mesp/ops/test_half.py states it on the eager
step); the fp32 default is untouched (its manifest has no `compute`); bad input and runtimes without float16
kernels are refused with one clear message. Small programs (3 layers, T=16), every weight matmul delegated
(the FLOP threshold at 0, as tests/export/test_executorch.py does, since no tiny matmul reaches 16 MFLOP)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from compute_programs import compute_arch

from toolchain.cli import cli
from toolchain.errors import BadInput
from toolchain.program import ProgramDir
from toolchain.runtime import EagerRuntime
from toolchain.runtime.executorch_runtime import ExecuTorchRuntime
from toolchain.runtime.program_runtime import open_runtime

ARCH = compute_arch(hidden=32, intermediate=64)


@pytest.fixture(scope="module")
def programs(export_computes):
    import toolchain.export.executorch as et

    saved, et.XNNPACK_MIN_FLOPS = et.XNNPACK_MIN_FLOPS, 0.0
    try:
        return export_computes(ARCH, ("fp32", "fp16"))
    finally:
        et.XNNPACK_MIN_FLOPS = saved


def _executorch(pdir):
    return ExecuTorchRuntime(pdir.program_file("executorch"), list(pdir.methods))


def _eager(pdir):
    return EagerRuntime(pdir.spec)


def test_manifest_states_compute_only_when_fp16(programs):
    m16 = json.loads((programs["fp16"] / "manifest.json").read_text())
    m32 = json.loads((programs["fp32"] / "manifest.json").read_text())
    assert m16["compute"] == "fp16" and "compute" not in m32
    assert ProgramDir(programs["fp16"]).spec.compute == "fp16"
    assert ProgramDir(programs["fp32"]).spec.compute == "fp32"
    assert m16["programs"][0]["delegate"] == m32["programs"][0]["delegate"] == "xnnpack"


def test_fp16_program_runs_float16_gemms_on_the_runtime_and_equals_eager(programs):
    """The runtime computes what the eager methods compute (both: float16 operands and products, float32
    elsewhere), and it is not the float32 program: its rounding shows."""
    examples = programs.rows(3, seed=5)
    res = programs.train("fp16", _executorch, examples)
    ref = programs.train("fp16", _eager, examples)
    res32 = programs.train("fp32", _executorch, examples)
    assert res.losses == pytest.approx(ref.losses, rel=1e-5)
    assert float((res.state - ref.state).abs().max() / ref.state.abs().max()) <= 1e-4
    assert res.losses != res32.losses


def test_fp16_program_gradients_are_within_the_stated_bound_of_fp32(programs):
    """One SGD step from the same state: the state change is -lr * grad, so the two programs' gradients are
    compared on the runtime: cosine >= 0.9999 and relative L2 error <= 1e-2 (the bound of mesp/ops/half.py)."""
    examples, lr = programs.rows(1, seed=7), 1e-3
    init = ProgramDir(programs["fp32"]).state_init()
    assert torch.equal(init, ProgramDir(programs["fp16"]).state_init())
    g = {c: (init - programs.train(c, _executorch, examples, steps=1, lr=lr).state).double() / lr
         for c in ("fp32", "fp16")}
    a, b = g["fp32"], g["fp16"]
    cos = float(a @ b / (a.norm() * b.norm()))
    rel = float((b - a).norm() / a.norm())
    print(f"fp16 vs fp32 program gradient: cosine {cos:.7f}, rel L2 {rel:.2e}")
    assert cos >= 0.9999 and rel <= 1e-2


def test_a_runtime_without_float16_kernels_refuses_the_program(programs, monkeypatch):
    """What XNNPACK does where it has no float16 GEMM (seen here with bfloat16 GEMMs on runtime weights:
    "Failed to create linear node ... xnn_status_invalid_parameter" and the method fails to load) becomes one
    BadInput naming the cause and the fix; an fp32 program's load failure keeps its own message."""
    from executorch.runtime import Program

    def no_half(self, name):
        raise RuntimeError(f"Failed to load method {name}, error: 0x:1")

    monkeypatch.setattr(Program, "load_method", no_half)
    with pytest.raises(BadInput, match=r"float16 .*no float16 kernels.*--compute fp32"):
        open_runtime(ProgramDir(programs["fp16"]), "executorch")
    with pytest.raises(BadInput) as e:
        open_runtime(ProgramDir(programs["fp32"]), "executorch")
    assert "float16" not in str(e.value)


BASE = ["export", "--model", "tiny", "--init", "random", "--seq-len", "16", "--rank", "2", "--no-generate"]


@pytest.mark.parametrize("extra, message", [
    (["--compute", "bf16"], "'bf16' is not one of 'fp32', 'fp16', 'int8'"),
    (["--compute", "fp16", "--quant", "none"], "needs a quantized base"),
    (["--compute", "fp16", "--target", "executorch,onnx"], "--target executorch with XNNPACK only"),
    (["--compute", "fp16", "--no-xnnpack"], "--target executorch with XNNPACK only"),
])
def test_bad_compute_exits_2_with_one_error_line_and_writes_nothing(tmp_path, extra, message):
    out = tmp_path / "prog"
    result = CliRunner().invoke(cli, BASE + extra + ["--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.count("Error:") == 1
    assert not out.exists() and not any(p.name.startswith(".prog.") for p in tmp_path.iterdir())
