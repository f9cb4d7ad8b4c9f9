"""The exported ExecuTorch program, run on the real runtime, against the eager step and against
Hugging Face + PEFT (float64). Exports are small (2 layers, T=16) and shared per module."""

from __future__ import annotations

import math

import pytest
import torch

from toolchain.export.build import ExportSpec, export_program
from helpers import eager_program_run, hf_peft_sgd, max_rel_diff

from toolchain.export.program import OptimizerSpec, QuantSpec, StepProgram
from toolchain.lcsb.plan import make_plan
from toolchain.lora import LoraConfig, init_lora, lora_state_dict
from toolchain.models import Qwen25Arch, random_weights
from toolchain.runtime import ProgramDir, TrainRun, run_program
from toolchain.runtime.executorch_runner import ExecutorchRunner
from toolchain.runtime.trainer import pad_example
from toolchain.dataset import Example

ARCH = Qwen25Arch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
T = 16
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))


def _examples(n: int, seed: int) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = T - (i % 3)  # some rows shorter than T: exercises padding
        ids = torch.randint(0, ARCH.vocab, (t,), generator=g)
        out.append(Example(ids, ids.clone()))
    return out


def _export(tmp_path_factory, name: str, *, quant="none", optimizer=OptimizerSpec(), plan=None):
    weights = random_weights(ARCH, seed=3)
    lora = init_lora(ARCH, CFG, seed=4, zero_b=False)
    out = tmp_path_factory.mktemp(name) / "prog"
    spec = ExportSpec(source="test", init="random", seed=3, seq_len=T, quant=QuantSpec(quant, 16), optimizer=optimizer,
                      plan=plan, pad_token_id=0)
    export_program(ARCH, weights, CFG, lora, spec, out)
    return out, weights, lora


@pytest.fixture(scope="module")
def fp32_sgd(tmp_path_factory):
    return _export(tmp_path_factory, "fp32")


@pytest.fixture(scope="module")
def int4_adamw_lcsb(tmp_path_factory):
    plan = make_plan(ARCH.layers, 1, "cyclic")
    return _export(tmp_path_factory, "int4", quant="int4", optimizer=OptimizerSpec("adamw", weight_decay=0.01),
                   plan=plan)


def _run(prog_dir, examples, steps, lr, **kw):
    pdir = ProgramDir(prog_dir)
    runner = ExecutorchRunner(pdir.program_file("executorch"), pdir.train_methods())
    return pdir, run_program(pdir, runner, examples, TrainRun(steps=steps, lr=lr, **kw))




def _hf_model(weights):
    """Hugging Face Qwen2 in float64 holding the program's frozen weights."""
    from transformers import Qwen2ForCausalLM

    from toolchain.models import state_dict_from_weights

    hf = Qwen2ForCausalLM._from_config(ARCH.to_hf_config(), attn_implementation="eager")
    hf.load_state_dict({k: v.double() for k, v in state_dict_from_weights(weights).items()}, strict=False)
    hf = hf.double().eval()
    if ARCH.tie_embeddings:
        hf.tie_weights()
    return hf


def test_fp32_program_trains_like_eager_and_hf_peft(fp32_sgd):
    prog, weights, lora = fp32_sgd
    examples, steps, lr = _examples(3, seed=5), 5, 0.05
    pdir, res = _run(prog, examples, steps, lr)
    trained = lora_state_dict(pdir.lora_from_state(res.state))
    eager_losses, eager_state = eager_program_run(pdir, StepProgram(ARCH, weights, CFG), lora, examples, steps, lr)
    eager_sd = lora_state_dict(pdir.lora_from_state(eager_state))
    hf_losses, hf_sd = hf_peft_sgd(_hf_model(weights), CFG, lora, examples, steps, lr)
    print("runtime vs eager", max_rel_diff(trained, eager_sd), "runtime vs HF+PEFT", max_rel_diff(trained, hf_sd))
    assert max_rel_diff(trained, eager_sd) <= 1e-4
    assert max_rel_diff(trained, hf_sd) <= 1e-4
    assert set(trained) == set(hf_sd)
    for a, b, c in zip(res.losses, eager_losses, hf_losses):
        assert math.isclose(a, b, rel_tol=1e-5) and math.isclose(a, c, rel_tol=1e-5)
    # the adapter really moved
    assert max_rel_diff(trained, lora_state_dict(lora)) > 1e-3


def test_int4_adamw_lcsb_phases_match_eager(int4_adamw_lcsb):
    prog, weights, lora = int4_adamw_lcsb
    examples, steps, lr = _examples(2, seed=6), 4, 1e-2
    pdir, res = _run(prog, examples, steps, lr)
    assert pdir.train_methods() == ["train_step_p0", "train_step_p1"]
    eager = StepProgram(ARCH, weights, CFG, optimizer=OptimizerSpec("adamw", weight_decay=0.01),
                        quant=QuantSpec("int4", 16))
    eager_losses, eager_state = eager_program_run(pdir, eager, lora, examples, steps, lr)
    for s, (a, b) in enumerate(zip(res.losses, eager_losses)):
        assert math.isclose(a, b, rel_tol=1e-5), (s, a, b)
    diff = (res.state - eager_state).abs().max() / eager_state.abs().max()
    print("state rel diff", float(diff))
    assert diff <= 1e-4
    # the moments and the step counter moved too (AdamW state really goes through the outputs)
    entries = {e["name"]: e for e in pdir.manifest["state"]["entries"]}
    step = entries["adam_step"]
    assert float(res.state[step["offset"]]) == steps


def test_methods_are_pure_functions_of_their_inputs(fp32_sgd):
    """No hidden state: the same inputs give the same outputs on a long-lived method, on a second call,
    and on a freshly loaded program (what makes the stock per-method-arena `Module` correct), and the
    outputs are exactly the manifest's."""
    from executorch.runtime import Runtime

    prog, _, _ = fp32_sgd
    pdir = ProgramDir(prog)
    runner = ExecutorchRunner(pdir.program_file("executorch"), pdir.train_methods())
    x, y = pad_example(_examples(1, seed=10)[0], T, 0, "row")
    state = pdir.state_init()
    inputs = [x, y, torch.tensor([0.1]), *pdir.state_views(state).values()]
    first = [t.clone() for t in runner.execute("train_step", inputs)]
    second = [t.clone() for t in runner.execute("train_step", inputs)]
    fresh = Runtime.get().load_program(pdir.program_file("executorch")).load_method("train_step").execute(inputs)
    spec = pdir.method("train_step")["outputs"]
    assert [list(t.shape) for t in first] == [o["shape"] for o in spec]
    for a, b, c in zip(first, second, fresh):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(state, pdir.state_init())  # inputs are not written in place
    # and the step changed every LoRA parameter it returns
    views = pdir.state_views(state)
    assert all(not torch.equal(out.reshape(views[o["name"]].shape), views[o["name"]])
               for o, out in zip(spec[1:], first[1:]))


def test_manifest_checksums_are_verified(fp32_sgd, tmp_path):
    import shutil

    from toolchain.errors import BadInput

    prog, _, _ = fp32_sgd
    copy = tmp_path / "prog"
    shutil.copytree(prog, copy)
    with open(copy / "model.pte", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(BadInput, match="checksum"):
        ProgramDir(copy)


def _write_jsonl(path, examples):
    import json

    path.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist()}) + "\n" for ex in examples))
    return path


def _adapter_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_resume_after_kill_equals_uninterrupted_run(fp32_sgd, tmp_path):
    """A run SIGKILLed mid-way and resumed from its checkpoint ends with the very adapter of a run
    that was never interrupted (the CLI, in subprocesses, as a user runs it)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    prog, _, _ = fp32_sgd
    data = _write_jsonl(tmp_path / "data.jsonl", _examples(5, seed=8))
    steps = 300
    base = [sys.executable, "-m", "toolchain", "train", "--program", str(prog), "--data", str(data),
            "--steps", str(steps), "--lr", "0.01", "--checkpoint-every", "1"]
    subprocess.run(base + ["--adapter-out", str(tmp_path / "whole")], check=True, capture_output=True)

    telemetry = tmp_path / "killed.jsonl"
    cmd = base + ["--adapter-out", str(tmp_path / "killed"), "--telemetry-out", str(telemetry)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        lines = telemetry.read_text().splitlines() if telemetry.exists() else []
        if sum('"type":"step"' in line for line in lines) >= 20:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (tmp_path / "killed").exists()
    subprocess.run(cmd + ["--resume"], check=True, capture_output=True)
    whole, resumed = _adapter_tensors(tmp_path / "whole"), _adapter_tensors(tmp_path / "killed")
    assert whole.keys() == resumed.keys()
    for k in whole:
        torch.testing.assert_close(resumed[k], whole[k], rtol=0, atol=0)
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    steps_seen = sorted({e["step"] for e in events if e["type"] == "step"})
    assert steps_seen == list(range(steps))   # the resumed run continued where the checkpoint was
    seqs = [e["seq"] for e in events]
    assert len(seqs) == len(set(seqs))         # no (run_id, seq) reused after the resume
    assert events[-1]["type"] == "run_end"


def test_int8_program_matches_eager(tmp_path_factory):
    prog, weights, lora = _export(tmp_path_factory, "int8", quant="int8")
    examples, steps, lr = _examples(2, seed=9), 3, 0.05
    pdir, res = _run(prog, examples, steps, lr)
    program = StepProgram(ARCH, weights, CFG, quant=QuantSpec("int8", 16))
    eager_losses, eager_state = eager_program_run(pdir, program, lora, examples, steps, lr)
    for a, b in zip(res.losses, eager_losses):
        assert math.isclose(a, b, rel_tol=1e-5)
    assert float((res.state - eager_state).abs().max() / eager_state.abs().max()) <= 1e-4
