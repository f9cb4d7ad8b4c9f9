"""The two trainers share one loop: the same rows for the same --shuffle, the same resume (bit-identical
to an uninterrupted run, telemetry without duplicate steps) and the same refusal of another run's
checkpoint. The program runs on the eager reference runtime (the methods as PyTorch modules)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ARCH, CFG, OPTIMIZER, examples

from toolchain.errors import BadInput
from toolchain.lcsb import make_plan
from toolchain.program import ProgramDir
from toolchain.runtime import EagerRuntime
from toolchain.training import EagerTrainer, ProgramTrainer, TrainRun, checkpoint_path, data_order


def _program_trainer(prog, rows, **run):
    pdir = ProgramDir(prog)
    return ProgramTrainer(pdir, EagerRuntime(pdir.spec), rows, TrainRun(**{"lr": OPTIMIZER.lr, **run}))


def _eager_trainer(weights, lora, rows, *, lr=OPTIMIZER.lr, **config):
    return EagerTrainer(ARCH, weights, CFG, lora, rows, TrainRun(optimizer=replace(OPTIMIZER, lr=lr), **config))


def _trainer(kind, program, rows, **run):
    prog, weights, lora = program
    if kind == "program":
        return _program_trainer(prog, rows, **run)
    return _eager_trainer(weights, lora, rows, **run)


def test_eager_and_program_trainers_train_on_the_same_rows_and_agree(program):
    """`train --shuffle S` and `train --program ... --shuffle S`: same rows on every pass (they differed
    from the second pass on), and with the program's weights and optimizer the same losses."""
    rows = examples(3, seed=5)
    plan = make_plan(ARCH.layers, 2, "cyclic")
    eager = _trainer("eager", program, rows, steps=10, shuffle_seed=7, plan=plan).run()
    prog = _trainer("program", program, rows, steps=10, shuffle_seed=7, plan=plan).run()
    assert [e.row for e in eager.log] == [e.row for e in prog.log] == data_order(3, 10, shuffle_seed=7)
    assert [e.layers for e in eager.log] == [e.layers for e in prog.log]
    torch.testing.assert_close(torch.tensor(prog.losses), torch.tensor(eager.losses), rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(prog.lora, eager.lora):
        for t in CFG.targets:
            torch.testing.assert_close(ours[t].a, theirs[t].a, rtol=1e-3, atol=1e-5)


def test_program_trainer_runs_a_warmup_like_the_eager_one(program):
    """A warm-up plan on the program trainer: every layer at steps 0..W-1, then the plan (global index),
    the same layers and (to float tolerance) losses as the eager trainer."""
    rows = examples(3, seed=5)
    plan = make_plan(ARCH.layers, 1, "cyclic", warmup=2)
    eager = _trainer("eager", program, rows, steps=5, plan=plan).run()
    prog = _trainer("program", program, rows, steps=5, plan=plan).run()
    assert [e.layers for e in prog.log] == [(0, 1, 2), (0, 1, 2), (2,), (0,), (1,)] == [e.layers for e in eager.log]
    torch.testing.assert_close(torch.tensor(prog.losses), torch.tensor(eager.losses), rtol=1e-4, atol=1e-5)


class _Killed(Exception):
    pass


def _kill_at(step: int):
    def on_step(entry) -> None:  # after the step's telemetry, before its checkpoint: as a kill would
        if entry.step == step:
            raise _Killed
    return on_step


@pytest.mark.parametrize("kind", ["eager", "program"])
def test_resume_after_a_kill_equals_the_uninterrupted_run_and_logs_each_step_once(program, tmp_path, kind):
    rows = examples(4, seed=6)
    common = dict(shuffle_seed=2, plan=make_plan(ARCH.layers, 1, "cyclic"), checkpoint_every=2)
    whole = _trainer(kind, program, rows, steps=7, checkpoint=tmp_path / "whole.ck", **common).run()
    telemetry, ck = tmp_path / "run.jsonl", tmp_path / "killed.ck"
    with pytest.raises(_Killed):  # killed in step 4, after the step-2 checkpoint: steps 3 and 4 run again
        _trainer(kind, program, rows, steps=5, checkpoint=ck, telemetry=telemetry, **common).run(on_step=_kill_at(4))
    first = _trainer(kind, program, rows, steps=5, checkpoint=ck, telemetry=telemetry, resume=True, **common).run()
    assert [e.step for e in first.log] == [3, 4, 5]
    resumed = _trainer(kind, program, rows, steps=7, checkpoint=ck, telemetry=telemetry, resume=True, **common).run()
    assert [e.step for e in resumed.log] == [6, 7] and resumed.losses == whole.losses
    state = resumed.state if kind == "program" else resumed.state.lora[0]["q_proj"].a
    expected = whole.state if kind == "program" else whole.state.lora[0]["q_proj"].a
    assert torch.equal(state, expected)
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert sorted(e["step"] for e in events if e["type"] == "step") == list(range(7))
    assert len({e["seq"] for e in events}) == len(events) and len({e["run_id"] for e in events}) == 1
    assert [e["type"] for e in events].count("run_start") == 1
    start = next(e for e in events if e["type"] == "run_start")
    assert start.get("compute") == ("fp32" if kind == "program" else None)   # the program's manifest compute
    assert [e["steps_completed"] for e in events if e["type"] == "run_end"] == [5, 7]


# (what the resumed run changes, the words of the error)
CHANGES = [
    ({"lr": 3e-3}, "optimizer `lr` was 0.01, now 0.003"),
    ({"shuffle_seed": 5}, "--shuffle seed was 2, now 5"),
    ({"plan": make_plan(ARCH.layers, 2, "cyclic")}, "LCSB plan was"),
    ({"plan": make_plan(ARCH.layers, 1, "cyclic", warmup=1)}, "LCSB plan was"),
    ({"rows": 9}, "training rows (sha256) was"),
]


@pytest.mark.parametrize("kind", ["eager", "program"])
@pytest.mark.parametrize("change, message", CHANGES, ids=[c[1].split(" was")[0] for c in CHANGES])
def test_resume_refuses_a_checkpoint_of_other_settings_naming_the_difference(program, tmp_path, kind, change,
                                                                             message):
    ck = tmp_path / "ck"
    base = dict(steps=2, shuffle_seed=2, plan=make_plan(ARCH.layers, 1, "cyclic"), checkpoint=ck)
    _trainer(kind, program, examples(3, seed=1), **base).run()
    change = dict(change)
    rows = examples(3, seed=change.pop("rows", 1))
    with pytest.raises(BadInput, match="belongs to another run") as e:
        _trainer(kind, program, rows, **{**base, "steps": 4, "resume": True, **change}).run()
    assert message in str(e.value)


def test_a_checkpoint_of_the_other_trainer_or_past_steps_is_refused(program, tmp_path):
    ck = tmp_path / "ck"
    _trainer("eager", program, examples(3, seed=1), steps=3, checkpoint=ck).run()
    with pytest.raises(BadInput, match="trainer was \"eager\", now \"program\""):
        _trainer("program", program, examples(3, seed=1), steps=4, checkpoint=ck, resume=True).run()
    with pytest.raises(BadInput, match="at step 3, past --steps 2"):
        _trainer("eager", program, examples(3, seed=1), steps=2, checkpoint=ck, resume=True).run()
    assert checkpoint_path(tmp_path / "adapter/") == tmp_path / "adapter.train-checkpoint.safetensors"


def test_no_rows_is_an_error(program):
    with pytest.raises(BadInput, match="no training rows"):
        _trainer("program", program, [], steps=2).run()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist()}) + "\n" for ex in rows))
    return path


def test_cli_program_run_resumes_and_refuses_other_settings(program, tmp_path):
    """`train --program` on the real runtime (ONNX Runtime here): the eager CLI's row order, a verified
    --resume, and one Error: line for a checkpoint of another lr or for a garbled checkpoint."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    prog, _, _ = program
    data = _jsonl(tmp_path / "rows.jsonl", examples(3, seed=4))
    out = tmp_path / "adapter"
    base = ["train", "--program", str(prog), "--data", str(data), "--shuffle", "5", "--adapter-out", str(out),
            "--checkpoint-every", "1", "--json"]
    first = CliRunner().invoke(cli, [*base, "--steps", "4"])
    assert first.exit_code == 0, first.output
    assert [s["row"] for s in json.loads(first.stdout)["steps"]] == data_order(3, 4, shuffle_seed=5)
    more = CliRunner().invoke(cli, [*base, "--steps", "7", "--resume"])
    assert more.exit_code == 0, more.output
    doc = json.loads(more.stdout)
    assert [s["step"] for s in doc["steps"]] == [5, 6, 7] and len(doc["losses"]) == 7
    assert [s["row"] for s in doc["steps"]] == data_order(3, 7, shuffle_seed=5)[4:]
    other = CliRunner().invoke(cli, [*base, "--steps", "8", "--resume", "--lr", "0.5"])
    assert other.exit_code == 2 and "optimizer `lr` was 0.01, now 0.5" in other.stderr, other.output
    (tmp_path / "adapter.train-checkpoint.safetensors").write_bytes(b"\x00" * 32)
    garbled = CliRunner().invoke(cli, [*base, "--steps", "8", "--resume"])
    assert garbled.exit_code == 2 and garbled.stderr.strip().endswith("delete it to start over"), garbled.output
    assert len(garbled.stderr.strip().splitlines()) == 1 and garbled.stdout == ""


def test_export_records_a_warmup_in_the_manifest_and_the_default_plan_keeps_it(tmp_path):
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.lora import init_lora
    from toolchain.models import random_weights

    plan = make_plan(ARCH.layers, 1, "cyclic", warmup=2)
    spec = ExportSpec(source="test", init="random", seed=0, seq_len=8, optimizer=OPTIMIZER, targets=("onnx",),
                      plan=plan)
    out = tmp_path / "prog"
    export_program(ARCH, random_weights(ARCH, seed=0), CFG, init_lora(ARCH, CFG, seed=1), spec, out)
    assert json.loads((out / "manifest.json").read_text())["lcsb"]["warmup"] == 2
    assert ProgramDir(out).default_plan() == plan
