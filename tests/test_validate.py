"""The validation layer: strict JSON, UTF-8 files, finite numbers, bounds from the model."""

from __future__ import annotations

import json

import click
import pytest

from toolchain.errors import BadInput
from toolchain.models import get_preset
from toolchain.validate import MAX_JSON_DEPTH, FiniteFloat, check_json, check_rank, check_seq_len, dumps, loads, read_text


@pytest.mark.parametrize("text, message", [
    ("NaN", "NaN is not valid JSON"),
    ('{"x": Infinity}', "Infinity is not valid JSON"),
    ("[-Infinity]", "-Infinity is not valid JSON"),
    ('{"t": 1e400}', "out of range"),
    ('{"t": -1e400}', "out of range"),
    ('{"seq": 99999999999999999999999}', "out of range"),
    (f'{{"seq": {2**63}}}', "out of range"),
    ('{"seq": ' + "9" * 5000 + "}", "out of range"),
    ('"\\ud800"', "lone surrogate"),
    ('{"\\udfff": 1}', "lone surrogate"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested too deeply"),
    (b'{"a": "\xff"}', "not UTF-8"),
    ("{", "not valid JSON"),
])
def test_strict_json_refuses(text, message):
    with pytest.raises(BadInput, match=message):
        loads(text, "doc")


def test_strict_json_accepts_what_we_write():
    doc = {"a": [1, 2.5, -3, None, True, "é \U0001f600"], "b": {"c": 2**63 - 1, "d": -(2**63)}, "e": 1e308}
    assert loads(json.dumps(doc)) == doc
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads(deep) is not None


def test_we_never_write_non_finite_json():
    with pytest.raises(BadInput, match="non-finite"):
        dumps({"lr": float("inf")}, where="manifest")
    with pytest.raises(BadInput, match="not a finite number"):
        check_json({"x": [float("nan")]})


def test_a_non_utf8_file_names_its_line(tmp_path):
    p = tmp_path / "f.txt"
    p.write_bytes(b"ok\nstill ok\ncaf\xe9\n")
    with pytest.raises(BadInput, match=r"not UTF-8 text \(byte 0xe9 at line 3"):
        read_text(p)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity", "1e400"])
def test_finite_float_refuses_non_finite(value):
    with pytest.raises(click.BadParameter, match="not a finite number"):
        FiniteFloat(min=0).convert(value, None, None)


def test_finite_float_keeps_the_range():
    assert FiniteFloat(min=0, min_open=True).convert("1e-3", None, None) == 1e-3
    with pytest.raises(click.BadParameter):
        FiniteFloat(min=0, min_open=True).convert("0", None, None)


def test_bounds_come_from_the_model():
    arch = get_preset("tiny")
    check_rank(8, arch, ("q_proj",))
    with pytest.raises(BadInput, match=r"at most \d+"):
        check_rank(100_000, arch, ("q_proj", "k_proj"))
    with pytest.raises(BadInput, match="max_position_embeddings"):
        check_seq_len(arch.max_positions + 1, arch)


def test_library_errors_name_the_field_and_the_cli_the_option():
    from click.testing import CliRunner

    from toolchain.cli import cli
    from toolchain.errors import FieldError

    arch = get_preset("tiny")
    with pytest.raises(FieldError, match="^rank 100000 is larger") as e:
        check_rank(100_000, arch, ("q_proj",))
    assert e.value.field == "rank" and e.value.named("--rank").startswith("--rank 100000 is larger")
    with pytest.raises(FieldError, match="^seq_len 100000 is longer") as e:
        check_seq_len(100_000, arch)
    r = CliRunner().invoke(cli, ["plan", "fit", "--model", "tiny", "--seq-len", "100000", "--device", "android-8gb"])
    assert r.exit_code == 2 and "Error: --seq-len 100000 is longer than the model's" in r.output, r.output
