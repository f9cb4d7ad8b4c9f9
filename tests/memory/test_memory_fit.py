"""The planner: fits / does not fit against a profile, the largest seq len and rank that fit, and an
exported program's memory plan (manifest schema_version 3, the layer loop) when one is given: the phone
figure (every method's own arena) is the answer, the host figure (one shared arena) is reported beside it."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from toolchain.errors import BadInput, SchemaError
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.fit import (ACTIVATION_COPIES, EXECUTORCH_OVERHEAD_MB, HOST_OVERHEAD_MB, plan_fit,
                                  program_peak)
from toolchain.memory.profiles import load_profile
from toolchain.models import PRESETS
from toolchain.schemas import SCHEMA_DIR, validate

SMALL = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8)
HUGE = StepShape(PRESETS["qwen2.5-3b"], 8192, 8)
MB = BYTES_PER_MB
# A real export: tiny, int4, AdamW, a default LCSB plan of two phases of 4 layers, 5 methods.
EXAMPLE = json.loads((SCHEMA_DIR / "examples" / "manifest_tiny.json").read_text())
TINY = StepShape(PRESETS["tiny"], EXAMPLE["seq_len"], EXAMPLE["lora"]["rank"], optimizer=EXAMPLE["optimizer"]["kind"])


def example() -> dict:
    return copy.deepcopy(EXAMPLE)


def _program(tmp_path, manifest: dict):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def _expected(doc: dict, k: int, overhead: float) -> tuple[float, float]:
    """(phone, host) MB by hand: arenas (sum / largest) + state + k checkpoints + 1 [T, d] + overhead."""
    plan, arch = doc["memory_plan"], doc["model"]["arch"]
    arenas = plan["planned_arena_bytes"]["executorch"]
    rest = (plan["lora_state_bytes"] + k * doc["seq_len"] * arch["hidden"] * 4
            + ACTIVATION_COPIES * doc["seq_len"] * arch["hidden"] * 4) / MB + overhead
    return sum(arenas.values()) / MB + rest, max(arenas.values()) / MB + rest


def test_the_example_manifest_is_schema_valid():
    validate("manifest", EXAMPLE)
    assert EXAMPLE["schema_version"] == 3 and len(EXAMPLE["memory_plan"]["planned_arena_bytes"]["executorch"]) == 5


def test_a_small_config_fits_and_a_huge_one_does_not():
    phone = load_profile("android-6gb")
    ok = plan_fit(SMALL, phone)
    assert ok.fits and ok.source == "analytic" and ok.margin_mb == pytest.approx(phone.budget_mb - ok.predicted_peak_mb)
    assert ok.predicted_peak_mb == estimate_peak(SMALL, overhead_mb=HOST_OVERHEAD_MB["mesp"]).peak_mb
    assert ok.overhead_mb == HOST_OVERHEAD_MB["mesp"] and any("calibrated" in n for n in ok.notes)
    big = plan_fit(HUGE, phone)
    assert not big.fits and big.margin_mb < 0
    # the suggestion is where the estimate crosses the budget
    peak = lambda s: estimate_peak(s, overhead_mb=HOST_OVERHEAD_MB["mesp"]).peak_mb  # noqa: E731
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
    """Each method with its own calibrated host overhead (what its warm-up step leaves resident)."""
    phone = load_profile("android-6gb")
    mebp = plan_fit(dataclasses.replace(SMALL, method="mebp"), phone)
    assert mebp.phase == "loss" and mebp.predicted_peak_mb > 6 * plan_fit(SMALL, phone).predicted_peak_mb
    assert mebp.overhead_mb == HOST_OVERHEAD_MB["mebp"] == mebp.parts_mb["runtime_overhead"]
    assert set(HOST_OVERHEAD_MB) == {"mesp", "mebp", "autograd"}
    lower = plan_fit(StepShape(PRESETS["tiny"], 64, 8, method="mebp"), phone)   # vocab 264: a block's backward wins
    assert lower.phase == "backward (saved only)" and any("lower bound" in n for n in lower.notes)


def test_program_phone_figure_sums_every_arena_and_host_takes_the_largest(tmp_path):
    """No --lcsb-k: the program's default plan (phases of 4 of the 8 layers) sets the checkpoints kept."""
    r = plan_fit(TINY, load_profile("android-8gb"), program_dir=_program(tmp_path, example()))
    phone, host = _expected(EXAMPLE, 4, EXECUTORCH_OVERHEAD_MB)
    arenas = EXAMPLE["memory_plan"]["planned_arena_bytes"]["executorch"]
    assert r.source == "program" and r.phase is None and r.overhead_mb == EXECUTORCH_OVERHEAD_MB
    assert r.predicted_peak_mb == pytest.approx(phone) and r.host_peak_mb == pytest.approx(host)
    assert r.parts_mb["planned_arenas"] * MB == pytest.approx(sum(arenas.values()))
    assert r.host_parts_mb["planned_arena_largest"] * MB == pytest.approx(arenas["block_backward"])
    assert r.parts_mb["checkpoints"] * MB == pytest.approx(EXAMPLE["memory_plan"]["checkpoint_bytes"] / 2)
    assert set(r.parts_mb) - {"planned_arenas"} == set(r.host_parts_mb) - {"planned_arena_largest"}
    assert any(n.startswith("phone figure") and "5 loaded methods" in n for n in r.notes)
    assert any(n.startswith("host figure") and "bench memory" in n for n in r.notes)
    assert any("4 of 8 layers (the program's default LCSB plan" in n for n in r.notes)
    assert any("weights 0.3 MB not counted" in n for n in r.notes)
    assert r.analytic_peak_mb == pytest.approx(estimate_peak(TINY, overhead_mb=HOST_OVERHEAD_MB["mesp"]).peak_mb)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_program_checkpoints_follow_lcsb_k(tmp_path, k):
    prog = _program(tmp_path, example())
    r = plan_fit(dataclasses.replace(TINY, lcsb_k=k), load_profile("ios-6gb"), program_dir=prog, overhead_mb=0.0)
    assert (r.predicted_peak_mb, r.host_peak_mb) == pytest.approx(_expected(EXAMPLE, k, 0.0))
    assert "runtime_overhead" not in r.parts_mb and r.overhead_mb == 0.0
    assert program_peak(prog, lcsb_k=k, overhead_mb=0.0).peak_mb == pytest.approx(r.predicted_peak_mb)


def test_program_without_lcsb_and_the_exports_own_estimate(tmp_path):
    """Every layer selected: the phone figure is the export's memory_plan.peak_estimate_bytes (every arena, the
    state, all checkpoints) plus the one [T, d] activation the loop holds besides them, and the overhead."""
    doc = example()
    doc["lcsb"] = None
    r = program_peak(_program(tmp_path, doc), overhead_mb=2.5)
    row = doc["seq_len"] * doc["model"]["arch"]["hidden"] * 4
    plan = doc["memory_plan"]
    assert r.lcsb_k == 8 and r.parts_mb["runtime_overhead"] == 2.5
    assert r.peak_mb * MB == pytest.approx(plan["peak_estimate_bytes"]["executorch"] + row + 2.5 * MB)


@pytest.mark.parametrize("edit, error, message", [
    (lambda m: m.update(schema_version=2), BadInput, "schema_version 2.*re-export"),
    (lambda m: m["memory_plan"].update(planned_arena_bytes={}), BadInput,
     "no executorch plan \\(planned targets: none\\); export with --target executorch"),
    (lambda m: m["memory_plan"].update(planned_arena_bytes={"onnx": {"embed": 1}}), BadInput,
     "planned targets: onnx"),
    (lambda m: m["memory_plan"]["planned_arena_bytes"]["executorch"].pop("head_loss"), BadInput,
     "no arena for head_loss; re-export"),
    (lambda m: m.pop("memory_plan"), SchemaError, "memory_plan"),
    (lambda m: m.update(seq_len=128), BadInput, "exported with seq_len 128 \\(not 64\\)"),
    (lambda m: m["lora"].update(rank=16), BadInput, "rank 16 \\(not 8\\)"),
    (lambda m: m["model"]["arch"].update(layers=6), BadInput, "layers 6 \\(not 8\\)"),
    (lambda m: m["lora"].update(targets=["q_proj", "v_proj"]), BadInput, "targets q_proj,v_proj \\(not "),
])
def test_bad_programs_are_clear_errors(tmp_path, edit, error, message):
    doc = example()
    edit(doc)
    with pytest.raises(error, match=message):
        plan_fit(TINY, load_profile("android-8gb"), program_dir=_program(tmp_path, doc))


def test_a_real_v2_manifest_is_refused_with_the_way_out(tmp_path):
    (tmp_path / "manifest.json").write_text((SCHEMA_DIR / "examples" / "invalid" / "manifest_version_2.json").read_text())
    with pytest.raises(BadInput, match="schema_version 2; the planner reads version 3 .*: re-export the program"):
        program_peak(tmp_path)


def test_lcsb_k_beyond_the_programs_layers(tmp_path):
    with pytest.raises(BadInput, match="LCSB k 9 is not in 1..8"):
        program_peak(_program(tmp_path, example()), lcsb_k=9)


def test_program_dir_without_manifest_or_json(tmp_path):
    with pytest.raises(BadInput, match="manifest.json does not exist"):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=tmp_path)


def test_weights_that_cannot_stay_in_the_page_cache_are_noted(tmp_path):
    """A program whose weights file and step exceed the budget together (a 7B int4 file is ~4.1 GiB): the answer
    says the page cache will not keep the weights; one that fits with room says nothing of it."""
    doc = example()
    budget = load_profile("android-8gb").budget_mb
    (tmp_path / "small").mkdir()
    r = plan_fit(TINY, load_profile("android-8gb"), program_dir=_program(tmp_path / "small", doc))
    assert not any("page cache" in n for n in r.notes)
    doc["memory_plan"]["weights_bytes"] = int((budget - r.predicted_peak_mb + 1) * MB)
    (tmp_path / "big").mkdir()
    r = plan_fit(TINY, load_profile("android-8gb"), program_dir=_program(tmp_path / "big", doc))
    assert r.fits
    (note,) = [n for n in r.notes if "page cache" in n]
    assert f"exceed the {budget:.0f} MB budget together" in note and "re-read them from storage" in note


@pytest.mark.parametrize("k", [1, 4, 8])
def test_program_pair_figure_counts_both_sequences_inputs(tmp_path, k):
    """The DPO step (`pair=True`): n + G inputs alive (the second sequence's graded groups, G of them) and one more
    [T, d] (the second `d`) than the SFT step, by hand; the arenas and the state are the SFT figure's."""
    prog = _program(tmp_path, example())
    sft = program_peak(prog, lcsb_k=k, overhead_mb=0.0)
    dpo = program_peak(prog, lcsb_k=k, overhead_mb=0.0, pair=True)
    row = EXAMPLE["seq_len"] * EXAMPLE["model"]["arch"]["hidden"] * 4 / MB
    groups = {1: 1, 4: 2, 8: 3}[k]                      # 1: [1]; 4: [1, 3]; 8: [1, 3, 4] from the top
    assert dpo.host_peak_mb - sft.host_peak_mb == pytest.approx((groups + 1) * row)
    assert dpo.peak_mb - sft.peak_mb == pytest.approx((groups + 1) * row)
    assert any("the DPO step" in n for n in dpo.notes)
