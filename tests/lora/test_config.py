"""LoraConfig validation, target parsing, scale and parameter counts."""

from __future__ import annotations

import pytest

from toolchain.errors import BadInput
from toolchain.lora import ALL_TARGETS, LoraConfig, lora_num_params, parse_targets
from toolchain.models import get_preset


def test_targets_normalized_to_block_order():
    assert LoraConfig(targets=("down_proj", "q_proj", "q_proj")).targets == ("q_proj", "down_proj")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"rank": 0}, "rank"), ({"alpha": 0.0}, "alpha"), ({"targets": ()}, "targets"),
    ({"targets": ("qproj",)}, "unknown LoRA target"),
])
def test_invalid(kwargs, match):
    with pytest.raises(BadInput, match=match):
        LoraConfig(**kwargs)


def test_parse_targets():
    assert parse_targets("all") == ALL_TARGETS
    assert parse_targets(" q_proj, v_proj ,") == ("q_proj", "v_proj")


def test_scale():
    assert LoraConfig(rank=8, alpha=16).scale == 2.0
    assert LoraConfig(rank=4, alpha=8, use_rslora=True).scale == 4.0


def test_num_params_qwen25_05b_rank8_all_targets():
    # docs/benchmarks.md: "LoRA parameters (4.39 M, fp32)" for Qwen2.5-0.5B, r8 on 7 projections.
    # Per layer: 8 * ((896+896) + 2*(896+128) + (896+896) + 2*(896+4864) + (4864+896)) = 183296; x 24 layers.
    assert lora_num_params(get_preset("qwen2.5-0.5b"), LoraConfig(rank=8)) == 24 * 183_296 == 4_399_104
