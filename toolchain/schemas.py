"""The host <-> phone contract: JSON Schemas in `shared_schemas/` (draft 2020-12), and helpers to
validate, read and write the documents they describe.

File names live here once. JSON we write is deterministic (`indent=2, sort_keys=True`) and is
validated before writing and after reading.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from toolchain.atomic import atomic_write_text
from toolchain.errors import BadInput, SchemaError

__all__ = ["SCHEMA_DIR", "SCHEMA_NAMES", "load_schema", "validate", "validation_errors", "read_json", "write_json",
           "dumps"]

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "shared_schemas"

# Document kind -> schema file in SCHEMA_DIR.
SCHEMA_NAMES: dict[str, str] = {
    "data_row": "data_row.schema.json",
    "manifest": "manifest.schema.json",
    # Contract v2 (whole-step methods): the toolchain no longer writes it; the Android and iOS cores read
    # it until they move to v3 (issue 16), so its schema and examples stay their reference.
    "manifest_v2": "manifest_v2.schema.json",
    "telemetry_event": "telemetry_event.schema.json",
    "device_profile": "device_profile.schema.json",
    "run_summary": "run_summary.schema.json",
    "step_plan": "step_plan.schema.json",
    "bench_lcsb": "bench_lcsb.schema.json",
    "bench_memory": "bench_memory.schema.json",
    "bench_tables": "bench_tables.schema.json",
    "bench_mezo": "bench_mezo.schema.json",
}


@functools.cache
def load_schema(kind: str) -> dict:
    if kind not in SCHEMA_NAMES:
        raise KeyError(f"no schema for {kind!r}; known: {', '.join(SCHEMA_NAMES)}")
    return json.loads((SCHEMA_DIR / SCHEMA_NAMES[kind]).read_text())


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


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def read_json(path: Path, kind: str | None = None) -> Any:
    """Parse a JSON file; validate it against schema `kind` unless None. One-line BadInput on failure."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path} does not exist") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if kind is not None:
        validate(kind, doc, where=str(path))
    return doc


def write_json(path: Path, kind: str, doc: Any) -> None:
    validate(kind, doc, where=f"{kind} for {path}")
    atomic_write_text(Path(path), dumps(doc))
