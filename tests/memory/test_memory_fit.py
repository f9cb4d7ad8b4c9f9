"""The planner: fits / does not fit against a profile, the largest seq len and rank that fit, and
the exported program's memory plan when one is given."""

from __future__ import annotations

import dataclasses
import json

import pytest

from toolchain.errors import BadInput
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.fit import plan_fit
from toolchain.memory.profiles import load_profile
from toolchain.models import PRESETS

SMALL = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8)
HUGE = StepShape(PRESETS["qwen2.5-3b"], 8192, 8)


def test_a_small_config_fits_and_a_huge_one_does_not():
    phone = load_profile("android-6gb")
    ok = plan_fit(SMALL, phone)
    assert ok.fits and ok.source == "analytic" and ok.margin_mb == pytest.approx(phone.budget_mb - ok.predicted_peak_mb)
    assert ok.predicted_peak_mb == estimate_peak(SMALL).peak_mb
    big = plan_fit(HUGE, phone)
    assert not big.fits and big.margin_mb < 0
    # the suggestion is where the estimate crosses the budget
    assert big.largest_seq_len is not None and big.largest_seq_len < 8192
    assert estimate_peak(dataclasses.replace(HUGE, seq_len=big.largest_seq_len)).peak_mb <= phone.budget_mb
    assert estimate_peak(dataclasses.replace(HUGE, seq_len=big.largest_seq_len + 1)).peak_mb > phone.budget_mb


def test_overhead_can_tip_the_answer():
    phone = load_profile("ios-6gb")
    bare = plan_fit(SMALL, phone)
    over = plan_fit(SMALL, phone, overhead_mb=phone.budget_mb)
    assert bare.fits and not over.fits and over.parts_mb["runtime_overhead"] == phone.budget_mb
    assert any("not included" in n for n in bare.notes) and not any("not included" in n for n in over.notes)


def test_largest_rank_is_capped_by_the_projection_shapes():
    r = plan_fit(SMALL, load_profile("android-12gb"))
    assert r.max_rank == 128 and r.largest_rank == 128      # k/v projections are [128, 896]


def _program(tmp_path, plan: dict | None):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, **({"memory_plan": plan} if plan else {})}))
    return tmp_path


def test_program_memory_plan_is_used(tmp_path, monkeypatch):
    import toolchain.memory.fit as fit

    monkeypatch.setattr(fit, "SCHEMA_NAMES", {})   # the manifest schema is another issue's; test the plan keys only
    mb = BYTES_PER_MB
    prog = _program(tmp_path, {"planned_arena_bytes": {"phase_0": 60 * mb, "phase_1": 70 * mb},
                               "constant_bytes": 500 * mb, "lora_state_bytes": 17 * mb})
    r = plan_fit(SMALL, load_profile("android-8gb"), program_dir=prog, overhead_mb=5.0)
    assert r.source == "program" and r.predicted_peak_mb == 70 + 17 + 5
    assert r.parts_mb == {"planned_arena (phase_1)": 70.0, "lora_state": 17.0, "runtime_overhead": 5.0}
    assert any("500.0 MB not counted" in n for n in r.notes)
    assert r.analytic_peak_mb == pytest.approx(estimate_peak(SMALL, overhead_mb=5.0).peak_mb)


@pytest.mark.parametrize("plan, message", [
    (None, "has no memory_plan"),
    ({"constant_bytes": 1}, "no memory_plan.planned_arena_bytes"),
    ({"planned_arena_bytes": {}, "lora_state_bytes": 1}, "must map each method"),
    ({"planned_arena_bytes": {"m": 1}}, "no memory_plan.lora_state_bytes"),
])
def test_program_without_a_memory_plan_is_a_clear_error(tmp_path, monkeypatch, plan, message):
    import toolchain.memory.fit as fit

    monkeypatch.setattr(fit, "SCHEMA_NAMES", {})
    with pytest.raises(BadInput, match=message):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=_program(tmp_path, plan))


def test_program_dir_without_manifest(tmp_path):
    with pytest.raises(BadInput, match="manifest.json does not exist"):
        plan_fit(SMALL, load_profile("android-8gb"), program_dir=tmp_path)
