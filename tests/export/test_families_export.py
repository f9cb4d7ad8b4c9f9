"""Qwen3 and Llama 3 programs (tiny configs: head_dim != hidden / heads; q/k norms; llama3 rope scaling; tied
and untied heads) exported to ExecuTorch and ONNX: they train like the eager methods and like Hugging Face
`Qwen3ForCausalLM` / `LlamaForCausalLM` + PEFT (SGD, float64 reference), and their held-out eval and greedy
generation equal HF's (`generate(do_sample=False)` with the adapter), through test_generate_eval's checks.
The int4 qwen3 program also runs the fused generation methods (q/k norms as `toolchain::rms_norm` on the heads'
rows) on ExecuTorch against their eager reference."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import hf_peft_sgd, max_rel_diff
from test_generate_eval import CFG, Case, _check_case

from toolchain.text.dataset import DataRow
from toolchain.lora import lora_state_dict
from toolchain.models import ModelArch, RopeScaling
from toolchain.runtime import EagerRuntime
from toolchain.training import TrainRun, run_program

# qwen3: GQA 4:2, head_dim 6 (hidden 28 != 4 * 6), tied; llama: MQA 3:1, head_dim 12 (hidden 24 != 36), untied,
# llama3 scaling with an original context of 8 (shorter than the rows: every frequency band is used)
QWEN3 = ModelArch(family="qwen3", hidden=28, layers=2, heads=4, kv_heads=2, head_dim=6, intermediate=40, vocab=80,
                  max_positions=64)
LLAMA = ModelArch(family="llama", hidden=24, layers=2, heads=3, kv_heads=1, head_dim=12, intermediate=36, vocab=70,
                  max_positions=64, rms_eps=1e-5, rope_theta=500_000.0, tie_embeddings=False,
                  rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_positions=8))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return Case(tmp_path_factory, "qwen3", QWEN3, "none", seed=46)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return Case(tmp_path_factory, "llama", LLAMA, "none", seed=32)


@pytest.fixture(scope="module")
def qwen3_int4(tmp_path_factory):
    return Case(tmp_path_factory, "qwen3_int4", QWEN3, "int4", seed=38, prefill_chunk=5)


def _examples(arch: ModelArch, n: int, seed: int) -> list[DataRow]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, arch.vocab, (24 - 2 * i,), generator=g)
        out.append(DataRow(ids, ids.clone()))
    return out


def _check_training(case: Case) -> None:
    pdir = case.pdir
    assert pdir.spec.arch == case.arch                           # the manifest carries the family's flags
    arch_json = pdir.model.arch
    assert (arch_json["family"], arch_json["head_dim"], arch_json["qk_norm"]) == (
        case.arch.family, case.arch.head_dim, case.arch.qk_norm)
    inputs = {i.name for i in pdir.methods["block_backward"].inputs}
    assert ({"w_q_norm", "w_k_norm"} <= inputs) == case.arch.qk_norm and "w_q_bias" not in inputs
    examples, steps, lr = _examples(case.arch, 3, seed=5), 4, 0.05
    eager = run_program(pdir, EagerRuntime(pdir.spec), examples, TrainRun(steps=steps, lr=lr))
    eager_sd = lora_state_dict(pdir.lora_from_state(eager.state))
    import copy

    hf_losses, hf_sd = hf_peft_sgd(copy.deepcopy(case.hf), CFG, case.lora, examples, steps, lr)
    assert max_rel_diff(eager_sd, hf_sd) <= 1e-4
    for a, c in zip(eager.losses, hf_losses):
        assert math.isclose(a, c, rel_tol=1e-5), (eager.losses, hf_losses)
    for target in ("executorch", "onnx"):
        res = run_program(pdir, case.runtime(target, "train"), examples, TrainRun(steps=steps, lr=lr))
        trained = lora_state_dict(pdir.lora_from_state(res.state))
        assert max_rel_diff(trained, eager_sd) <= 1e-5, target
        for a, b in zip(res.losses, eager.losses):
            assert math.isclose(a, b, rel_tol=1e-5), (target, res.losses, eager.losses)
    assert max_rel_diff(eager_sd, lora_state_dict(case.lora)) > 1e-3  # the adapter really moved


@pytest.mark.parametrize("which", ["qwen3", "llama"])
def test_programs_train_like_eager_and_hf_peft(which, request):
    _check_training(request.getfixturevalue(which))


@pytest.mark.parametrize("which", ["qwen3", "llama"])
def test_eval_and_greedy_equal_hf_peft_on_executorch_onnx_eager(which, request):
    _check_case(request.getfixturevalue(which))


def test_qwen3_int4_fused_generation_equals_its_eager_reference(qwen3_int4):
    assert "block_decode_fused" in qwen3_int4.pdir.methods
    _check_case(qwen3_int4)


@pytest.mark.slow
def test_llama_int4_fused_generation_with_scaled_rope_equals_its_eager_reference(tmp_path_factory):
    """The fused decode block with llama3-scaled RoPE (rotated by the stock ops inside the fused method)."""
    case = Case(tmp_path_factory, "llama_int4", LLAMA, "int4", seed=34, prefill_chunk=5)
    assert "block_decode_fused" in case.pdir.methods
    _check_case(case)


def test_llama_without_a_registry_vocabulary_takes_prompt_ids(llama):
    """No registry package ships Llama's vocabulary: `--prompt TEXT` is one Error: line saying so, `--prompt-ids`
    generates."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    prog = str(llama.prog)
    assert llama.pdir.tokenizer.kind == "none"
    res = CliRunner().invoke(cli, ["generate", "--program", prog, "--prompt", "hello", "--max-new-tokens", "2"])
    assert res.exit_code == 2                                            # bad input (README: exit code 2)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "no vocabulary of this model ships" in lines[0]
    assert "--prompt-ids" in lines[0]
    res = CliRunner().invoke(cli, ["generate", "--program", prog, "--prompt-ids", "5,17,3", "--max-new-tokens", "3"])
    assert res.exit_code == 0, res.output
