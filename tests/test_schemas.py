"""Every file in shared_schemas/examples/ validates against its schema; every file in
shared_schemas/examples/invalid/ is refused. Nothing is skipped: a file whose name maps to no schema,
or with another extension, fails the test (the Kotlin and Swift cores read the same files).

Naming: an example's file name starts with its kind (a key of `toolchain.schemas.SCHEMA_NAMES`),
followed by `_...` or nothing: `data_row.json`, `manifest_tiny.json`, `device_profile_custom.json`.
`telemetry*.json` is a telemetry_event: a single event or a non-empty array of events.
`.jsonl` files hold one document per line.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from toolchain.schemas import SCHEMA_DIR, SCHEMA_NAMES, load_schema, validation_errors

EXAMPLES = SCHEMA_DIR / "examples"
INVALID = EXAMPLES / "invalid"
ALIASES = {"telemetry": "telemetry_event"}   # file-name prefix -> kind, besides the kinds themselves
BATCH_KINDS = {"telemetry_event"}            # kinds whose examples may be an array of documents


def kind_of(path: Path) -> str | None:
    """The kind an example's name starts with (the longest match), or None."""
    stem = path.name.split(".")[0]
    prefixes = {**{k: k for k in SCHEMA_NAMES}, **{a: k for a, k in ALIASES.items() if k in SCHEMA_NAMES}}
    matches = [p for p in prefixes if stem == p or stem.startswith(p + "_")]
    return prefixes[max(matches, key=len)] if matches else None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def documents(path: Path) -> list:
    """The documents a file holds, parsed strictly (NaN/Infinity refused)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line, parse_constant=_reject_constant) for line in text.splitlines() if line.strip()]
    doc = json.loads(text, parse_constant=_reject_constant)
    if kind_of(path) in BATCH_KINDS and isinstance(doc, list):
        return doc
    return [doc]


def problems(path: Path) -> list[str]:
    """Why a file is not a valid example of its kind (empty when it is)."""
    kind = kind_of(path)
    try:
        docs = documents(path)
    except (ValueError, UnicodeDecodeError) as e:
        return [f"not JSON: {e}"]
    if not docs:
        return ["holds no document"]
    return [f"document {i}: {msg}" for i, doc in enumerate(docs) for msg in validation_errors(kind, doc)]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file())


VALID = _files(EXAMPLES)
REFUSED = _files(INVALID)


def test_examples_folder_holds_only_example_files():
    strays = [p.name for p in EXAMPLES.iterdir() if p.is_dir() and p != INVALID]
    strays += [p.name for p in VALID + REFUSED if p.suffix not in (".json", ".jsonl")]
    assert not strays, f"not an example file (.json/.jsonl) or folder other than invalid/: {strays}"


@pytest.mark.parametrize("path", VALID + REFUSED, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_maps_to_a_schema(path):
    assert kind_of(path) is not None, (
        f"{path.name} starts with no kind of SCHEMA_NAMES ({', '.join(SCHEMA_NAMES)}) nor alias "
        f"({', '.join(ALIASES)}); rename it or register its schema in toolchain/schemas.py")


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_validates(path):
    if kind_of(path) is None:
        pytest.fail(f"{path.name} maps to no schema")
    assert problems(path) == []


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.name)
def test_invalid_example_is_refused(path):
    if kind_of(path) is None:
        pytest.fail(f"{path.name} maps to no schema")
    assert problems(path), f"{path.name} is in invalid/ but its schema accepts it"


@pytest.mark.parametrize("kind", sorted(SCHEMA_NAMES))
def test_schema_is_valid_draft_2020_12_with_a_version(kind):
    schema = load_schema(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "schema_version" in schema.get("properties", {}), f"{kind} has no schema_version property"


@pytest.mark.parametrize("kind", sorted(SCHEMA_NAMES))
def test_every_kind_has_a_valid_and_an_invalid_example(kind):
    assert any(kind_of(p) == kind for p in VALID), f"no valid example of {kind} in {EXAMPLES}"
    assert any(kind_of(p) == kind for p in REFUSED), f"no invalid example of {kind} in {INVALID}"


@pytest.mark.parametrize("name, kind", [
    ("data_row.json", "data_row"), ("data_row_x.json", "data_row"), ("telemetry.json", "telemetry_event"),
    ("telemetry_run.json", "telemetry_event"), ("telemetry_event_a.json", "telemetry_event"),
    ("device_profile_a.json", "device_profile"), ("run_summary_a.json", "run_summary"),
    ("data_rows.json", None), ("telemetryx.json", None), ("unknown.json", None),
])
def test_kind_of_file_names(name, kind):
    assert kind_of(Path(name)) == kind
