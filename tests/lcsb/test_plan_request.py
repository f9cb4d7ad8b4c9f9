"""PlanRequest: what the plan options (--plan, --lcsb-k, --lcsb-policy, --lcsb-seed) resolve to."""

from __future__ import annotations

import pytest

from toolchain.errors import BadInput
from toolchain.lcsb import PlanRequest, make_plan, write_plan


def test_nothing_given_is_full_backprop_and_no_lcsb_plan():
    request = PlanRequest()
    assert not request.given
    assert request.resolve(8) == make_plan(8, None, "full")
    assert request.resolve_lcsb(8) is None


@pytest.mark.parametrize("request_, expected", [
    (PlanRequest(k=3), make_plan(8, 3, "cyclic")),
    (PlanRequest(k=2, policy="strided"), make_plan(8, 2, "strided")),
    (PlanRequest(k=2, policy="random", seed=5), make_plan(8, 2, "random", seed=5)),
    (PlanRequest(policy="full"), make_plan(8, None, "full")),
])
def test_options_build_the_policy(request_, expected):
    assert request_.resolve(8) == expected
    assert request_.resolve_lcsb(8) == (None if expected.policy == "full" else expected)


def test_a_plan_file_is_read_and_checked_against_the_layers(tmp_path):
    path = tmp_path / "plan.json"
    write_plan(path, make_plan(8, 2, "strided"))
    assert PlanRequest(path=path).resolve(8) == make_plan(8, 2, "strided")
    with pytest.raises(BadInput, match="plan"):
        PlanRequest(path=path).resolve(6)


@pytest.mark.parametrize("kwargs, message", [
    ({"path": "plan.json", "k": 2}, "exclusive"),
    ({"path": "plan.json", "seed": 1}, "exclusive"),
    ({"k": 2, "seed": 1}, "--lcsb-seed applies to --lcsb-policy random, not cyclic"),
])
def test_contradictory_options_are_refused_at_once(kwargs, message):
    with pytest.raises(BadInput, match=message):
        PlanRequest(**kwargs)


def test_a_warmup_goes_into_the_plan_and_needs_a_selective_policy():
    assert PlanRequest(k=2, policy="anchored", warmup=3).resolve(8) == make_plan(8, 2, "anchored", warmup=3)
    assert PlanRequest(k=2, warmup=0).resolve_lcsb(8) == make_plan(8, 2, "cyclic")
    assert PlanRequest(warmup=1, k=2).given
    with pytest.raises(BadInput, match="exclusive"):
        PlanRequest(path="plan.json", warmup=2)
    with pytest.raises(BadInput, match="full backprop has no warm-up"):
        PlanRequest(warmup=2)
    with pytest.raises(BadInput, match=">= 0"):
        PlanRequest(k=2, warmup=-1)
