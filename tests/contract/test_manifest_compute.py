"""The manifest's `compute` field (`export --compute`): absent means fp32 and stays absent through a read and
a write; fp16 and int8 read and write back; any other value is one schema error naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolchain.contract import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from toolchain.errors import SchemaError
from toolchain.schemas import SCHEMA_DIR

EXAMPLE = sorted((SCHEMA_DIR / "examples").glob("manifest_tiny*.json"))[0]


def _write(tmp_path: Path, doc: dict) -> Path:
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(doc))
    return tmp_path / MANIFEST_NAME


def test_absent_compute_is_fp32_and_stays_absent(tmp_path):
    doc = json.loads(EXAMPLE.read_text())
    assert "compute" not in doc
    m = read_manifest(EXAMPLE)
    assert m.compute == "fp32" and "compute" not in m.to_json()
    write_manifest(tmp_path / MANIFEST_NAME, m)
    assert json.loads((tmp_path / MANIFEST_NAME).read_text()) == doc


@pytest.mark.parametrize("value", ["fp16", "int8", "fp32"])
def test_a_stated_compute_round_trips(tmp_path, value):
    doc = json.loads(EXAMPLE.read_text()) | {"compute": value}
    m = read_manifest(_write(tmp_path, doc))
    assert m.compute == value and m.to_json() == doc and Manifest.from_json(m.to_json()) == m


def test_another_compute_is_one_schema_error_naming_the_field(tmp_path):
    doc = json.loads(EXAMPLE.read_text()) | {"compute": "bf16"}
    with pytest.raises(SchemaError, match="manifest.json is not a valid manifest") as e:
        read_manifest(_write(tmp_path, doc))
    assert "compute" in str(e.value) and "\n" not in str(e.value)
