"""`toolchain train`: loss per step, PEFT adapter output that PEFT loads, LCSB options, and every bad
input -> one `Error:` line, exit 2, nothing on stdout, no adapter written."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.text.tokenizer import ByteTokenizer
from toolchain.lcsb import make_plan, write_plan
from toolchain.lora import load_adapter
from toolchain.models import get_preset

BASE = ["train", "--model", "tiny", "--init", "random", "--steps", "4", "--lr", "1e-2"]


@pytest.fixture
def data(tmp_path):
    tok = ByteTokenizer()
    path = tmp_path / "data.jsonl"
    texts = ["The river ran slowly past the mill.", "Snow is white because of its shape.", "Bees dance."]
    path.write_text("".join(json.dumps({"input_ids": tok.encode(t)}) + "\n" for t in texts))
    return path


def _invoke(*args):
    return CliRunner().invoke(cli, [*BASE, *map(str, args)])


def test_train_prints_loss_per_step_and_writes_a_peft_adapter_that_loads(tmp_path, data):
    import peft
    from transformers import Qwen2ForCausalLM

    out = tmp_path / "adapter"
    result = _invoke("--data", data, "--rank", 4, "--targets", "q_proj,v_proj,down_proj", "--lcsb-k", 3,
                     "--adapter-out", out)
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("step")]
    assert [ln.split()[5] for ln in lines] == ["0-1", "2-4", "5-7", "0-1"]  # cyclic, 8 layers, k = 3: sizes 2, 3, 3
    arch = get_preset("tiny")
    cfg, lora = load_adapter(out, arch)
    assert (cfg.rank, cfg.alpha, cfg.targets) == (4, 8.0, ("q_proj", "v_proj", "down_proj"))
    assert any(float(layer["v_proj"].b.abs().max()) > 0 for layer in lora)  # trained: B left zero init
    model = peft.PeftModel.from_pretrained(Qwen2ForCausalLM(arch.to_hf_config()), str(out))
    params = dict(model.named_parameters())
    loaded = params["base_model.model.model.layers.7.mlp.down_proj.lora_B.default.weight"]
    torch.testing.assert_close(loaded.detach(), lora[7]["down_proj"].b)


def test_train_json_output_and_plan_file_equals_lcsb_options(tmp_path, data):
    plan_path = tmp_path / "plan.json"
    write_plan(plan_path, make_plan(8, 2, "strided"))
    by_file = _invoke("--data", data, "--plan", plan_path, "--json")
    by_opts = _invoke("--data", data, "--lcsb-k", 2, "--lcsb-policy", "strided", "--json")
    assert by_file.exit_code == 0 and by_opts.exit_code == 0, by_file.output + by_opts.output
    a, b = json.loads(by_file.stdout), json.loads(by_opts.stdout)
    assert [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]]
    assert [s["layers"] for s in a["steps"]] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [s["row"] for s in a["steps"]] == [0, 1, 2, 0]
    assert a["plan"]["policy"] == "strided" and a["optimizer"]["kind"] == "adamw"


def test_train_lcsb_warmup_runs_full_backprop_first_and_equals_a_plan_file_with_it(tmp_path, data):
    plan_path = tmp_path / "plan.json"
    write_plan(plan_path, make_plan(8, 2, "strided", warmup=2))
    by_opts = _invoke("--data", data, "--lcsb-k", 2, "--lcsb-policy", "strided", "--lcsb-warmup", 2, "--json")
    by_file = _invoke("--data", data, "--plan", plan_path, "--json")
    assert by_file.exit_code == 0 and by_opts.exit_code == 0, by_file.output + by_opts.output
    a, b = json.loads(by_opts.stdout), json.loads(by_file.stdout)
    assert [s["layers"] for s in a["steps"]] == [list(range(8)), list(range(8)), [2, 6], [3, 7]]
    assert [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]]
    assert a["plan"]["warmup"] == 2
    bad = _invoke("--data", data, "--lcsb-warmup", 2)
    assert bad.exit_code == 2 and bad.stderr.startswith("Error:") and "--lcsb-warmup" in bad.stderr, bad.stderr


def test_layers_per_checkpoint_trains_bit_for_bit_alike(tmp_path, data):
    """Checkpoint groups recompute instead of store: the same losses and adapter, eager and on a program."""
    runs = {n: _invoke("--data", data, "--lcsb-k", 5, "--layers-per-checkpoint", n, "--json",
                       "--adapter-out", tmp_path / f"a{n}") for n in (1, 3)}
    assert all(r.exit_code == 0 for r in runs.values()), [r.output for r in runs.values()]
    losses = {n: [s["loss"] for s in json.loads(r.stdout)["steps"]] for n, r in runs.items()}
    assert losses[1] == losses[3]
    assert (tmp_path / "a1" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "a3" / "adapter_model.safetensors").read_bytes()
    program = tmp_path / "prog"
    exported = CliRunner().invoke(cli, ["export", "--model", "tiny", "--init", "random", "--seq-len", "48",
                                        "--no-generate", "--out", str(program)])
    assert exported.exit_code == 0, exported.output
    prog = {n: CliRunner().invoke(cli, ["train", "--program", str(program), "--data", str(data), "--steps", "2",
                                        "--lcsb-k", 4, "--layers-per-checkpoint", str(n), "--json",
                                        "--adapter-out", str(tmp_path / f"p{n}")]) for n in (1, 2)}
    assert all(r.exit_code == 0 for r in prog.values()), [r.output for r in prog.values()]
    assert [s["loss"] for s in json.loads(prog[1].stdout)["steps"]] == \
        [s["loss"] for s in json.loads(prog[2].stdout)["steps"]]
    assert (tmp_path / "p1" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "p2" / "adapter_model.safetensors").read_bytes()


def test_train_shuffle_and_sgd(data):
    result = _invoke("--data", data, "--shuffle", 3, "--optimizer", "sgd", "--momentum", 0.9, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = [s["row"] for s in doc["steps"]]
    assert sorted(rows[:3]) == [0, 1, 2]
    assert doc["optimizer"] == {"kind": "sgd", "lr": 1e-2, "momentum": 0.9, "weight_decay": 0.0, "betas": [0.9, 0.999],
                                "eps": 1e-8, "frozen_unselected": False}
    assert all(s["layers"] == list(range(8)) for s in doc["steps"])  # no plan: full backprop


def _bad_plan_files(tmp_path):
    not_json = tmp_path / "not_json.json"
    not_json.write_text("{")
    bad_schema = tmp_path / "bad_schema.json"
    bad_schema.write_text(json.dumps({**make_plan(8, 2, "cyclic").to_dict(), "policy": "lisa"}))
    out_of_range = tmp_path / "out_of_range.json"
    out_of_range.write_text(json.dumps({**make_plan(8, 2, "cyclic").to_dict(), "phases": [[0, 9]], "schedule": [0]}))
    other_model = tmp_path / "other_model.json"
    write_plan(other_model, make_plan(24, 6, "cyclic"))
    return {"not_json": (not_json, "not valid JSON"), "bad_schema": (bad_schema, "policy"),
            "out_of_range": (out_of_range, "selects layer 9"), "other_model": (other_model, "for 24 layers")}


@pytest.mark.parametrize("case", ["not_json", "bad_schema", "out_of_range", "other_model", "k_too_big", "both",
                                  "cyclic_without_k", "momentum_with_adamw", "seed_without_random"])
def test_bad_input_exits_2_with_no_output(tmp_path, data, case):
    out = tmp_path / "adapter"
    plans = _bad_plan_files(tmp_path)
    args = {"k_too_big": ["--lcsb-k", 9], "both": ["--plan", plans["other_model"][0], "--lcsb-k", 2],
            "cyclic_without_k": ["--lcsb-policy", "cyclic"], "momentum_with_adamw": ["--momentum", 0.5],
            "seed_without_random": ["--lcsb-k", 2, "--lcsb-seed", 4]}
    message = {"k_too_big": "outside 1..8", "both": "exclusive", "cyclic_without_k": "needs k",
               "momentum_with_adamw": "--momentum", "seed_without_random": "--lcsb-seed applies to"}
    if case in plans:
        args[case], message[case] = ["--plan", plans[case][0]], plans[case][1]
    result = _invoke("--data", data, "--adapter-out", out, *args[case])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("Error:") and message[case] in result.stderr, result.stderr
    assert not out.exists()


# -- options a mode does not use, --resume, --telemetry-out ------------------------------------------

# (options, the spelling the error names): --program takes these from its manifest.
PROGRAM_REFUSES = [
    (["--optimizer", "sgd"], "--optimizer"), (["--rank", 4], "--rank"), (["--alpha", 4], "--alpha"),
    (["--targets", "q_proj"], "--targets"), (["--model", "tiny"], "--model"), (["--init", "random"], "--init"),
    (["--seed", 3], "--seed"), (["--weight-decay", 0.1], "--weight-decay"), (["--momentum", 0.5], "--momentum"),
    (["--frozen-unselected"], "--frozen-unselected"), (["--optimizer", "adamw", "--rank", 8], "--rank, --optimizer"),
]


@pytest.mark.parametrize("args, named", PROGRAM_REFUSES, ids=[c[1] for c in PROGRAM_REFUSES])
def test_program_mode_refuses_the_options_it_would_ignore(tmp_path, data, args, named):
    program = tmp_path / "prog"
    program.mkdir()
    result = CliRunner().invoke(cli, ["train", "--program", str(program), "--data", str(data), *map(str, args)])
    assert result.exit_code == 2, result.output
    assert f"drop {named}" in result.stderr and result.stdout == ""


def _adapter_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def _train(data, out, *args):
    return _invoke("--data", data, "--adapter-out", out, "--lcsb-k", 3, "--shuffle", 1, "--checkpoint-every", 1,
                   "--json", *args)


def test_eager_resume_continues_to_the_adapter_of_an_uninterrupted_run(tmp_path, data):
    whole = _train(data, tmp_path / "whole", "--steps", 5)
    part = _train(data, tmp_path / "part", "--steps", 3, "--telemetry-out", tmp_path / "t.jsonl")
    rest = _train(data, tmp_path / "part", "--steps", 5, "--resume", "--telemetry-out", tmp_path / "t.jsonl")
    assert whole.exit_code == part.exit_code == rest.exit_code == 0, whole.output + part.output + rest.output
    assert [s["step"] for s in json.loads(rest.stdout)["steps"]] == [4, 5]
    assert json.loads(rest.stdout)["losses"] == json.loads(whole.stdout)["losses"]
    a, b = _adapter_tensors(tmp_path / "whole"), _adapter_tensors(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "step"] == [0, 1, 2, 3, 4]
    assert events[0]["type"] == "run_start" and events[0]["backend"] == "eager" and events[0]["lcsb_k"] == 3
    assert [e["seq"] for e in events] == list(range(len(events)))


def _other_data(tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"input_ids": ByteTokenizer().encode("Other words entirely.")}) + "\n")
    return other


# (what the resumed run changes, words of the error): the checkpoint is of another run.
RESUME_MISMATCH = [
    (lambda tmp: ["--lr", "1e-3"], "optimizer `lr` was 0.01, now 0.001"),
    (lambda tmp: ["--shuffle", 2], "--shuffle seed was 1, now 2"),
    (lambda tmp: ["--optimizer", "sgd"], "optimizer `kind` was"),
    (lambda tmp: ["--weight-decay", 0.5], "optimizer `weight_decay` was 0.01, now 0.5"),
    (lambda tmp: ["--lcsb-k", 2], "LCSB plan was"),
    (lambda tmp: ["--rank", 4], "LoRA config `alpha` was 16.0, now 8.0 and `rank` was 8, now 4"),
    (lambda tmp: ["--seed", 5], "frozen weights (sha256 of a sample) was"),
    (lambda tmp: ["--data", _other_data(tmp)], "training rows (sha256) was"),
]


@pytest.mark.parametrize("change, message", RESUME_MISMATCH, ids=[str(i) for i in range(len(RESUME_MISMATCH))])
def test_eager_resume_with_other_settings_is_an_error_naming_the_difference(tmp_path, data, change, message):
    out = tmp_path / "adapter"
    assert _train(data, out, "--steps", 2).exit_code == 0
    before = _adapter_tensors(out)
    args = change(tmp_path)
    if "--data" in args:
        result = _invoke("--data", args[1], "--adapter-out", out, "--lcsb-k", 3, "--shuffle", 1, "--steps", 4,
                         "--resume")
    elif "--lcsb-k" in args or "--shuffle" in args:
        result = _invoke("--data", data, "--adapter-out", out, "--checkpoint-every", 1, "--steps", 4, "--resume",
                         *(["--lcsb-k", 3] if "--lcsb-k" not in args else []),
                         *(["--shuffle", 1] if "--shuffle" not in args else []), *args)
    else:
        result = _train(data, out, "--steps", 4, "--resume", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "belongs to another run" in result.stderr and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    after = _adapter_tensors(out)
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing written


CORRUPT = [
    ("garbage", lambda p: p.write_bytes(b"\x13garbage" * 50)),
    ("empty", lambda p: p.write_bytes(b"")),
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])),
    ("foreign", lambda p: p.write_bytes(__import__("safetensors.torch").torch.save({"state": torch.zeros(3)}, metadata={
        "meta": json.dumps({"step": 1, "run_id": "app", "seq": 0, "losses": [1.0]})}))),
]


@pytest.mark.parametrize("name, spoil", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_resume_from_a_corrupt_or_foreign_checkpoint_is_a_one_line_error(tmp_path, data, name, spoil):
    out = tmp_path / "adapter"
    assert _train(data, out, "--steps", 2).exit_code == 0
    ck = tmp_path / "adapter.train-checkpoint.safetensors"
    spoil(ck)
    result = _train(data, out, "--steps", 4, "--resume")
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.startswith(f"Error: checkpoint {ck}")
    assert result.stderr.rstrip().endswith("delete it to start over") and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--resume"], "--resume needs --adapter-out"),
    (["--checkpoint-every", 2], "--checkpoint-every needs --adapter-out"),
])
def test_eager_checkpoint_options_need_an_adapter_out(data, args, message):
    result = _invoke("--data", data, *args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_eager_resume_without_a_checkpoint_is_an_error(tmp_path, data):
    result = _invoke("--data", data, "--adapter-out", tmp_path / "adapter", "--resume")
    assert result.exit_code == 2 and "no checkpoint at" in result.stderr, result.output
    assert not (tmp_path / "adapter").exists()
