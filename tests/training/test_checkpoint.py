"""Checkpoints (toolchain/training/checkpoint.py): every kind of unreadable or foreign file is one
BadInput ending in "delete it to start over", and a checkpoint of another run names the difference."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save

from toolchain.errors import BadInput
from toolchain.training.checkpoint import (check_settings, load_checkpoint, load_program_state, program_state_of,
                                          save_checkpoint)

SETTINGS = {"trainer": "program", "program": "ab" * 32, "data": "cd" * 32,
            "optimizer": {"kind": "adamw", "lr": 0.01, "momentum": 0.0, "betas": [0.9, 0.999], "eps": 1e-8,
                          "weight_decay": 0.01, "frozen_unselected": False},
            "shuffle_seed": 3, "plan": None}


def _meta_file(path, meta, tensors=None):
    tensors = {"state": torch.zeros(4)} if tensors is None else tensors
    path.write_bytes(save(tensors, metadata=None if meta is None else {"meta": meta}))
    return path


# (name, writes the file, message): one row per way a file can fail to be a checkpoint.
BAD_FILES = [
    ("garbage", lambda p: p.write_bytes(b"\x00garbage" * 10), "not a readable checkpoint"),
    ("empty", lambda p: p.write_bytes(b""), "not a readable checkpoint"),
    ("huge_header_length", lambda p: p.write_bytes((2**62).to_bytes(8, "little") + b"{}"), "not a readable checkpoint"),
    ("text", lambda p: p.write_text("hello, not safetensors"), "not a readable checkpoint"),
    ("truncated", lambda p: p.write_bytes(_meta_file(p, json.dumps({"step": 0})).read_bytes()[:-7]),
     "not a readable checkpoint"),
    ("no_metadata", lambda p: _meta_file(p, None), "not a readable checkpoint"),
    ("meta_not_json", lambda p: _meta_file(p, "{not json"), "not a readable checkpoint"),
    ("meta_not_object", lambda p: _meta_file(p, "[1, 2]"), "no run record"),
    ("meta_missing_fields", lambda p: _meta_file(p, json.dumps({"step": 1})), "malformed run record"),
    ("losses_length", lambda p: _meta_file(p, json.dumps({"step": 2, "run_id": "r", "seq": 0, "losses": [1.0]})),
     "malformed run record"),
    ("negative_step", lambda p: _meta_file(p, json.dumps({"step": -1, "run_id": "r", "seq": 0, "losses": []})),
     "malformed run record"),
    ("settings_not_object", lambda p: _meta_file(p, json.dumps({"step": 0, "run_id": "r", "seq": 0, "losses": [],
                                                                 "settings": "x"})), "malformed run settings"),
]


@pytest.mark.parametrize("name, write, message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_unreadable_or_malformed_checkpoints_are_one_line_errors(tmp_path, name, write, message):
    path = tmp_path / "ck.safetensors"
    write(path)
    with pytest.raises(BadInput, match=message) as e:
        load_checkpoint(path)
    assert str(e.value).endswith("delete it to start over") and "\n" not in str(e.value)


def test_round_trip_and_non_finite_losses_are_stored_as_null(tmp_path):
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, {"state": torch.arange(4.0)}, step=2, run_id="r1", seq=5, losses=[1.5, float("nan")],
                    settings=SETTINGS)
    ck = load_checkpoint(path)
    assert (ck.step, ck.run_id, ck.seq, ck.losses, ck.settings) == (2, "r1", 5, [1.5, None], SETTINGS)
    assert torch.equal(ck.tensors["state"], torch.arange(4.0))


def _with(**changes):
    out = json.loads(json.dumps(SETTINGS))
    for key, value in changes.items():
        if key.startswith("opt_"):
            out["optimizer"][key[4:]] = value
        else:
            out[key] = value
    return out


# (what changed in this run, the words the message must contain)
MISMATCHES = [
    (_with(opt_lr=0.001), "optimizer `lr` was 0.01, now 0.001"),
    (_with(opt_kind="sgd"), "optimizer `kind` was \"adamw\", now \"sgd\""),
    (_with(shuffle_seed=4), "--shuffle seed was 3, now 4"),
    (_with(shuffle_seed=None), "--shuffle seed was 3, now null"),
    (_with(data="ef" * 32), "training rows (sha256) was"),
    (_with(program="01" * 32), "program (manifest sha256) was"),
    (_with(plan={"k": 2}), "LCSB plan was null"),
    (_with(trainer="eager"), "trainer was \"program\", now \"eager\""),
]


@pytest.mark.parametrize("current, message", MISMATCHES, ids=[m[1].split(" was")[0] for m in MISMATCHES])
def test_a_checkpoint_of_another_run_names_the_difference(tmp_path, current, message):
    with pytest.raises(BadInput, match="belongs to another run") as e:
        check_settings(tmp_path / "ck", SETTINGS, current)
    assert message in str(e.value) and str(e.value).endswith("delete it to start over")


def test_same_settings_pass_and_unverifiable_checkpoints_are_refused(tmp_path):
    check_settings(tmp_path / "ck", SETTINGS, json.loads(json.dumps(SETTINGS)))
    with pytest.raises(BadInput, match="records no run settings.*delete it to start over"):
        check_settings(tmp_path / "ck", None, SETTINGS)


# (name, the checkpoint's tensors, run record written, message): a program's checkpoint is read one way,
# whether `train --program --resume` or `eval` / `generate --resume-from` reads it.
PROGRAM_STATES = [
    ("no_run_record", {"state": torch.zeros(6)}, False, "not a readable checkpoint"),
    ("eager_tensors", {"lora.0.q_proj.a": torch.zeros(6)}, True, "holds no flat float32 `state`"),
    ("extra_tensor", {"state": torch.zeros(6), "x": torch.zeros(1)}, True, "holds no flat float32 `state`"),
    ("float64", {"state": torch.zeros(6, dtype=torch.float64)}, True, "holds no flat float32 `state`"),
    ("matrix", {"state": torch.zeros(2, 3)}, True, "holds no flat float32 `state`"),
    ("other_size", {"state": torch.zeros(5)}, True, "has 5 state values, the program 6"),
    ("nan", {"state": torch.full((6,), float("nan"))}, True, "NaN or infinite"),
]


@pytest.mark.parametrize("name, tensors, record, message", PROGRAM_STATES, ids=[c[0] for c in PROGRAM_STATES])
def test_a_program_checkpoint_that_does_not_fit_is_one_error(tmp_path, name, tensors, record, message):
    ck = tmp_path / "ck.safetensors"
    if record:
        save_checkpoint(ck, tensors, step=1, run_id="r", seq=0, losses=[1.0], settings=SETTINGS)
    else:
        ck.write_bytes(save(tensors))
    with pytest.raises(BadInput, match=f"^checkpoint {re.escape(str(ck))}") as e:
        load_program_state(ck, 6)
    assert message in str(e.value) and str(e.value).endswith("delete it to start over" if name != "nan" else "--lr")


def test_a_program_checkpoint_gives_its_state_as_resume_does(tmp_path):
    ck, state = tmp_path / "ck.safetensors", torch.arange(6, dtype=torch.float32)
    save_checkpoint(ck, {"state": state}, step=1, run_id="r", seq=0, losses=[1.0], settings=SETTINGS)
    got = load_program_state(ck, 6)
    assert torch.equal(got, state)
    assert torch.equal(program_state_of(load_checkpoint(ck).tensors, 6, ck), got)
    got += 1                                                    # a copy: the caller trains it in place
    assert torch.equal(load_program_state(ck, 6), state)
