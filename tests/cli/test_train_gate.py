"""`toolchain train` and the evaluation gate on the demo model (pretrained on public-domain English, so a run can
make it worse): lr 10 is rolled back and says so on stdout, a good run on the user's text is kept; the probe an
export ships is measured by the gate; `plan fit` names its fallback; bad combinations are one `Error:` line."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.text.dataset import DataRow, text_examples
from toolchain.text.tokenizer import ByteTokenizer

SEQ = 64


def _write(path, rows: list[DataRow]):
    path.write_text("".join(json.dumps({"input_ids": r.input_ids.tolist()}) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def user_rows(tmp_path_factory):
    from pathlib import Path

    assets = Path(__file__).resolve().parents[2] / "toolchain" / "assets"
    tok = ByteTokenizer()
    tmp = tmp_path_factory.mktemp("user")
    train = text_examples((assets / "user_text.txt").read_text(), tok, seq_len=SEQ)[:8]
    held = text_examples((assets / "user_text_held_out.txt").read_text(), tok, seq_len=SEQ)[:4]
    return _write(tmp / "train.jsonl", train), _write(tmp / "held.jsonl", held)


def _run(*args):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res


@pytest.mark.parametrize("lr, decision", [(10.0, "rolled_back"), (3e-3, "kept")], ids=["lr 10", "good"])
def test_eager_train_gates_on_the_held_out_rows(user_rows, tmp_path, lr, decision):
    train, held = user_rows
    out = tmp_path / "adapter"
    args = ["train", "--model", "demo", "--data", train, "--eval-data", held, "--steps", 4, "--lr", lr,
            "--eval-every", 2, "--adapter-out", out, "--telemetry-out", tmp_path / "t.jsonl"]
    res = _run(*args)
    assert res.exit_code == 0, res.output
    gate_lines = [line for line in res.output.splitlines() if line.startswith("gate: ")]
    word = {"rolled_back": "rolled back", "kept": "kept"}[decision]
    assert gate_lines[0].startswith(f"gate: {word}: held-out "), res.output
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    gate = next(e for e in events if e["type"] == "gate")
    assert gate["decision"] == decision and gate["probe"] == "no_probe"
    from safetensors.torch import load_file

    saved = load_file(out / "adapter_model.safetensors")
    lora_b = [v for k, v in saved.items() if "lora_B" in k]
    # a fresh adapter starts with lora_B = 0: rolled back, the saved adapter is that one again
    assert all(torch.count_nonzero(b) == 0 for b in lora_b) is (decision == "rolled_back")
    js = _run(*args[:-4], "--json", "--adapter-out", tmp_path / "a2")
    assert json.loads(js.output[js.output.index("{"):])["gate"]["decision"] == decision


def test_no_gate_and_eval_every_need_eval_data(user_rows):
    train, _ = user_rows
    for flag in (["--no-gate"], ["--eval-every", "2"]):
        res = _run("train", "--model", "demo", "--data", train, "--steps", 1, *flag)
        assert res.exit_code == 2
        errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and errors[0].startswith(f"Error: {flag[0]} needs --eval-data"), res.output


def test_a_run_without_held_out_rows_says_the_gate_is_off(user_rows):
    train, _ = user_rows
    res = _run("train", "--model", "demo", "--data", train, "--steps", 1)
    assert res.exit_code == 0 and "gate: off (no --eval-data: no held-out rows to compare)" in res.output


def test_an_exported_program_ships_the_probe_and_the_gate_measures_it(tmp_path):
    from toolchain.contract import PROBE_NAME
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.models import ModelArch, random_weights
    from toolchain.program import ProgramDir
    from toolchain.runtime import EagerRuntime
    from toolchain.runtime.evaluate import evaluate_program
    from toolchain.text.probe import PROBE_MAX_ROWS, probe_text
    from toolchain.training import ProgramTrainer, TrainRun
    from toolchain.training.gate import Evaluation

    arch = ModelArch(hidden=16, layers=2, heads=4, kv_heads=2, intermediate=24, vocab=264, max_positions=64)
    cfg = LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
    tok = ByteTokenizer()
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=32, targets=("onnx",), tokenizer_kind="byte",
                      pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, default_lr=1e-2)
    export_program(arch, random_weights(arch, seed=0), cfg, init_lora(arch, cfg, seed=1, zero_b=False), spec,
                   tmp_path / "prog")
    pdir = ProgramDir(tmp_path / "prog")
    assert PROBE_NAME in pdir.files
    probe = pdir.probe_rows()
    assert len(probe) == PROBE_MAX_ROWS and all(r.input_ids.shape[0] == 32 for r in probe)
    assert tok.decode(probe[0].input_ids.tolist()) == probe_text()[:31]        # BOS, then the text's first bytes
    rows = text_examples(probe_text(), tok, seq_len=32)[10:14]
    runtime = EagerRuntime(pdir.spec)
    trainer = ProgramTrainer(pdir, runtime, rows, TrainRun(steps=3))
    trainer.evaluation = Evaluation(rows, probe=probe)
    start = evaluate_program(pdir, runtime, pdir.state_init(), probe)["loss"]
    result = trainer.run()
    gate = result.gate.event_fields()
    assert gate["probe"] == "measured" and gate["probe_start_loss"] == start
    assert gate["probe_end_loss"] == evaluate_program(pdir, runtime, trainer.state, probe)["loss"]
    assert gate["forgetting"] is (gate["probe_rise"] > 0.05)


def test_plan_fit_names_the_fallback(tmp_path):
    profile = json.loads((__import__("pathlib").Path(__file__).resolve().parents[2] / "shared_schemas" / "examples"
                          / "device_profile_custom_pixel7a.json").read_text())
    profile.update(name="tight", budget_mb=40)
    profile["headroom"][-1]["mb"] += 2000 - 40
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(profile))
    res = _run("plan", "fit", "--model", "qwen2.5-0.5b", "--seq-len", 256, "--device", path, "--json")
    fb = json.loads(res.output)["fallback"]
    assert fb["fits"] and fb["notches"] and fb["predicted_peak_mb"] <= 40
    assert fb["layers_per_checkpoint"] > 1 and fb["seq_len"] == 256
    text = _run("plan", "fit", "--model", "qwen2.5-0.5b", "--seq-len", 256, "--device", path).output
    assert f"fallback under memory pressure: layers_per_checkpoint {fb['layers_per_checkpoint']}" in text
    roomy = _run("plan", "fit", "--model", "qwen2.5-0.5b", "--seq-len", 256, "--device", "android-8gb").output
    assert "fallback under memory pressure: none needed" in roomy
