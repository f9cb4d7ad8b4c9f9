"""`bench mezo-cosine` on the tiny preset (no memory part here; `bench memory` covers the mezo mode):
per-seed cosines are those of the library estimate, the report follows its schema."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from toolchain.bench.mezo import MezoCosineConfig, cosine, flat, run_mezo_cosine
from toolchain.cli import cli
from toolchain.schemas import validation_errors


def test_cosines_are_small_positive_and_match_a_direct_computation(tmp_path):
    from toolchain.baselines import mezo_grad_estimate
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.mesp import mesp_step
    from toolchain.models import get_preset, random_weights

    config = MezoCosineConfig(model="tiny", init="random", seq_len=24, seeds=3, memory=False, cache_dir=tmp_path)
    doc = run_mezo_cosine(config)
    assert validation_errors("bench_mezo", doc) == []
    # Recompute seed 2 from scratch, without the weights cache.
    arch = get_preset("tiny")
    weights, cfg = random_weights(arch, seed=0), LoraConfig(rank=8, alpha=16.0)
    lora = init_lora(arch, cfg, seed=0, zero_b=False)
    ids = torch.randint(0, arch.vocab, (24,), generator=torch.Generator().manual_seed(0))
    exact = flat(mesp_step(arch, weights, cfg, lora, ids, ids).grads)
    est = flat(mezo_grad_estimate(arch, weights, cfg, lora, ids, ids, seed=2).grads)
    assert doc["cosines"][2] == pytest.approx(cosine(est, exact), rel=1e-6)
    assert doc["n_params"] == exact.numel()
    assert all(0 < c < 20 * doc["expected_abs_cosine"] for c in doc["cosines"])


def test_cli_writes_the_report(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(cli, ["bench", "mezo-cosine", "--model", "tiny", "--init", "random", "--seq-len", "16",
                                      "--seeds", "2", "--no-memory", "--cache-dir", str(tmp_path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert len(doc["cosines"]) == 2 and doc["memory"] is None
    assert "mean |cosine|" in result.stdout
    bad = CliRunner().invoke(cli, ["bench", "mezo-cosine", "--model", "tiny", "--init", "random", "--eps", "0",
                                   "--json", str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and not (tmp_path / "x.json").exists()
