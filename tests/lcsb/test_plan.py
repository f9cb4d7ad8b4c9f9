"""LCSB step plans: policies, determinism, schema validity, JSON round trip, and refusal of bad plans."""

from __future__ import annotations

import json
import math

import pytest

from toolchain.errors import BadInput, SchemaError
from toolchain.lcsb import POLICIES, StepPlan, make_plan, plan_from_dict, read_plan, write_plan
from toolchain.schemas import validation_errors

# (layers, k) pairs: k dividing L, not dividing it, k = 1, k = L, and L = 1.
SHAPES = [(24, 6), (24, 5), (10, 4), (7, 3), (8, 1), (8, 8), (1, 1), (28, 9)]


def _plan(policy: str, layers: int, k: int) -> StepPlan:
    return make_plan(layers, k, policy, seed=3 if policy == "random" else None)


@pytest.mark.parametrize("layers, k", SHAPES)
@pytest.mark.parametrize("policy", POLICIES)
def test_plan_is_schema_valid_and_consistent(policy, layers, k):
    plan = _plan(policy, layers, k)
    doc = plan.to_dict()
    assert validation_errors("step_plan", doc) == []
    assert plan_from_dict(doc) == plan
    for phase in plan.phases:
        assert list(phase) == sorted(set(phase)) and 0 <= phase[0] and phase[-1] < layers
        assert 1 <= len(phase) <= plan.k


@pytest.mark.parametrize("layers, k", SHAPES)
@pytest.mark.parametrize("policy", POLICIES)
def test_plan_is_deterministic(policy, layers, k):
    assert _plan(policy, layers, k) == _plan(policy, layers, k)
    assert json.dumps(_plan(policy, layers, k).to_dict()) == json.dumps(_plan(policy, layers, k).to_dict())


@pytest.mark.parametrize("layers, k", SHAPES)
@pytest.mark.parametrize("policy", ["cyclic", "strided"])
def test_cyclic_policies_select_every_layer_exactly_once_per_period(policy, layers, k):
    plan = _plan(policy, layers, k)
    assert plan.period == math.ceil(layers / k) == len(plan.phases)
    assert plan.selection_counts() == [1] * layers
    # ... and over several whole periods, equally often.
    counts = [0] * layers
    for step in range(3 * plan.period):
        for layer in plan.layers_at(step):
            counts[layer] += 1
    assert counts == [3] * layers


def test_cyclic_groups_are_contiguous_and_strided_groups_are_strided():
    assert make_plan(10, 4, "cyclic").phases == ((0, 1, 2), (3, 4, 5), (6, 7, 8, 9))
    assert make_plan(10, 4, "strided").phases == ((0, 3, 6, 9), (1, 4, 7), (2, 5, 8))
    assert make_plan(12, 4, "cyclic").phases == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
    assert make_plan(12, 4, "cyclic").layers_at(4) == (4, 5, 6, 7)  # step 4 -> phase 1 (period 3)


def test_last_and_full():
    assert make_plan(24, 4, "last").phases == ((20, 21, 22, 23),)
    assert make_plan(24, 4, "last").layers_at(1234) == (20, 21, 22, 23)
    full = make_plan(5, None, "full")
    assert full.phases == ((0, 1, 2, 3, 4),) and full.k == 5


def test_random_policy_draws_k_layers_per_step_and_depends_on_the_seed():
    plan = make_plan(16, 3, "random", seed=11, period=40)
    assert plan.period == 40
    assert all(len(plan.layers_at(s)) == 3 for s in range(40))
    assert plan.layers_at(5) == plan.layers_at(45)
    assert sum(plan.selection_counts()) == 3 * 40
    other = make_plan(16, 3, "random", seed=12, period=40)
    assert [plan.layers_at(s) for s in range(40)] != [other.layers_at(s) for s in range(40)]
    assert make_plan(16, 3, "random").seed == 0  # seed defaults to 0, recorded


def test_write_then_read_round_trip(tmp_path):
    plan = make_plan(9, 2, "random", seed=5, period=7)
    write_plan(tmp_path / "p.json", plan)
    assert read_plan(tmp_path / "p.json") == plan


@pytest.mark.parametrize("layers, k, policy, kwargs, message", [
    (8, 9, "cyclic", {}, "outside 1..8"),
    (8, 0, "strided", {}, "outside 1..8"),
    (8, None, "cyclic", {}, "needs k"),
    (8, 2, "cyclic", {"seed": 1}, "only apply to the random policy"),
    (8, 2, "round-robin", {}, "unknown LCSB policy"),
    (8, 2, "random", {"period": 0}, "`period`"),
])
def test_make_plan_refuses_bad_arguments(layers, k, policy, kwargs, message):
    with pytest.raises(BadInput, match=message):
        make_plan(layers, k, policy, **kwargs)


def _doc(**changes) -> dict:
    doc = make_plan(4, 2, "cyclic").to_dict()
    doc.update(changes)
    return doc


@pytest.mark.parametrize("doc, message", [
    (_doc(phases=[[0, 1], [2, 4]]), "selects layer 4"),
    (_doc(phases=[[1, 0], [2, 3]]), "strictly ascending"),
    (_doc(phases=[[0, 1, 2], [3]]), "more than k = 2"),
    (_doc(schedule=[0, 2]), "refers to phase 2"),
    (_doc(schedule=[0, 0]), "phase 1 is never scheduled"),
    (_doc(k=5), "between 1 and the model's 4 layers"),
    (_doc(seed=3), "`seed` must be set for the random policy and null otherwise"),
])
def test_schema_valid_but_inconsistent_plans_are_refused(doc, message):
    assert validation_errors("step_plan", doc) == []  # the schema alone cannot see these
    with pytest.raises(SchemaError, match=message):
        plan_from_dict(doc)


def test_read_plan_refuses_schema_violations_and_non_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(policy="lisa")))
    with pytest.raises(SchemaError, match="policy"):
        read_plan(bad)
    bad.write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        read_plan(bad)


def test_check_layers_names_both_counts():
    with pytest.raises(BadInput, match="for 4 layers but the model has 8"):
        make_plan(4, 2, "cyclic").check_layers(8)
    make_plan(8, 2, "cyclic").check_layers(8)


@pytest.mark.parametrize("layers, k", SHAPES)
def test_anchored_keeps_the_top_layers_and_cycles_one_other(layers, k):
    plan = make_plan(layers, k, "anchored")
    top = set(range(layers - k + 1, layers))
    assert plan.period == layers - k + 1 == len(plan.phases)
    assert all(set(p) >= top and len(p) == k for p in plan.phases)
    # the cycling layer goes bottom-up over the others, each once per period
    assert [sorted(set(plan.layers_at(s)) - top) for s in range(plan.period)] == [[j] for j in range(layers - k + 1)]
    counts = plan.selection_counts()
    assert counts == [1] * (layers - k + 1) + [plan.period] * (k - 1)


def test_anchored_example():
    assert make_plan(10, 4, "anchored").phases == ((0, 7, 8, 9), (1, 7, 8, 9), (2, 7, 8, 9), (3, 7, 8, 9),
                                                   (4, 7, 8, 9), (5, 7, 8, 9), (6, 7, 8, 9))
    assert make_plan(12, 4, "anchored").layers_at(9) == (0, 9, 10, 11)  # period 9


def test_warmup_steps_use_every_layer_then_the_schedule_on_the_global_step():
    plain = make_plan(10, 4, "anchored")
    plan = make_plan(10, 4, "anchored", warmup=30)
    assert plan.warmup == 30 and plain.warmup == 0
    assert plan.layers_at(0) == plan.layers_at(29) == tuple(range(10))
    assert plan.layers_at(30) == plain.layers_at(30) == (2, 7, 8, 9)  # 30 % 7: the schedule does not restart
    assert [plan.layers_at(s) for s in range(30, 50)] == [plain.layers_at(s) for s in range(30, 50)]
    assert plan.phase_at(29) is None and plan.phase_at(30) == 2
    assert plan.max_layers == 10 and plain.max_layers == 4
    assert plan.selection_counts() == plain.selection_counts() and plan.period == plain.period
    assert make_plan(8, 2, "random", seed=3, period=5, warmup=2).layers_at(1) == tuple(range(8))


def test_warmup_json_round_trip_and_absent_means_zero():
    plan = make_plan(10, 4, "anchored", warmup=30)
    doc = plan.to_dict()
    assert doc["warmup"] == 30 and validation_errors("step_plan", doc) == []
    assert plan_from_dict(doc) == plan
    plain = make_plan(10, 4, "anchored")
    assert "warmup" not in plain.to_dict() and "warmup" not in make_plan(10, 4, "anchored", warmup=0).to_dict()
    assert plan_from_dict(plain.to_dict()).warmup == 0
    assert json.dumps(make_plan(10, 4, "anchored", warmup=0).to_dict()) == json.dumps(plain.to_dict())
    assert plan_from_dict({**plain.to_dict(), "warmup": 0}) == plain


def test_negative_warmup_is_refused():
    with pytest.raises(BadInput, match="warmup"):
        make_plan(10, 4, "anchored", warmup=-1)
    with pytest.raises(BadInput, match="warmup"):
        StepPlan(layers=3, policy="cyclic", k=1, phases=((0,), (1,), (2,)), schedule=(0, 1, 2), warmup=-1)
    doc = {**make_plan(10, 4, "anchored").to_dict(), "warmup": -1}
    assert validation_errors("step_plan", doc) != []
    with pytest.raises(SchemaError, match="warmup"):
        plan_from_dict(doc)
    assert validation_errors("step_plan", {**doc, "warmup": 1.5}) != []
