"""The typed manifest (toolchain/contract): every manifest we ship or keep reads into the dataclass tree and
writes back as the same document; a bad one is one error naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolchain.contract import (MANIFEST_NAME, Manifest, ManifestVersionError, StateEntry, read_manifest,
                                read_program_manifest, read_text_fields, write_manifest)
from toolchain.errors import BadInput, SchemaError
from toolchain.schemas import SCHEMA_DIR

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((SCHEMA_DIR / "examples").glob("manifest_tiny*.json"))
# manifests of real exports: the recorded traces' programs and the planner's calibration programs (older exports)
RECORDED = sorted((REPO / "shared_schemas" / "traces").glob("*/program/manifest.json")) + \
    sorted((REPO / "tests" / "memory" / "data").glob("*/*.manifest.json"))


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", EXAMPLES + RECORDED, ids=lambda p: str(p.relative_to(REPO)))
def test_typed_manifest_round_trips(path):
    doc = _doc(path)
    manifest = read_manifest(path)
    assert manifest.to_json() == doc
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_writing_a_read_manifest_gives_the_same_file(tmp_path):
    for path in EXAMPLES:
        write_manifest(tmp_path / MANIFEST_NAME, read_manifest(path))
        assert _doc(tmp_path / MANIFEST_NAME) == _doc(path)


def test_typed_views_of_the_generate_example():
    m = read_manifest(SCHEMA_DIR / "examples" / "manifest_tiny_generate.json")
    doc = _doc(SCHEMA_DIR / "examples" / "manifest_tiny_generate.json")
    assert m.seq_len == doc["seq_len"] and m.lora.targets == tuple(doc["lora"]["targets"])
    assert list(m.methods) == [x["name"] for x in doc["methods"]]
    assert m.state.entries[0] == StateEntry.from_json(doc["state"]["entries"][0])
    assert m.generate is not None and m.generate.fused_methods() == (doc["generate"]["fused"] or {}).get("methods", {})
    assert set(m.training_methods()) <= set(m.memory_plan.planned_arena_bytes["executorch"])
    assert m.targets == [p["target"] for p in doc["programs"]] and m.program("coreml") is None


def _write(tmp_path: Path, doc: dict) -> Path:
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(doc))
    return tmp_path / MANIFEST_NAME


@pytest.mark.parametrize("edit, field", [
    (lambda m: m["tokenizer"].pop("pad_token_id"), "pad_token_id"),
    (lambda m: m["quant"].update(kind="int3"), "quant/kind"),
    (lambda m: m["state"]["entries"][0].update(offset=-1), "state/entries/0/offset"),
    (lambda m: m["methods"][0]["inputs"][0].update(bind="somewhere"), "methods/0/inputs/0/bind"),
    (lambda m: m.pop("loop"), "'loop' is a required property"),
])
def test_a_bad_manifest_is_one_error_naming_the_field(tmp_path, edit, field):
    doc = _doc(EXAMPLES[0])
    edit(doc)
    with pytest.raises(SchemaError, match="manifest.json is not a valid manifest") as e:
        read_manifest(_write(tmp_path, doc))
    assert field in str(e.value) and "\n" not in str(e.value)


def test_another_schema_version_is_refused_with_the_way_out(tmp_path):
    doc = _doc(EXAMPLES[0]) | {"schema_version": 2}
    with pytest.raises(ManifestVersionError, match="schema_version 2; this toolchain runs version 3 .*re-export") as e:
        read_manifest(_write(tmp_path, doc))
    assert e.value.version == 2


def test_program_reader_checks_paths_and_older_exports(tmp_path):
    doc = _doc(EXAMPLES[0])
    doc["weights"]["file"] = "../../etc/passwd"
    _write(tmp_path, doc)
    with pytest.raises(BadInput, match="weights file '../../etc/passwd' points outside the program directory"):
        read_program_manifest(tmp_path)
    doc = _doc(EXAMPLES[0])
    del doc["quant"]["head"]                       # an int4 export from before the int4 embedding/head
    _write(tmp_path, doc)
    with pytest.raises(BadInput, match="exported before chunked prefill"):
        read_program_manifest(tmp_path)
    with pytest.raises(BadInput, match="no manifest.json"):
        read_program_manifest(tmp_path / "nothing")


def test_text_fields_read_only_what_text_readers_need(tmp_path):
    doc = _doc(EXAMPLES[0])
    partial = {k: doc[k] for k in ("schema_version", "seq_len", "model", "tokenizer", "files")}
    _write(tmp_path, partial)
    fields = read_text_fields(tmp_path)
    assert (fields.seq_len, fields.vocab, fields.tokenizer.kind) == (64, 264, "byte")
    partial["tokenizer"]["kind"] = "klingon"
    _write(tmp_path, partial)
    with pytest.raises(BadInput, match="tokenizer/kind: 'klingon'"):
        read_text_fields(tmp_path)


def test_lcsb_warmup_round_trips_and_is_written_only_when_given():
    """`lcsb.warmup` (a plan's full-backprop warm-up) is optional: a manifest with it keeps it, one without it
    stays without it; the schema refuses a negative one."""
    from toolchain.contract import LcsbSection
    from toolchain.schemas import validation_errors

    doc = _doc(EXAMPLES[0])
    assert "warmup" not in doc["lcsb"]
    warm = {**doc, "lcsb": {**doc["lcsb"], "warmup": 3}}
    assert validation_errors("manifest", warm) == []
    manifest = Manifest.from_json(warm)
    assert manifest.lcsb.warmup == 3 and manifest.to_json() == warm
    assert Manifest.from_json(doc).lcsb.warmup is None and Manifest.from_json(doc).to_json() == doc
    assert validation_errors("manifest", {**doc, "lcsb": {**doc["lcsb"], "warmup": -1}}) != []
    # as the export writes it (toolchain/program/manifest.py): absent when 0
    section = LcsbSection("cyclic", ((0,),), (0,), 1, None, None, absent=frozenset({"warmup"}))
    assert "warmup" not in section.to_json()


def test_run_defaults_round_trip_and_old_manifests_fall_back(tmp_path):
    """`defaults` (lr, steps: what the apps and `train --program` use when the user chooses nothing) is optional: a
    manifest with it keeps it; one without it (older exports, library exports) reads as None, and the program's
    default_lr is then optimizer.default_lr with no default steps; the schema refuses a bad one."""
    import shutil

    from toolchain.contract import DefaultsSection
    from toolchain.program.directory import ProgramDir
    from toolchain.schemas import validation_errors

    doc = _doc(EXAMPLES[0])
    assert "defaults" not in doc
    with_defaults = {**doc, "defaults": {"lr": 0.03, "steps": 200}}
    assert validation_errors("manifest", with_defaults) == []
    manifest = Manifest.from_json(with_defaults)
    assert manifest.defaults == DefaultsSection(0.03, 200) and manifest.to_json() == with_defaults
    assert Manifest.from_json(doc).defaults is None and "defaults" not in Manifest.from_json(doc).to_json()
    for bad in ({"lr": 0, "steps": 200}, {"lr": 0.03, "steps": 0}, {"lr": 0.03}, {"lr": 0.03, "steps": 2, "x": 1}):
        assert validation_errors("manifest", {**doc, "defaults": bad}) != [], bad
    # The host reads them as the apps do: defaults first, else optimizer.default_lr and no steps.
    trace = REPO / "shared_schemas" / "traces" / "tiny" / "program"
    old = ProgramDir(trace)
    assert old.default_steps is None and old.default_lr == _doc(trace / MANIFEST_NAME)["optimizer"]["default_lr"]
    new = tmp_path / "program"
    shutil.copytree(trace, new)
    m = _doc(new / MANIFEST_NAME)
    m["defaults"] = {"lr": 0.03, "steps": 200}
    (new / MANIFEST_NAME).write_text(json.dumps(m, indent=2, sort_keys=True))
    assert (ProgramDir(new).default_lr, ProgramDir(new).default_steps) == (0.03, 200)


def test_export_records_the_measured_defaults_for_the_apps(tmp_path, monkeypatch):
    """`toolchain export` passes the run defaults of toolchain/export/app_defaults.py to the writer (the lr per
    optimizer, also optimizer.default_lr, so older readers agree; the steps), and --lr / --steps override them; the
    writer puts them in `defaults` (its round trip: the test above)."""
    from click.testing import CliRunner

    import toolchain.export.build as build
    from toolchain.cli import cli
    from toolchain.export.app_defaults import DEFAULT_LR, DEFAULT_STEPS

    seen = []

    class Captured(Exception):
        pass

    def fake_export(arch, weights, cfg, lora, spec, out, **kwargs):
        seen.append(spec)
        raise Captured

    monkeypatch.setattr(build, "export_program", fake_export)
    base = ["export", "--model", "tiny", "--init", "random", "--seq-len", "8", "--quant", "none", "--no-generate"]
    for extra, want in (([], (DEFAULT_LR["sgd"], DEFAULT_STEPS)), (["--optimizer", "adamw"], (DEFAULT_LR["adamw"], DEFAULT_STEPS)),
                        (["--lr", "0.5", "--steps", "7"], (0.5, 7))):
        result = CliRunner().invoke(cli, [*base, *extra, "--out", str(tmp_path / f"p{len(seen)}")])
        assert isinstance(result.exception, Captured), result.output
        assert (seen[-1].default_lr, seen[-1].default_steps) == want
    assert DEFAULT_LR["sgd"] > 1e-4, "the old default (1e-4) did not visibly train in 100 steps (docs/android.md)"
