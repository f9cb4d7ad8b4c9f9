"""`toolchain train`: loss per step, PEFT adapter output that PEFT loads, LCSB options, and every bad
input -> one `Error:` line, exit 2, nothing on stdout, no adapter written."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.dataset import ByteTokenizer
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
    assert a["plan"]["policy"] == "strided" and a["optimizer"]["name"] == "adamw"


def test_train_shuffle_and_sgd(data):
    result = _invoke("--data", data, "--shuffle", 3, "--optimizer", "sgd", "--momentum", 0.9, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = [s["row"] for s in doc["steps"]]
    assert sorted(rows[:3]) == [0, 1, 2]
    assert doc["optimizer"] == {"name": "sgd", "lr": 1e-2, "momentum": 0.9, "weight_decay": 0.0}
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
                                  "cyclic_without_k", "momentum_with_adamw"])
def test_bad_input_exits_2_with_no_output(tmp_path, data, case):
    out = tmp_path / "adapter"
    plans = _bad_plan_files(tmp_path)
    args = {"k_too_big": ["--lcsb-k", 9], "both": ["--plan", plans["other_model"][0], "--lcsb-k", 2],
            "cyclic_without_k": ["--lcsb-policy", "cyclic"], "momentum_with_adamw": ["--momentum", 0.5]}
    message = {"k_too_big": "outside 1..8", "both": "exclusive", "cyclic_without_k": "needs k",
               "momentum_with_adamw": "--momentum"}
    if case in plans:
        args[case], message[case] = ["--plan", plans[case][0]], plans[case][1]
    result = _invoke("--data", data, "--adapter-out", out, *args[case])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("Error:") and message[case] in result.stderr, result.stderr
    assert not out.exists()
