"""The planner: fits / does not fit against a profile, the largest seq len and rank that fit, and
an exported program's memory plan (manifest schema_version 2) when one is given."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict

import pytest

from toolchain.errors import BadInput, SchemaError
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.fit import EXECUTORCH_OVERHEAD_MB, HOST_OVERHEAD_MB, plan_fit, program_peak
from toolchain.memory.profiles import load_profile
from toolchain.models import PRESETS
from toolchain.schemas import SCHEMA_DIR, validate

SMALL = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8)
HUGE = StepShape(PRESETS["qwen2.5-3b"], 8192, 8)
MB = BYTES_PER_MB


def manifest_v2(shape: StepShape, arenas: dict[str, int] | None, *, numel: int = 1000) -> dict:
    """A minimal schema-valid manifest (contract v2) for `shape`: one train method per key of `arenas`
    (phases when several), a state of `numel` floats in one entry."""
    arch = shape.arch
    entry = {"name": "lora_0_q_proj_a", "key": "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
             "role": "param", "shape": [numel], "offset": 0}
    tensor = {"name": entry["name"], "dtype": "float32", "shape": [numel]}
    names = list(arenas or {"train_step": 0})
    methods = [{"name": name, "kind": "train_step", "phase": None if len(names) == 1 else i,
                "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [shape.seq_len]},
                           {"name": "labels", "dtype": "int64", "shape": [shape.seq_len]},
                           {"name": "lr", "dtype": "float32", "shape": [1]}, tensor],
                "outputs": [{"name": "loss", "dtype": "float32", "shape": [1]}, tensor]}
               for i, name in enumerate(names)]
    lcsb = None if len(names) == 1 else {"policy": "cyclic", "phases": [[i] for i in range(len(names))],
                                         "schedule": list(range(len(names)))}
    return {
        "schema_version": 2, "toolchain_version": "test",
        "model": {"source": "preset", "init": "random", "arch": asdict(arch)},
        "lora": {"rank": shape.rank, "alpha": 2.0 * shape.rank, "scale": 2.0, "targets": list(shape.targets)},
        "seq_len": shape.seq_len, "quant": {"kind": "int4", "group": 64},
        "optimizer": {"kind": "sgd", "weight_decay": 0.0}, "lcsb": lcsb,
        "programs": [{"target": "executorch", "file": "model.pte"}], "methods": methods,
        "state": {"dtype": "float32", "numel": numel, "init_file": "state_init.bin", "entries": [entry]},
        "memory_plan": {"planned_arena_bytes": arenas or {}, "constant_bytes": 500 * MB, "lora_state_bytes": 4 * numel},
        "tokenizer": {"kind": "none", "vocab": arch.vocab, "pad_token_id": 0},
        "adapter": {"init_dir": "adapter_init", "config": {}}, "files": {},
    }


def _program(tmp_path, manifest: dict):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_the_test_manifest_is_schema_valid():
    validate("manifest", manifest_v2(SMALL, {"train_step_p0": 1, "train_step_p1": 2}))
    validate("manifest", manifest_v2(SMALL, {"train_step": 1}))


def test_a_small_config_fits_and_a_huge_one_does_not():
    phone = load_profile("android-6gb")
    ok = plan_fit(SMALL, phone)
    assert ok.fits and ok.source == "analytic" and ok.margin_mb == pytest.approx(phone.budget_mb - ok.predicted_peak_mb)
    assert ok.predicted_peak_mb == estimate_peak(SMALL, overhead_mb=HOST_OVERHEAD_MB).peak_mb
    assert ok.overhead_mb == HOST_OVERHEAD_MB and any("calibrated" in n for n in ok.notes)
    big = plan_fit(HUGE, phone)
    assert not big.fits and big.margin_mb < 0
    # the suggestion is where the estimate crosses the budget
    peak = lambda s: estimate_peak(s, overhead_mb=HOST_OVERHEAD_MB).peak_mb  # noqa: E731
    assert big.largest_seq_len is not None and big.largest_seq_len < 8192
    assert peak(dataclasses.replace(HUGE, seq_len=big.largest_seq_len)) <= phone.budget_mb
    assert peak(dataclasses.replace(HUGE, seq_len=big.largest_seq_len + 1)) > phone.budget_mb


def test_overhead_can_tip_the_answer():
    phone = load_profile("ios-6gb")
    bare = plan_fit(SMALL, phone, overhead_mb=0.0)
    over = plan_fit(SMALL, phone, overhead_mb=phone.budget_mb)
    assert bare.fits and not over.fits and over.parts_mb["runtime_overhead"] == phone.budget_mb
    assert "runtime_overhead" not in bare.parts_mb and not any("calibrated" in n for n in over.notes)


def test_largest_rank_is_capped_by_the_projection_shapes():
    r = plan_fit(SMALL, load_profile("android-12gb"))
    assert r.max_rank == 128 and r.largest_rank == 128      # k/v projections are [128, 896]


def test_baseline_methods_are_planned_too():
    phone = load_profile("android-6gb")
    mebp = plan_fit(dataclasses.replace(SMALL, method="mebp"), phone)
    assert mebp.phase == "loss" and mebp.predicted_peak_mb > 6 * plan_fit(SMALL, phone).predicted_peak_mb
    lower = plan_fit(StepShape(PRESETS["tiny"], 64, 8, method="mebp"), phone)   # vocab 264: a block's backward wins
    assert lower.phase == "backward (saved only)" and any("lower bound" in n for n in lower.notes)


def test_program_with_lcsb_phases_holds_every_arena(tmp_path):
    """Contract v2: the apps load every train method up front; each loaded method has its own arena."""
    prog = _program(tmp_path, manifest_v2(SMALL, {"train_step_p0": 60 * MB, "train_step_p1": 70 * MB,
                                                  "train_step_p2": 65 * MB}, numel=17 * MB // 4))
    r = plan_fit(SMALL, load_profile("android-8gb"), program_dir=prog)
    assert r.source == "program" and r.phase is None
    assert r.parts_mb == {"planned_arenas (3 methods)": 195.0, "lora_state": 17.0,
                          "runtime_overhead": EXECUTORCH_OVERHEAD_MB}
    assert r.predicted_peak_mb == pytest.approx(195 + 17 + EXECUTORCH_OVERHEAD_MB)
    assert r.overhead_mb == EXECUTORCH_OVERHEAD_MB
    assert any("500.0 MB not counted" in n for n in r.notes)
    assert any(n.startswith("a lower bound for large programs") for n in r.notes)
    assert any("largest alone is 70.0 MB (train_step_p1)" in n for n in r.notes)
    assert r.analytic_peak_mb == pytest.approx(estimate_peak(SMALL, overhead_mb=HOST_OVERHEAD_MB).peak_mb)


def test_program_without_lcsb_and_explicit_overhead(tmp_path):
    prog = _program(tmp_path, manifest_v2(SMALL, {"train_step": 40 * MB}, numel=MB))
    r = plan_fit(SMALL, load_profile("ios-6gb"), program_dir=prog, overhead_mb=2.5)
    assert r.parts_mb == {"planned_arena (train_step)": 40.0, "lora_state": 4.0, "runtime_overhead": 2.5}
    assert r.predicted_peak_mb == 46.5 and r.fits
    assert program_peak(prog, overhead_mb=0.0).peak_mb == 44.0


def test_program_agrees_with_its_own_peak_estimate(tmp_path):
    """The export writes memory_plan.peak_estimate_bytes (every arena + the state array), when it has arenas."""
    doc = manifest_v2(SMALL, {"train_step_p0": 3 * MB, "train_step_p1": 5 * MB}, numel=MB // 2)
    doc["memory_plan"]["peak_estimate_bytes"] = 3 * MB + 5 * MB + 2 * MB
    r = program_peak(_program(tmp_path, doc), overhead_mb=0.0)
    assert r.peak_mb * MB == doc["memory_plan"]["peak_estimate_bytes"]


def test_the_example_manifest(tmp_path):
    """shared_schemas/examples/manifest_tiny.json: a real export (tiny, int4, AdamW, LCSB with two phases)."""
    doc = json.loads((SCHEMA_DIR / "examples" / "manifest_tiny.json").read_text())
    shape = StepShape(PRESETS["tiny"], doc["seq_len"], doc["lora"]["rank"], optimizer=doc["optimizer"]["kind"])
    r = plan_fit(shape, load_profile("ios-6gb"), program_dir=_program(tmp_path, doc))
    plan = doc["memory_plan"]
    assert r.predicted_peak_mb * MB == pytest.approx(plan["peak_estimate_bytes"] + EXECUTORCH_OVERHEAD_MB * MB)
    assert r.parts_mb[f"planned_arenas ({len(doc['methods'])} methods)"] * MB == sum(plan["planned_arena_bytes"].values())


@pytest.mark.parametrize("edit, error, message", [
    (lambda m: m.update(schema_version=1), BadInput, "schema_version 1.*re-export"),
    (lambda m: m["memory_plan"].update(planned_arena_bytes={}), BadInput, "no arena for train_step_p0, train_step_p1"),
    (lambda m: m["memory_plan"]["planned_arena_bytes"].pop("train_step_p1"), BadInput, "no arena for train_step_p1"),
    (lambda m: m.pop("memory_plan"), SchemaError, "memory_plan"),
    (lambda m: m.update(seq_len=512), BadInput, "exported with seq_len 512 \\(not 256\\)"),
    (lambda m: m["lora"].update(rank=16), BadInput, "rank 16 \\(not 8\\)"),
    (lambda m: m["model"]["arch"].update(layers=28), BadInput, "layers 28 \\(not 24\\)"),
])
def test_bad_programs_are_clear_errors(tmp_path, edit, error, message):
    doc = manifest_v2(SMALL, {"train_step_p0": MB, "train_step_p1": MB})
    edit(doc)
    with pytest.raises(error, match=message):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=_program(tmp_path, doc))


def test_program_dir_without_manifest_or_json(tmp_path):
    with pytest.raises(BadInput, match="manifest.json does not exist"):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=tmp_path)
