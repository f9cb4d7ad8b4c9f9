"""autograd and MeBP baselines vs Hugging Face + PEFT (float64), float32 accuracy, and agreement
with MeSP; the caller's adapter is never modified."""

from __future__ import annotations

import pytest
import torch
from helpers import CASE_SEEDS, assert_grads_close, assert_rel_close, flat_grads, random_case

from toolchain.baselines import STEP_MODES, autograd_step, mebp_step
from toolchain.lora import LoraPair
from toolchain.mesp import mesp_step

CASES = [pytest.param(seed, id=str(random_case(seed))) for seed in CASE_SEEDS]
BASELINES = [pytest.param(autograd_step, id="autograd"), pytest.param(mebp_step, id="mebp")]


@pytest.mark.parametrize("step", BASELINES)
@pytest.mark.parametrize("seed", CASES)
def test_baseline_matches_hf_peft_float64(case_data, seed, step):
    d = case_data(seed)
    before = {k: v.clone() for k, v in flat_grads(d.lora).items()}
    res = step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels)
    torch.testing.assert_close(res.loss, d.ref.loss)
    assert_grads_close(res.grads, d.ref.grads)
    assert_grads_close(d.lora, before, rtol=0, atol=0)   # inputs untouched
    assert all(not t.requires_grad for t in flat_grads(d.lora).values())


@pytest.mark.parametrize("step", BASELINES)
@pytest.mark.parametrize("seed", CASES[:5])
def test_baseline_float32_within_1e5_of_float64_reference(case_data, seed, step):
    d = case_data(seed)
    lora32 = tuple({t: LoraPair(p.a.float(), p.b.float()) for t, p in layer.items()} for layer in d.lora)
    res = step(d.case.arch, d.weights.to(torch.float32), d.case.lora, lora32, d.input_ids, d.labels)
    assert abs(float(res.loss) - float(d.ref.loss)) <= 1e-5 * abs(float(d.ref.loss))
    assert_rel_close(res.grads, d.ref.grads, max_rel=1e-5)


def test_all_modes_agree_with_each_other(case_data):
    d = case_data(CASE_SEEDS[3])
    args = (d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels)
    results = {"mesp": mesp_step(*args), "mebp": mebp_step(*args), "autograd": autograd_step(*args)}
    assert sorted(results) == sorted(STEP_MODES)
    for name in ("mebp", "autograd"):
        torch.testing.assert_close(results[name].loss, results["mesp"].loss)
        assert_grads_close(results[name].grads, results["mesp"].grads)
