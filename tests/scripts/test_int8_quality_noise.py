"""scripts/int8_quality.py's update noise (the fp32 control of the int8 run at lr 0.1, docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "int8_quality.py"


def _script():
    spec = importlib.util.spec_from_file_location("int8_quality", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_update_noise_is_unbiased_of_the_relative_size_asked_and_seeded():
    noise_of = _script().update_noise
    delta = torch.randn(200_000, generator=torch.Generator().manual_seed(1)) * 1e-3
    delta[:1000] = 0.0                                      # parameters the step did not change stay unchanged
    noise = noise_of(delta, 0.04, torch.Generator().manual_seed(0))
    assert torch.equal(noise, noise_of(delta, 0.04, torch.Generator().manual_seed(0)))
    assert not torch.equal(noise, noise_of(delta, 0.04, torch.Generator().manual_seed(1)))
    assert torch.all(noise[:1000] == 0)
    rel = float(noise.norm() / delta.norm())
    assert abs(rel - 0.04) < 0.04 * 0.02                   # 200k draws: the relative L2 within 2% of 0.04
    z = noise[1000:] / (delta[1000:] * 0.04)               # the per-element factors: mean 0, variance 1
    assert abs(float(z.mean())) < 0.01 and abs(float(z.var()) - 1) < 0.02
    cos = float((delta + noise) @ delta / ((delta + noise).norm() * delta.norm()))
    assert abs(cos - (1 + 0.04 ** 2) ** -0.5) < 1e-4       # the docs' cosine of a noisy update
    assert torch.equal(noise_of(delta, 0.0, torch.Generator().manual_seed(0)), torch.zeros_like(delta))


def test_agreement_is_the_cosine_and_the_relative_error_against_the_reference():
    agreement = _script().agreement
    ref = torch.tensor([3.0, 4.0])
    assert agreement(ref, ref) == {"cosine": 1.0, "rel_l2": 0.0}
    got = agreement(ref, torch.tensor([4.0, 3.0]))
    assert abs(got["cosine"] - 24 / 25) < 1e-12 and abs(got["rel_l2"] - 2 ** 0.5 / 5) < 1e-12
    assert agreement(ref, -ref)["cosine"] == -1.0
