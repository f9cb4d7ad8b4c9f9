"""The test oracle itself: HF's float64 model with its two float32 casts removed (helpers.float64_faithful_hf)
is the same model, and our key table covers every HF parameter."""

from __future__ import annotations

import pytest
import torch
from helpers import float64_faithful_hf, lora_for, our_weights, peft_wrap, random_arch, random_hf_model

from toolchain.lora import LoraConfig
from toolchain.models import state_dict_from_weights


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_patched_hf_is_bit_identical_in_float32(seed):
    """In float32 the removed casts were no-ops: patched and stock logits must be identical."""
    arch = random_arch(seed)
    model = random_hf_model(arch, torch.Generator().manual_seed(seed), dtype=torch.float32)
    model = peft_wrap(model, LoraConfig(rank=2, alpha=3.0), lora_for(arch, LoraConfig(rank=2, alpha=3.0), seed,
                                                                      torch.float32))
    ids = torch.randint(0, arch.vocab, (1, 29), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        with float64_faithful_hf():
            patched = model(input_ids=ids).logits
        restored = model(input_ids=ids).logits
    assert torch.equal(stock, patched) and torch.equal(stock, restored)


def test_patch_matters_in_float64():
    """Stock HF float64 is only float32-accurate (why the oracle is patched); patched, it is float64."""
    arch = random_arch(3)
    model = random_hf_model(arch, torch.Generator().manual_seed(3))
    ids = torch.randint(0, arch.vocab, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        with float64_faithful_hf():
            patched = model(input_ids=ids).logits
    diff = float((stock - patched).abs().max() / patched.abs().max())
    assert 1e-12 < diff < 1e-5


@pytest.mark.parametrize("seed", [0, 1])
def test_key_table_covers_every_hf_parameter(seed):
    arch = random_arch(seed)
    model = random_hf_model(arch, torch.Generator().manual_seed(seed))
    sd = model.state_dict()
    ours = state_dict_from_weights(our_weights(arch, model, torch.float64))
    assert set(ours) == set(sd) - ({"lm_head.weight"} if arch.tie_embeddings else set())
    assert all(torch.equal(ours[k], sd[k]) for k in ours)
