"""The benchmark's training steps: every exact mode hands the same per-layer gradients to its hook as
the library steps compute (float64), SGD updates each layer in place, and MeSP's step keeps no
gradients of its own (`keep_grads=False`)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_grads_close, flat_grads

from toolchain.baselines import autograd_step
from toolchain.bench.steps import EXACT_MODES, collect_hook, prepare_lora, sgd_hook, train_step
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import StepOptions
from toolchain.models import ModelArch, random_weights

ARCH = ModelArch(hidden=12, layers=3, heads=3, kv_heads=1, intermediate=20, vocab=41, max_positions=64)
CFG = LoraConfig(rank=2, alpha=4.0)
OPTIONS = StepOptions(loss_chunk=5, vocab_chunk=16, mlp_chunk=7)


def _setup():
    weights = random_weights(ARCH, seed=1, dtype=torch.float64)
    ids = torch.randint(0, ARCH.vocab, (17,), generator=torch.Generator().manual_seed(1))
    return weights, ids


def _lora(mode):
    return prepare_lora(mode, init_lora(ARCH, CFG, seed=1, dtype=torch.float64, zero_b=False))


@pytest.mark.parametrize("mode", EXACT_MODES)
def test_hook_receives_the_exact_gradients(mode):
    weights, ids = _setup()
    store = [{} for _ in range(ARCH.layers)]
    loss = train_step(ARCH, weights, CFG, _lora(mode), ids, ids, mode=mode, hook=collect_hook(store),
                      options=OPTIONS)
    ref = autograd_step(ARCH, weights, CFG, init_lora(ARCH, CFG, seed=1, dtype=torch.float64, zero_b=False), ids, ids)
    assert loss == pytest.approx(float(ref.loss), rel=1e-12)
    assert_grads_close(tuple(store), ref.grads)


@pytest.mark.parametrize("mode", EXACT_MODES)
def test_sgd_hook_updates_in_place(mode):
    weights, ids = _setup()
    lora = _lora(mode)
    before = {k: v.detach().clone() for k, v in flat_grads(lora).items()}
    ids_of = {k: id(v) for k, v in flat_grads(lora).items()}
    train_step(ARCH, weights, CFG, lora, ids, ids, mode=mode, hook=sgd_hook(lora, 0.1), options=OPTIONS)
    ref = autograd_step(ARCH, weights, CFG, init_lora(ARCH, CFG, seed=1, dtype=torch.float64, zero_b=False), ids, ids)
    after = flat_grads(lora)
    assert {k: id(v) for k, v in after.items()} == ids_of    # the same tensors, updated in place
    for k, g in flat_grads(ref.grads).items():
        torch.testing.assert_close(after[k].detach(), before[k] - 0.1 * g)
        if mode != "mesp":
            assert after[k].grad is None                     # .grad released after the update


def test_mezo_step_changes_the_adapter_without_a_hook():
    weights, ids = _setup()
    lora = _lora("mezo")
    before = {k: v.clone() for k, v in flat_grads(lora).items()}

    def no_hook(layer, grads):
        raise AssertionError("mezo has no exact gradients")

    train_step(ARCH, weights, CFG, lora, ids, ids, mode="mezo", hook=no_hook, options=OPTIONS, seed=3, lr=0.1)
    assert any(not torch.equal(v, before[k]) for k, v in flat_grads(lora).items())
