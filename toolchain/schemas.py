"""The host <-> phone contract: JSON Schemas in `shared_schemas/` (draft 2020-12), and helpers to
validate, read and write the documents they describe.

The schemas ship inside the package as `toolchain/schemas_data/` (package data, read through
importlib.resources): in the repository that is a symlink to `shared_schemas/`, the one source the
apps are tested against too; a wheel holds a copy (setuptools follows the link).

File names live here once. JSON we write is deterministic (`indent=2, sort_keys=True`) and is
validated before writing and after reading.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

from toolchain import validate as _strict
from toolchain.atomic import atomic_write_text
from toolchain.errors import SchemaError

__all__ = ["SCHEMA_DIR", "SCHEMA_NAMES", "load_schema", "validate", "validation_errors", "read_json", "write_json",
           "dumps"]

# In a source checkout this resolves to shared_schemas/ (examples included); installed, to the packaged copy.
SCHEMA_DIR = Path(str(resources.files("toolchain").joinpath("schemas_data")))

# Document kind -> schema file in SCHEMA_DIR.
SCHEMA_NAMES: dict[str, str] = {
    "data_row": "data_row.schema.json",
    "manifest": "manifest.schema.json",
    "telemetry_event": "telemetry_event.schema.json",
    "device_profile": "device_profile.schema.json",
    "run_summary": "run_summary.schema.json",
    "step_plan": "step_plan.schema.json",
    "bench_lcsb": "bench_lcsb.schema.json",
    "bench_memory": "bench_memory.schema.json",
    "bench_tables": "bench_tables.schema.json",
    "bench_mezo": "bench_mezo.schema.json",
    "feedback": "feedback.schema.json",
    "preference_pair": "preference_pair.schema.json",
}


@functools.cache
def load_schema(kind: str) -> dict:
    if kind not in SCHEMA_NAMES:
        raise KeyError(f"no schema for {kind!r}; known: {', '.join(SCHEMA_NAMES)}")
    text = resources.files("toolchain").joinpath("schemas_data", SCHEMA_NAMES[kind]).read_text(encoding="utf-8")
    return json.loads(text)


@functools.cache
def _validator(kind: str):
    import jsonschema

    schema = load_schema(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def validation_errors(kind: str, doc: Any) -> list[str]:
    """Every violation of `kind`'s schema, as `path: message` strings (empty when valid)."""
    errors = sorted(_validator(kind).iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def validate(kind: str, doc: Any, *, where: str = "document") -> None:
    """Raise SchemaError naming the first violation (and how many there are)."""
    errors = validation_errors(kind, doc)
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SchemaError(f"{where} is not a valid {kind}: {errors[0]}{more}")


def dumps(doc: Any, *, where: str = "document") -> str:
    """Deterministic JSON; never NaN/Infinity (BadInput instead: they are not JSON)."""
    return _strict.dumps(doc, where=where, indent=2, sort_keys=True) + "\n"


def read_json(path: Path, kind: str | None = None) -> Any:
    """Parse a JSON file strictly (UTF-8, finite numbers, nesting limit: `toolchain.validate`); validate it
    against schema `kind` unless None. One-line BadInput on failure."""
    path = Path(path)
    doc = _strict.read_json(path)
    if kind is not None:
        validate(kind, doc, where=str(path))
    return doc


def write_json(path: Path, kind: str, doc: Any) -> None:
    validate(kind, doc, where=f"{kind} for {path}")
    atomic_write_text(Path(path), dumps(doc, where=str(path)))
