"""Whole-model MeSP step vs Hugging Face Qwen2ForCausalLM + PEFT (autograd), on seeded random configs."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import CASE_SEEDS, assert_grads_close, assert_rel_close, flat_grads, max_op_output_numel, random_case

from toolchain.baselines import autograd_step
from toolchain.errors import BadInput
from toolchain.lora import LoraConfig, LoraPair, init_lora
from toolchain.mesp import StepOptions, block_forward, block_params, mesp_step, model_loss
from toolchain.mesp.ops import rope_tables
from toolchain.models import ModelArch, random_weights

CASES = [pytest.param(seed, id=str(random_case(seed))) for seed in CASE_SEEDS]
OPTIONS = [pytest.param(StepOptions(), id="default"),
           pytest.param(StepOptions(loss_chunk=3, mlp_chunk=5), id="chunks3-5"),
           pytest.param(StepOptions(loss_chunk=1, mlp_chunk=1), id="chunks1-1")]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("seed", CASES)
def test_mesp_step_matches_hf_peft_float64(case_data, seed, options):
    d = case_data(seed)
    res = mesp_step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels, options=options)
    torch.testing.assert_close(res.loss, d.ref.loss)
    assert_grads_close(res.grads, d.ref.grads)


@pytest.mark.parametrize("options", OPTIONS[:2])
@pytest.mark.parametrize("seed", CASES)
def test_mesp_step_float32_within_1e5_of_float64_reference(case_data, seed, options):
    d = case_data(seed)
    w32 = d.weights.to(torch.float32)
    lora32 = tuple({t: LoraPair(p.a.float(), p.b.float()) for t, p in layer.items()} for layer in d.lora)
    res = mesp_step(d.case.arch, w32, d.case.lora, lora32, d.input_ids, d.labels, options=options)
    assert res.loss.dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in flat_grads(res.grads).values())
    assert abs(float(res.loss) - float(d.ref.loss)) <= 1e-5 * abs(float(d.ref.loss))
    assert_rel_close(res.grads, d.ref.grads, max_rel=1e-5)


@pytest.mark.parametrize("seed", CASES)
def test_model_loss_equals_step_loss(case_data, seed):
    d = case_data(seed)
    loss = model_loss(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels,
                      options=StepOptions(loss_chunk=4))
    torch.testing.assert_close(loss, d.ref.loss)


@pytest.mark.parametrize("seed", CASES[:6])
def test_backward_layers_all_selected_equals_full_step(case_data, seed):
    d = case_data(seed)
    a = d.case.arch
    full = mesp_step(a, d.weights, d.case.lora, d.lora, d.input_ids, d.labels)
    sel = mesp_step(a, d.weights, d.case.lora, d.lora, d.input_ids, d.labels, backward_layers=range(a.layers))
    assert_grads_close(sel.grads, full.grads, rtol=0, atol=0)


SELECTIONS = {"bottom": lambda n: {0}, "top": lambda n: {n - 1}, "ends": lambda n: {0, n - 1}}
# Multi-layer cases x selections that leave at least one layer out.
SUBSETS = [pytest.param(seed, which, id=f"{random_case(seed)}-{which}") for seed in CASE_SEEDS[:6]
           for which, pick in SELECTIONS.items()
           if random_case(seed).arch.layers >= 2 and pick(random_case(seed).arch.layers) != set(
               range(random_case(seed).arch.layers))]


@pytest.mark.parametrize(("seed", "which"), SUBSETS)
def test_backward_layers_subset(case_data, seed, which):
    """Unselected layers get empty grads; selected layers above every unselected one are exact; all
    selected layers get LCSB's surrogate: unselected blocks are `h + detach(o - h)` (autograd oracle)."""
    d = case_data(seed)
    a, cfg = d.case.arch, d.case.lora
    selected = SELECTIONS[which](a.layers)
    res = mesp_step(a, d.weights, cfg, d.lora, d.input_ids, d.labels, backward_layers=selected)
    torch.testing.assert_close(res.loss, d.ref.loss)  # the forward is exact whatever is selected
    for i in range(a.layers):
        assert set(res.grads[i]) == (set(cfg.targets) if i in selected else set())
    exact_from = max(set(range(a.layers)) - selected) + 1
    exact = [i for i in selected if i >= exact_from]
    assert_grads_close(tuple(res.grads[i] if i in exact else {} for i in range(a.layers)),
                       tuple(d.ref.grads[i] if i in exact else {} for i in range(a.layers)))
    assert_grads_close(res.grads, _lcsb_surrogate_grads(d, selected))


def _lcsb_surrogate_grads(d, selected):
    """Autograd through our forward with non-selected blocks as `x + detach(block(x) - x)`."""
    from toolchain.baselines.autograd import full_logits_loss, grads_of, leaf_lora

    a, cfg = d.case.arch, d.case.lora
    leaves = leaf_lora(d.lora)
    rope = rope_tables(torch.arange(d.input_ids.shape[0]), a.head_dim, a.rope_theta, torch.float64)
    x = d.weights.embed[d.input_ids]
    for i in range(a.layers):
        out = block_forward(x, block_params(a, d.weights, cfg, leaves, i), rope)
        x = out if i in selected else x + (out - x).detach()
    full_logits_loss(a, d.weights, x, d.labels).backward()
    grads = grads_of(leaves)
    return tuple(g if i in selected else {} for i, g in enumerate(grads))


def test_backward_layers_empty_gives_loss_only(case_data):
    d = case_data(CASE_SEEDS[0])
    res = mesp_step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels, backward_layers=[])
    torch.testing.assert_close(res.loss, d.ref.loss)
    assert res.grads == ({},) * d.case.arch.layers


def test_on_layer_grads_called_in_descending_order_with_the_returned_grads(case_data):
    d = case_data(3)  # three layers
    seen = []
    res = mesp_step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels,
                    on_layer_grads=lambda i, g: seen.append((i, g)))
    assert [i for i, _ in seen] == list(reversed(range(d.case.arch.layers)))
    for i, g in seen:
        assert g is res.grads[i]


def test_keep_grads_false_hands_every_layer_to_the_hook_only(case_data):
    d = case_data(5)
    full = mesp_step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels)
    seen = {}
    res = mesp_step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels,
                    on_layer_grads=lambda i, g: seen.__setitem__(i, g), keep_grads=False)
    assert res.grads == ({},) * d.case.arch.layers
    torch.testing.assert_close(res.loss, full.loss)
    assert_grads_close(tuple(seen[i] for i in range(d.case.arch.layers)), full.grads, rtol=0, atol=0)


def test_step_never_materializes_full_logits():
    """With loss_chunk C < T, no op output is as large as the [T, V] logits."""
    arch = ModelArch(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=24, vocab=1009, max_positions=64)
    cfg = LoraConfig(rank=2, alpha=4.0)
    weights, lora = random_weights(arch, seed=1, dtype=torch.float64), init_lora(arch, cfg, seed=1, zero_b=False,
                                                                               dtype=torch.float64)
    ids = torch.randint(0, arch.vocab, (40,), generator=torch.Generator().manual_seed(0))
    largest, shapes, res = max_op_output_numel(mesp_step, arch, weights, cfg, lora, ids, ids,
                                               options=StepOptions(loss_chunk=8))
    assert {(8, arch.vocab), (arch.vocab, 8)} & {s for _, s in shapes}  # the chunk logits (either layout)
    assert largest == 8 * arch.vocab < 40 * arch.vocab
    ref = autograd_step(arch, weights, cfg, lora, ids, ids)
    assert_grads_close(res.grads, ref.grads)


def test_mlp_chunk_bounds_mlp_intermediates():
    """With mlp_chunk C, the MLP's [T, C] tensors replace [T, f] ones (forward and backward): the only
    tensors with f in their shape are the rank-1 LoRA parameters' gradients."""
    arch = ModelArch(hidden=8, layers=2, heads=2, kv_heads=2, intermediate=997, vocab=13, max_positions=64)
    cfg = LoraConfig(rank=1, alpha=2.0)
    weights, lora = random_weights(arch, seed=2, dtype=torch.float64), init_lora(arch, cfg, seed=2, zero_b=False,
                                                                               dtype=torch.float64)
    ids = torch.randint(0, arch.vocab, (30,), generator=torch.Generator().manual_seed(0))
    _, shapes, res = max_op_output_numel(mesp_step, arch, weights, cfg, lora, ids, ids,
                                         options=StepOptions(mlp_chunk=4))
    f_shapes = {s for _, s in shapes if arch.intermediate in s}
    assert (30, 4) in {s for _, s in shapes}
    assert f_shapes <= {(1, arch.intermediate), (arch.intermediate, 1)}
    assert max(math.prod(s) for _, s in shapes) <= max(arch.intermediate, 30 * arch.vocab)
    ref = autograd_step(arch, weights, cfg, lora, ids, ids)
    assert_grads_close(res.grads, ref.grads)


def test_no_target_gives_zero_loss_and_zero_grads():
    """T = 1 (and all labels -100) has nothing to predict: loss 0, zero gradients (HF would give nan)."""
    arch = ModelArch(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=5, vocab=11, max_positions=8)
    cfg = LoraConfig(rank=2, alpha=2.0)
    weights = random_weights(arch, seed=3, dtype=torch.float64)
    lora = init_lora(arch, cfg, seed=3, zero_b=False, dtype=torch.float64)
    rows = ((torch.tensor([3]), torch.tensor([3])), (torch.tensor([3, 4, 5]), torch.tensor([3, -100, -100])))
    for ids, labels in rows:
        for step in (mesp_step, autograd_step):
            res = step(arch, weights, cfg, lora, ids, labels)
            assert float(res.loss) == 0.0
            assert all(bool((g == 0).all()) for g in flat_grads(res.grads).values())


def _deep_case(seed: int, layers: int):
    """A random case with `layers` decoder layers, and its HF + PEFT reference (float64)."""
    from dataclasses import replace

    from helpers import hf_reference, lora_for, our_weights, peft_wrap, random_hf_model, random_labels

    case = random_case(seed)
    arch = replace(case.arch, layers=layers)
    gen = torch.Generator().manual_seed(seed)
    hf_model = random_hf_model(arch, gen)
    weights = our_weights(arch, hf_model, torch.float64)
    lora = lora_for(arch, case.lora, seed=seed)
    ids = torch.randint(0, arch.vocab, (case.seq_len,), generator=gen)
    labels = random_labels(ids, gen)
    return arch, case.lora, weights, lora, ids, labels, hf_reference(peft_wrap(hf_model, case.lora, lora), arch,
                                                                     case.lora, ids, labels)


@pytest.mark.parametrize("every", [2, 3, 7])
@pytest.mark.parametrize("seed", CASE_SEEDS[:4])
def test_checkpoint_segments_match_hf_peft_and_the_plain_step_bit_for_bit(seed, every):
    arch, cfg, weights, lora, ids, labels, ref = _deep_case(seed, layers=7)
    plain = mesp_step(arch, weights, cfg, lora, ids, labels)
    seg = mesp_step(arch, weights, cfg, lora, ids, labels, layers_per_checkpoint=every)
    torch.testing.assert_close(seg.loss, ref.loss)
    assert_grads_close(seg.grads, ref.grads)
    assert torch.equal(seg.loss, plain.loss)
    assert_grads_close(seg.grads, plain.grads, rtol=0, atol=0)


@pytest.mark.parametrize("selected", [[0, 2, 3, 6], [5], [1, 2, 4, 5, 6], []])
def test_checkpoint_segments_under_lcsb_equal_the_plain_step(selected):
    arch, cfg, weights, lora, ids, labels, _ = _deep_case(4, layers=7)
    plain = mesp_step(arch, weights, cfg, lora, ids, labels, backward_layers=selected)
    for every in (2, 3):
        seg = mesp_step(arch, weights, cfg, lora, ids, labels, backward_layers=selected, layers_per_checkpoint=every)
        assert torch.equal(seg.loss, plain.loss)
        assert_grads_close(seg.grads, plain.grads, rtol=0, atol=0)


def test_checkpoint_segments_keep_one_input_per_group_and_rerun_the_rest(monkeypatch):
    import toolchain.mesp.step as step_module

    arch, cfg, weights, lora, ids, labels, _ = _deep_case(2, layers=7)
    kept, forwards = [], []
    real_forward, real_keep = step_module.block_forward, step_module._forward_checkpoints

    def keep(*args, **kwargs):
        checkpoints, x = real_keep(*args, **kwargs)
        kept.append([i for i, c in enumerate(checkpoints) if c is not None])
        return checkpoints, x

    monkeypatch.setattr(step_module, "_forward_checkpoints", keep)
    monkeypatch.setattr(step_module, "block_forward", lambda x, p, *a: forwards.append(p) or real_forward(x, p, *a))
    mesp_step(arch, weights, cfg, lora, ids, labels, backward_layers=[1, 2, 3, 5, 6], layers_per_checkpoint=2)
    assert kept == [[1, 3, 6]]  # groups [1, 2], [3, 5], [6]
    assert len(forwards) == 7 + (2 - 1) + (5 - 3)  # the reruns: block 1; blocks 3, 4
    with pytest.raises(BadInput, match="layers_per_checkpoint"):
        mesp_step(arch, weights, cfg, lora, ids, labels, layers_per_checkpoint=0)
