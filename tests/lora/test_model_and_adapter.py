"""load_model_and_adapter: the model, then the LoRA config, then the LoRA weights; an adapter directory's
config wins over rank/alpha/targets."""

from __future__ import annotations

import pytest
import torch

from toolchain.errors import BadInput
from toolchain.lora import save_adapter
from toolchain.lora.resolve import load_model_and_adapter, lora_config


def test_a_fresh_adapter_has_the_given_shape_and_pefts_zero_b():
    arch, weights, cfg, lora = load_model_and_adapter("tiny", init="random", seed=1, rank=4, targets="q_proj,v_proj")
    assert (cfg.rank, cfg.alpha, cfg.targets) == (4, 8.0, ("q_proj", "v_proj"))
    assert len(lora) == arch.layers and set(lora[0]) == {"q_proj", "v_proj"}
    assert all(float(p.b.abs().max()) == 0 for layer in lora for p in layer.values())
    assert weights.embed.dtype == torch.float32


def test_an_adapter_directory_overrides_rank_alpha_and_targets(tmp_path):
    _, _, cfg, lora = load_model_and_adapter("tiny", init="random", rank=2, alpha=3.0, targets="o_proj", zero_b=False)
    save_adapter(tmp_path / "adapter", cfg, lora)
    _, _, loaded_cfg, loaded = load_model_and_adapter("tiny", init="random", adapter=tmp_path / "adapter", rank=8)
    assert loaded_cfg == cfg
    torch.testing.assert_close(loaded[3]["o_proj"].b, lora[3]["o_proj"].b)


def test_too_large_a_rank_and_bad_targets_are_bad_input():
    with pytest.raises(BadInput, match="^rank 10000 is larger than this model allows"):  # the field (the CLI: --rank)
        load_model_and_adapter("tiny", init="random", rank=10_000)
    with pytest.raises(BadInput):
        lora_config(targets="nope")
