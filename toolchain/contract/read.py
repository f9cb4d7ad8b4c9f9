"""Reading and writing manifest.json: the one place the manifest's JSON is parsed, validated and written.

The manifest is not covered by a checksum, so what it says is checked before anything follows it. Three
readers, from the least to the most a caller relies on:

- `read_text_fields(dir)`: what a torch-free text reader needs (`toolchain data`, `toolchain tokenize`): the
  tokenizer, seq_len, files and the model's vocabulary, each field against the schema's own definition of it,
  then `check_paths`.
- `read_manifest(path)`: the whole document, strict JSON of schema_version 3, valid against
  shared_schemas/manifest.schema.json, as a typed `Manifest` (the planner reads older exports with it).
- `read_program_manifest(dir)`: `read_manifest`, then refuses exports older than chunked prefill and the
  int4 packing, then `check_paths`. `program.ProgramDir` adds the cross-checks against the config.

`check_paths`: every path the manifest names (files, weights, state init, programs, adapter, tokenizer)
relative and inside the directory, the tokenizer file checksummed, the tokenizer's vocabulary and special ids
inside the model's, seq_len within the model's positions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolchain.contract.files import INT4_PACKING, MANIFEST_NAME, MANIFEST_SCHEMA_VERSION
from toolchain.contract.manifest import Manifest, TokenizerSection
from toolchain.errors import BadInput

__all__ = ["ManifestVersionError", "ProgramTextFields", "read_manifest", "read_program_manifest", "read_text_fields",
           "write_manifest", "check_paths", "inside", "manifest_path"]

_REDO = "re-export the program"


class ManifestVersionError(BadInput):
    """A manifest of another schema_version (`version`: what it says, None when it says nothing)."""

    def __init__(self, path: Path, version: Any) -> None:
        super().__init__(f"{Path(path).parent} was exported with manifest schema_version {version}; this toolchain "
                         f"runs version {MANIFEST_SCHEMA_VERSION} (layer-generic methods): {_REDO}")
        self.path, self.version = Path(path), version


def manifest_path(program: Path) -> Path:
    """The manifest of program directory `program`, which must exist.

    Raises:
        BadInput: no manifest.json in `program`.
    """
    path = Path(program) / MANIFEST_NAME
    if not os.path.lexists(path):     # a FIFO or a link loop: refused when read (toolchain.inputs)
        raise BadInput(f"{program} is not an exported program (no {MANIFEST_NAME}); run `toolchain export` first")
    return path


def _document(path: Path) -> dict:
    """Strict JSON (toolchain.validate) of schema_version 3."""
    from toolchain.schemas import read_json

    doc = read_json(path)
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != MANIFEST_SCHEMA_VERSION:
        raise ManifestVersionError(path, version)
    return doc


def read_manifest(path: Path) -> Manifest:
    """The manifest file `path`, strictly parsed, schema-valid, typed.

    Raises:
        BadInput: unreadable, not strict JSON, or another schema_version (`ManifestVersionError`).
        SchemaError: the document violates the manifest schema (the first violation named).
    """
    from toolchain.schemas import validate

    path = Path(path)
    doc = _document(path)
    validate("manifest", doc, where=str(path))
    return Manifest.from_json(doc)


def read_program_manifest(program: Path) -> Manifest:
    """The manifest of the program directory `program`: `read_manifest`, exports older than this toolchain's
    generation methods and int4 packing refused, `check_paths`.

    Raises:
        BadInput: no manifest, another version, an older export, or a path or range check failing.
        SchemaError: the document violates the manifest schema.
    """
    path = manifest_path(program)
    _refuse_before_fused_generation(_document(path), path)
    manifest = read_manifest(path)
    if manifest.quant.kind == "int4" and manifest.quant.int4_packing != INT4_PACKING:
        raise BadInput("the program's int4 weights use an older packing (planar nibbles, before int4_packing "
                       f"{INT4_PACKING!r}); re-export the program with this toolchain")
    check_paths(program, manifest.to_json())
    return manifest


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write `manifest` to `path` (schema-validated first; deterministic JSON; atomic)."""
    from toolchain.schemas import write_json

    write_json(Path(path), "manifest", manifest.to_json())


def _refuse_before_fused_generation(raw: dict, path: Path) -> None:
    """Programs exported before chunked prefill and int4 embedding/head (same schema_version 3): re-export."""
    gen, quant = raw.get("generate"), raw.get("quant")
    old_gen = isinstance(gen, dict) and "prefill_chunk" not in gen
    old_int4 = isinstance(quant, dict) and quant.get("kind") == "int4" and "head" not in quant
    if old_gen or old_int4:
        what = "its generation methods prefill the whole seq_len" if old_gen else "its embedding and LM head are float32"
        raise BadInput(f"{path.parent} was exported before chunked prefill and the int4 embedding/head ({what}); "
                       f"{_REDO} with this toolchain")


# -- the text fields ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProgramTextFields:
    """The manifest fields a torch-free text reader needs (`read_text_fields`)."""

    seq_len: int
    vocab: int
    tokenizer: TokenizerSection
    files: dict[str, str]


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_text_fields(doc: dict, where: str) -> None:
    """`tokenizer`, `seq_len`, `files` each against the manifest schema's definition of it; `model.arch.vocab`
    and `max_positions` positive integers."""
    import jsonschema

    from toolchain.schemas import load_schema

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


def read_text_fields(program: Path) -> ProgramTextFields:
    """The tokenizer, seq_len, files and vocabulary of the program directory `program`, strictly parsed, each
    field checked against the schema, then `check_paths` (the rest of the document is not read).

    Raises:
        BadInput: no manifest, another schema version, or any check failing (one line, naming it).
    """
    program = Path(program)
    path = program / MANIFEST_NAME
    if not os.path.lexists(path):
        raise BadInput(f"{program} is not a program directory (no {MANIFEST_NAME}); run `toolchain export` first")
    try:
        doc = _document(path)
    except ManifestVersionError as e:
        raise BadInput(f"{program} was exported with manifest schema_version {e.version}; this toolchain reads "
                       f"version {MANIFEST_SCHEMA_VERSION}: {_REDO}") from None
    _check_text_fields(doc, str(path))
    check_paths(program, doc)
    return ProgramTextFields(doc["seq_len"], doc["model"]["arch"]["vocab"], TokenizerSection.from_json(doc["tokenizer"]),
                             dict(doc["files"]))


# -- paths and ranges --------------------------------------------------------------------------------

def inside(program: Path, rel: Any, what: str) -> Path:
    """`program / rel`, refused unless `rel` is a relative path that stays inside `program` (links resolved)."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise BadInput(f"{program}: the manifest's {what} {str(rel)[:60]!r} is not a file name; {_REDO}")
    f = (program / rel).resolve()
    if Path(rel).is_absolute() or not f.is_relative_to(Path(program).resolve()):
        raise BadInput(f"{program}: the manifest's {what} {rel!r} points outside the program directory; {_REDO}")
    return f


def check_paths(program: Path, m: dict) -> None:
    """Paths and ranges of a manifest document `m` of the directory `program` whose fields were checked
    (`read_text_fields`, or the whole schema): see the module docstring."""
    program = Path(program)
    where = str(program / MANIFEST_NAME)
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
