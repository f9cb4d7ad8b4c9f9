"""The analytic breakdown printed by `bench memory`: docs/benchmarks.md's numbers for Qwen2.5-0.5B, and its
"largest transient" equals the largest tensor the step really creates (recorded op by op)."""

from __future__ import annotations

import pytest
import torch
from helpers import max_op_output_numel

from toolchain.lora import LoraConfig, init_lora
from toolchain.memory.breakdown import step_breakdown
from toolchain.memory.measure import MIB
from toolchain.mesp import StepOptions, mesp_step
from toolchain.models import ModelArch, get_preset, random_weights


def test_qwen25_05b_numbers_from_design_md():
    arch, cfg = get_preset("qwen2.5-0.5b"), LoraConfig(rank=8)
    mebp = step_breakdown("mebp", arch, cfg, 256)
    assert mebp.lora_params == 4_399_104 * 4                     # "4.39 M params = 17.6 MB fp32"
    assert mebp.grads == mebp.lora_params
    assert mebp.checkpoints == 24 * 256 * 896 * 4                # "[256, 896] = 0.9 MB x 24"
    assert mebp.largest_transient == 256 * 151936 * 4            # "full logits [256, 151936] = 156 MB"
    mesp = step_breakdown("mesp", arch, cfg, 256, StepOptions(loss_chunk=256, vocab_chunk=4096, mlp_chunk=64))
    assert mesp.grads == mebp.lora_params // 24                  # one layer's gradients at a time
    assert mesp.largest_transient == 256 * 4096 * 4
    assert step_breakdown("mezo", arch, cfg, 256).grads == 0
    assert step_breakdown("mebp", arch, cfg, 256).as_mb()["lora_params_mb"] == round(4_399_104 * 4 / MIB, 2)


# (what should dominate, arch, options): the breakdown must name and size it right.
CASES = [
    ("loss", ModelArch(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=997, max_positions=64),
     StepOptions(loss_chunk=16, vocab_chunk=300, mlp_chunk=8)),
    ("loss", ModelArch(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=997, max_positions=64),
     StepOptions(loss_chunk=8, vocab_chunk=None, mlp_chunk=8)),
    ("MLP", ModelArch(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=400, vocab=11, max_positions=64),
     StepOptions(loss_chunk=4, vocab_chunk=8, mlp_chunk=120)),          # [40, 120] columns > [40, 40] scores
    ("attention", ModelArch(hidden=16, layers=1, heads=8, kv_heads=2, intermediate=8, vocab=11, max_positions=64),
     StepOptions(loss_chunk=4, vocab_chunk=8, mlp_chunk=4)),
]


@pytest.mark.parametrize(("what", "arch", "options"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_largest_transient_is_the_largest_tensor_of_the_step(what, arch, options):
    cfg = LoraConfig(rank=1, alpha=2.0, targets=("q_proj", "down_proj"))
    t = 40
    weights, lora = random_weights(arch, seed=0), init_lora(arch, cfg, seed=0, zero_b=False)
    ids = torch.randint(0, arch.vocab, (t,), generator=torch.Generator().manual_seed(0))
    largest, shapes, _ = max_op_output_numel(mesp_step, arch, weights, cfg, lora, ids, ids, options=options)
    b = step_breakdown("mesp", arch, cfg, t, options)
    assert what in b.largest_transient_what
    biggest = sorted({s for _, s in shapes}, key=lambda s: -torch.Size(s).numel())[:3]
    assert b.largest_transient == largest * 4, (b, biggest)


def test_mesp_groups_counts_at_most_the_inputs_alive_and_never_more_than_plain_mesp():
    from toolchain.lora import LoraConfig
    from toolchain.memory.breakdown import step_breakdown
    from toolchain.models import PRESETS

    arch, cfg = PRESETS["qwen2.5-0.5b"], LoraConfig(rank=8)
    plain = step_breakdown("mesp", arch, cfg, 256).checkpoints
    assert step_breakdown("mesp_groups", arch, cfg, 256, layers_per_checkpoint=5).checkpoints == plain * 9 // 24
    for s in (1, 24, 100):   # groups as large as the model (or larger) keep every input: no saving, no overcount
        assert step_breakdown("mesp_groups", arch, cfg, 256, layers_per_checkpoint=s).checkpoints == plain
