"""`TrainingSession` (toolchain/training/session.py): train, evaluate and generate on one loaded program and
state give what the separate commands give (`toolchain train --program`, `eval --resume-from`, `generate
--resume-from` on the run's checkpoint), bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.text.dataset import DataRow
from toolchain.export.build import ExportSpec, export_program
from toolchain.lora import LoraConfig, init_lora
from toolchain.models import ModelArch, random_weights
from toolchain.optim import OptimizerConfig
from toolchain.training import TrainRun, checkpoint_path
from toolchain.training.session import TrainingSession

ARCH = ModelArch(hidden=16, layers=3, heads=4, kv_heads=2, intermediate=24, vocab=40, max_positions=32)
CFG = LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
SEQ_LEN = 16
STEPS, LR, EVERY, SHUFFLE = 5, 0.05, 2, 3
PROMPT, NEW = [5, 7, 11, 2, 9], 8


def _rows(n: int, seed: int) -> list[DataRow]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, ARCH.vocab, (SEQ_LEN - i % 4,), generator=g)
        labels = ids.clone()
        labels[:2] = -100
        out.append(DataRow(ids, labels))
    return out


def _write(path, rows: list[DataRow]):
    path.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist(), "labels": ex.labels.tolist()}) + "\n"
                            for ex in rows))
    return path


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A tiny AdamW program with the generation methods (ONNX: the quickest export)."""
    out = tmp_path_factory.mktemp("session") / "prog"
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=SEQ_LEN, targets=("onnx",), generation=True,
                      pad_token_id=0, optimizer=OptimizerConfig("adamw", lr=LR, weight_decay=0.01), default_lr=LR)
    spec = __import__("dataclasses").replace(spec, prefill_chunk=4)
    export_program(ARCH, random_weights(ARCH, seed=0), CFG, init_lora(ARCH, CFG, seed=1, zero_b=False), spec, out)
    return out


def _cli(*args) -> str:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


def test_one_session_trains_evaluates_and_generates_as_the_separate_commands(program, tmp_path):
    train, held = _rows(6, 1), _rows(3, 2)
    data, held_file = _write(tmp_path / "train.jsonl", train), _write(tmp_path / "held.jsonl", held)
    adapter = tmp_path / "adapter"

    # the separate commands: train (with the eval schedule), then eval and generate on its checkpoint
    out = _cli("train", "--program", program, "--data", data, "--steps", STEPS, "--lr", LR, "--shuffle", SHUFFLE,
               "--eval-data", held_file, "--eval-every", EVERY, "--adapter-out", adapter, "--json")
    trained = json.loads(out[out.index("{"):])
    ck = checkpoint_path(adapter)
    _cli("eval", "--program", program, "--data", held_file, "--resume-from", ck, "--json", tmp_path / "e.json")
    evaluated = json.loads((tmp_path / "e.json").read_text())
    _cli("generate", "--program", program, "--resume-from", ck, "--prompt-ids", ",".join(map(str, PROMPT)),
         "--max-new-tokens", NEW, "--json", tmp_path / "g.json")
    generated = json.loads((tmp_path / "g.json").read_text())
    _cli("generate", "--program", program, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", NEW,
         "--json", tmp_path / "g0.json")
    generated_before = json.loads((tmp_path / "g0.json").read_text())

    # one session: generate before, train with the schedule, evaluate and generate the live state after
    session = TrainingSession(program)
    examples, held_examples = session.examples(data), session.examples(held_file)
    prompt = session.prompt(ids=",".join(map(str, PROMPT)))
    assert session.generate(prompt.ids, NEW, stop_ids=prompt.stop_ids).output_ids == generated_before["output_ids"]
    session.start_training(examples, TrainRun(steps=STEPS, lr=LR, shuffle_seed=SHUFFLE), held=held_examples,
                           eval_every=EVERY)
    result = session.train()
    assert list(result.losses) == trained["losses"]                          # the same floats, bit for bit
    assert [e["step"] for e in session.evals] == [0, 2, 4, 5]
    assert session.evals == trained["evals"]
    ev = session.evaluate(held_examples)
    assert ev["loss"] == evaluated["loss"] == session.evals[-1]["loss"]
    assert (ev["rows"], ev["tokens"], ev["row_mean_loss"]) == (evaluated["rows"], evaluated["tokens"],
                                                                evaluated["row_mean_loss"])
    assert session.state is result.state                                    # the live state, trained in place
    gen = session.generate(prompt.ids, NEW, stop_ids=prompt.stop_ids)
    assert gen.output_ids == generated["output_ids"]
    assert session.trainer.loop is session.loop                             # one loop for all three


def test_a_session_refuses_train_before_start_and_a_baseline_after_the_runtime(program):
    from toolchain.runtime.program_runtime import ProgramRuntime

    session = TrainingSession(program)
    with pytest.raises(RuntimeError, match="before start_training"):
        session.train()
    assert isinstance(session.open_runtime(), ProgramRuntime)
    assert not isinstance(object(), ProgramRuntime)          # the protocol asks for backend and execute
    with pytest.raises(RuntimeError, match="after the runtime was opened"):
        session.measure_baseline()


def test_generation_limits_name_the_field_and_the_cli_the_option(program):
    """The library's error names the field (`max_new_tokens`), `toolchain generate` the option."""
    from toolchain.errors import FieldError

    session = TrainingSession(program, target="eager")
    with pytest.raises(FieldError, match=r"^max_new_tokens 12 \+ the prompt's 5 tokens = 17 exceeds the program's "
                                         r"seq_len 16") as e:
        session.generate(PROMPT, 12)
    assert e.value.field == "max_new_tokens"
    with pytest.raises(FieldError, match="^temperature must be >= 0") as e:
        session.generate(PROMPT, 2, temperature=-1.0)
    res = CliRunner().invoke(cli, ["generate", "--program", str(program), "--prompt-ids", ",".join(map(str, PROMPT)),
                                   "--max-new-tokens", "12"])
    assert res.exit_code == 2
    assert "Error: --max-new-tokens 12 + the prompt's 5 tokens = 17 exceeds the program's seq_len 16" in res.output


def test_the_held_out_pass_of_a_run_reads_its_first_held_out_eval_rows_rows(program, tmp_path):
    """As the apps (Contract.HELD_OUT_EVAL_ROWS): a run's eval events cover the first HELD_OUT_EVAL_ROWS held-out
    rows, the same loss as `evaluate` of exactly those rows; `evaluate` itself reads every row it is given."""
    from toolchain.contract import HELD_OUT_EVAL_ROWS

    session = TrainingSession(program)
    held = _rows(HELD_OUT_EVAL_ROWS + 5, 4)
    session.start_training(_rows(4, 1), TrainRun(steps=1, lr=LR), held=held)
    first = session.evals[0]
    assert first["rows"] == HELD_OUT_EVAL_ROWS
    capped = session.evaluate(held[:HELD_OUT_EVAL_ROWS], state=session.trainer.state)
    assert (first["loss"], first["tokens"]) == (capped["loss"], capped["tokens"])
    assert session.evaluate(held, state=session.trainer.state)["rows"] == HELD_OUT_EVAL_ROWS + 5
