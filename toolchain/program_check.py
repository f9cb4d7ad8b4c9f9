"""The checks of an exported program's manifest that every command runs, torch-free (`toolchain data` and
`toolchain tokenize` read a program's tokenizer and seq_len without loading a runtime).

The manifest is not covered by a checksum, so what it says is checked before anything follows it:
strict JSON whose fields are valid against shared_schemas/manifest.schema.json (required, typed, the
tokenizer kind among the known ones; `ProgramDir` validates the whole document), every path it names (files, weights, state init,
programs, adapter, tokenizer) relative and inside the directory, the tokenizer file checksummed, the
tokenizer's vocabulary and special ids inside the model's, seq_len within the model's positions.
`runtime.program_dir.ProgramDir` runs these first, then its own cross-checks (state layout, methods).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.errors import BadInput

__all__ = ["MANIFEST_FILE", "read_program_manifest", "check_program_manifest", "inside"]

MANIFEST_FILE = "manifest.json"
_REDO = "re-export the program"


def inside(program: Path, rel: Any, what: str) -> Path:
    """`program / rel`, refused unless `rel` is a relative path that stays inside `program` (links resolved)."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise BadInput(f"{program}: the manifest's {what} {str(rel)[:60]!r} is not a file name; {_REDO}")
    f = (program / rel).resolve()
    if Path(rel).is_absolute() or not f.is_relative_to(Path(program).resolve()):
        raise BadInput(f"{program}: the manifest's {what} {rel!r} points outside the program directory; {_REDO}")
    return f


def check_program_manifest(program: Path, m: dict) -> None:
    """Paths and ranges of a manifest `m` of the directory `program` whose fields `read_program_manifest`
    (or the whole schema) checked: see the module docstring."""
    program = Path(program)
    where = str(program / MANIFEST_FILE)
    files = m["files"]
    for rel in files:
        inside(program, rel, "file")
    named = []
    if "weights" in m:
        named.append((m["weights"]["file"], "weights file"))
    if "state" in m:
        named.append((m["state"]["init_file"], "state init file"))
    named += [(p["file"], f"{p['target']} program") for p in m.get("programs", ())]
    adapter_dir = (m.get("adapter") or {}).get("init_dir")
    if adapter_dir is not None:
        named.append((adapter_dir, "adapter directory"))
    tok = m["tokenizer"]
    if tok.get("file") is not None:
        named.append((tok["file"], "tokenizer file"))
    for rel, what in named:
        inside(program, rel, what)
    if tok.get("file") is not None and tok["file"] not in files:
        raise BadInput(f"{where}: the tokenizer file {tok['file']!r} has no checksum in 'files'; {_REDO}")
    arch = m["model"]["arch"]
    vocab = arch["vocab"]
    ids = {k: tok.get(k) for k in ("pad_token_id", "eos_token_id", "bos_token_id")}
    bad = [f"{k} {v}" for k, v in ids.items() if v is not None and not 0 <= v < vocab]
    if tok["vocab"] != vocab or bad:
        raise BadInput(f"{where}: tokenizer vocab {tok['vocab']} / {', '.join(bad) or 'ids'} do not fit the model's "
                       f"vocabulary of {vocab}; {_REDO}")
    if not 2 <= m["seq_len"] <= arch["max_positions"]:
        raise BadInput(f"{where}: seq_len {m['seq_len']} is outside 2..{arch['max_positions']} (the model's "
                       f"max_position_embeddings); {_REDO}")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_read_fields(doc: dict, where: str) -> None:
    """The fields a tokenizer-only reader uses (`tokenizer`, `seq_len`, `files`, `model.arch.vocab` and
    `max_positions`), each against the manifest schema's own definition of it."""
    from toolchain.schemas import load_schema

    import jsonschema

    props = load_schema("manifest")["properties"]
    for key in ("tokenizer", "seq_len", "files"):
        if key not in doc:
            raise BadInput(f"{where}: the required field {key!r} is missing; {_REDO}")
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(props[key]).iter_errors(doc[key]))
        if error is not None:
            path = "/".join(map(str, error.absolute_path))
            raise BadInput(f"{where}: {key}{'/' + path if path else ''}: {error.message}; {_REDO}")
    arch = doc.get("model", {}).get("arch") if isinstance(doc.get("model"), dict) else None
    if not isinstance(arch, dict) or not all(_int(arch.get(k)) and arch[k] >= 1 for k in ("vocab", "max_positions")):
        raise BadInput(f"{where}: model.arch.vocab / max_positions are missing or not positive integers; {_REDO}")


def read_program_manifest(program: Path) -> dict:
    """The manifest of the program directory `program`, strictly parsed, its fields that reading the
    tokenizer and seq_len needs checked against the schema, then `check_program_manifest`.

    Raises:
        BadInput: no manifest, another schema version, or any check failing (one line, naming it).
    """
    from toolchain.schemas import load_schema, read_json

    program = Path(program)
    path = program / MANIFEST_FILE
    if not path.is_file():
        raise BadInput(f"{program} is not a program directory (no {MANIFEST_FILE}); run `toolchain export` first")
    doc = read_json(path)
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    wanted = load_schema("manifest")["properties"]["schema_version"]["const"]
    if version != wanted:
        raise BadInput(f"{program} was exported with manifest schema_version {version}; this toolchain reads "
                       f"version {wanted}: {_REDO}")
    _check_read_fields(doc, str(path))
    check_program_manifest(program, doc)
    return doc
