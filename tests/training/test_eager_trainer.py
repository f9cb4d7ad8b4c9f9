"""The eager trainer: MeSP + LCSB plan + layer-by-layer optimizer, against autograd oracles.

Oracles: `torch.optim.AdamW` on gradients from plain autograd (full backprop), and autograd through the
LCSB surrogate h + detach(block(h) - h) for the non-selected blocks (LCSB steps).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers import lora_for, our_weights, random_hf_model
from torch.utils._pytree import tree_leaves

from toolchain.baselines.autograd import full_logits_loss, leaf_lora
from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput
from toolchain.lcsb import make_plan
from toolchain.lora import LoraConfig, LoraPair
from toolchain.mesp import block_forward, block_params, mesp_step
from toolchain.mesp.ops import rope_tables
from toolchain.models import ModelArch
from toolchain.optim import OptimizerConfig, init_state, update_all
from toolchain.training import RunState, TrainRun, start_run, train, train_step

ARCH = ModelArch(hidden=16, layers=5, heads=4, kv_heads=2, intermediate=24, vocab=37, max_positions=64)
CFG = LoraConfig(rank=3, alpha=5.0, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"))


@pytest.fixture(scope="module")
def setup():
    gen = torch.Generator().manual_seed(0)
    weights = our_weights(ARCH, random_hf_model(ARCH, gen), torch.float64)
    lora = lora_for(ARCH, CFG, seed=1)
    examples = []
    for t in (9, 12, 7):
        ids = torch.randint(0, ARCH.vocab, (t,), generator=gen)
        examples.append(DataRow(ids, ids.clone()))
    return weights, lora, examples


def _flat(lora) -> list[torch.Tensor]:
    return [x for layer in lora for t in sorted(layer) for x in layer[t]]


def surrogate_grads(weights, lora, example: DataRow, selected: set[int]):
    """Autograd through the LCSB model: a non-selected block is h + detach(block(h) - h)."""
    leaves = leaf_lora(lora)
    rope = rope_tables(torch.arange(example.input_ids.shape[0]), ARCH.head_dim, ARCH.rope_theta, torch.float64)
    x = weights.embed[example.input_ids]
    for i in range(ARCH.layers):
        o = block_forward(x, block_params(ARCH, weights, CFG, leaves, i), rope)
        x = o if i in selected else x + (o - x).detach()
    loss = full_logits_loss(ARCH, weights, x, example.labels)
    loss.backward()
    zero = lambda p: p.grad if p.grad is not None else torch.zeros_like(p)  # noqa: E731
    return loss.detach(), tuple({t: LoraPair(zero(p.a), zero(p.b)) for t, p in layer.items()} for layer in leaves)


def test_lcsb_with_k_equal_to_all_layers_equals_the_mesp_step_exactly(setup):
    weights, lora, examples = setup
    config = TrainRun(steps=3, optimizer=OptimizerConfig("adamw", lr=1e-2, weight_decay=0.1))
    plan = make_plan(ARCH.layers, ARCH.layers, "cyclic")
    assert plan.phases == (tuple(range(ARCH.layers)),)
    state = start_run(config, lora)
    ref_lora, ref_opt = lora, init_state(config.optimizer, lora)
    for s, ex in enumerate(examples):
        state, loss = train_step(ARCH, weights, CFG, state, ex, layers=plan.layers_at(s), config=config)
        res = mesp_step(ARCH, weights, CFG, ref_lora, ex.input_ids, ex.labels)
        ref_lora, ref_opt = update_all(config.optimizer, ref_lora, res.grads, ref_opt)
        assert loss == float(res.loss)
        assert all(torch.equal(a, b) for a, b in zip(_flat(state.lora), _flat(ref_lora)))
        assert all(torch.equal(a, b) for a, b in zip(tree_leaves(state.opt.slots), tree_leaves(ref_opt.slots)))


def test_adamw_matches_torch_adamw_step_for_step_on_full_backprop(setup):
    weights, lora, examples = setup
    opt = OptimizerConfig("adamw", lr=2e-2, weight_decay=0.1)
    result = train(ARCH, weights, CFG, lora, examples, TrainRun(steps=5, optimizer=opt))
    params = [p.clone().requires_grad_() for p in _flat(lora)]
    torch_opt = torch.optim.AdamW(params, lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    structure = [(i, t) for i, layer in enumerate(lora) for t in sorted(layer)]
    for s in range(5):
        current = [dict() for _ in lora]
        for n, (i, t) in enumerate(structure):
            current[i][t] = LoraPair(params[2 * n].detach(), params[2 * n + 1].detach())
        loss, grads = surrogate_grads(weights, tuple(current), examples[s % 3], set(range(ARCH.layers)))
        torch.testing.assert_close(loss, torch.tensor(result.log[s].loss, dtype=torch.float64))
        for p, g in zip(params, _flat(grads)):
            p.grad = g
        torch_opt.step()
    for ours, theirs in zip(_flat(result.lora), params):
        torch.testing.assert_close(ours, theirs.detach())


@pytest.mark.parametrize("selected", [{4}, {1, 3}, {0, 2}, {0}])
def test_lcsb_step_gradients_are_autograd_through_the_stop_gradient_surrogate(setup, selected):
    weights, lora, examples = setup
    ex = examples[0]
    res = mesp_step(ARCH, weights, CFG, lora, ex.input_ids, ex.labels, backward_layers=selected)
    _, expected = surrogate_grads(weights, lora, ex, selected)
    for i in range(ARCH.layers):
        if i in selected:
            for t in CFG.targets:
                torch.testing.assert_close(res.grads[i][t].a, expected[i][t].a)
                torch.testing.assert_close(res.grads[i][t].b, expected[i][t].b)
        else:
            assert res.grads[i] == {}
            assert all(float(g.abs().max()) == 0 for g in _flat((expected[i],)))


def test_lcsb_surrogate_is_not_the_exact_gradient_below_skipped_layers(setup):
    """Layer 0's gradient with layers 1-4 skipped differs from its exact gradient (docs/lcsb.md)."""
    weights, lora, examples = setup
    ex = examples[0]
    exact = mesp_step(ARCH, weights, CFG, lora, ex.input_ids, ex.labels).grads[0]
    lcsb = mesp_step(ARCH, weights, CFG, lora, ex.input_ids, ex.labels, backward_layers={0}).grads[0]
    assert not torch.allclose(exact["q_proj"].a, lcsb["q_proj"].a)
    top_exact = mesp_step(ARCH, weights, CFG, lora, ex.input_ids, ex.labels).grads[4]
    top_lcsb = mesp_step(ARCH, weights, CFG, lora, ex.input_ids, ex.labels, backward_layers={4}).grads[4]
    assert all(torch.equal(a, b) for a, b in zip(_flat((top_exact,)), _flat((top_lcsb,))))  # nothing above: exact


@pytest.mark.parametrize("opt", [OptimizerConfig("adamw", lr=1e-2, weight_decay=0.05),
                                 OptimizerConfig("sgd", lr=1e-2, momentum=0.9)],
                         ids=["adamw", "sgd-momentum"])
def test_lcsb_training_matches_torch_optim_with_zero_grads_for_unselected_layers(setup, opt):
    """Two cyclic groups of 5 layers: {0, 1, 2}, {3, 4}; torch.optim gets the surrogate gradient for the
    selected layers and a zero .grad for the others, every step."""
    weights, lora, examples = setup
    plan = make_plan(ARCH.layers, 3, "cyclic")
    result = train(ARCH, weights, CFG, lora, examples, TrainRun(steps=4, optimizer=opt, plan=plan))
    params = [p.clone().requires_grad_() for p in _flat(lora)]
    if opt.kind == "adamw":
        torch_opt = torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay)
    else:
        torch_opt = torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum)
    per_layer = len(_flat((lora[0],)))
    for s in range(4):
        current = _unflatten(lora, [p.detach() for p in params])
        _, grads = surrogate_grads(weights, current, examples[s % 3], set(plan.layers_at(s)))
        for p, g in zip(params, _flat(grads)):
            p.grad = g
        torch_opt.step()
        assert result.log[s].layers == plan.layers_at(s)
    for n, (ours, theirs) in enumerate(zip(_flat(result.lora), params)):
        torch.testing.assert_close(ours, theirs.detach(), msg=f"layer {n // per_layer}")


def _unflatten(like, flat):
    out, n = [], 0
    for layer in like:
        d = {}
        for t in sorted(layer):
            d[t] = LoraPair(flat[n], flat[n + 1])
            n += 2
        out.append(d)
    return tuple(out)


def test_frozen_unselected_layers_stay_put_and_default_ones_move(setup):
    weights, lora, examples = setup
    plan = make_plan(ARCH.layers, 2, "last")  # layers 3, 4 every step
    opt = OptimizerConfig("adamw", lr=1e-2, weight_decay=0.0)
    # One full step first so that every layer has momentum, then LCSB steps.
    state = start_run(TrainRun(steps=1, optimizer=opt), lora)
    config = TrainRun(steps=1, optimizer=opt)
    state, _ = train_step(ARCH, weights, CFG, state, examples[0], layers=None, config=config)
    # train_step updates in place: each branch starts from its own copy
    frozen, _ = train_step(ARCH, weights, CFG, state.clone(), examples[1], layers=plan.layers_at(0),
                           config=TrainRun(steps=1, optimizer=replace(opt, frozen_unselected=True)))
    moving, _ = train_step(ARCH, weights, CFG, state.clone(), examples[1], layers=plan.layers_at(0), config=config)
    for i in range(3):
        assert all(torch.equal(a, b) for a, b in zip(_flat((frozen.lora[i],)), _flat((state.lora[i],))))
        assert all(torch.equal(x.a, y.a) and torch.equal(x.b, y.b) for t in state.opt.slots[i]
                   for x, y in zip(frozen.opt.slots[i][t], state.opt.slots[i][t]))
        assert not any(torch.equal(a, b) for a, b in zip(_flat((moving.lora[i],)), _flat((state.lora[i],))))
    assert frozen.opt.step == moving.opt.step == 2
    for i in (3, 4):
        assert all(torch.equal(a, b) for a, b in zip(_flat((frozen.lora[i],)), _flat((moving.lora[i],))))


def test_train_reports_each_step_and_refuses_a_plan_for_another_model(setup):
    weights, lora, examples = setup
    seen = []
    result = train(ARCH, weights, CFG, lora, examples, TrainRun(steps=4, optimizer=OptimizerConfig("sgd", lr=1e-2),
                   plan=make_plan(ARCH.layers, 2, "strided")), on_step=seen.append)
    assert [e.step for e in seen] == [1, 2, 3, 4] and [e.row for e in seen] == [0, 1, 2, 0]
    assert [e.layers for e in seen] == [(0, 3), (1, 4), (2,), (0, 3)]
    assert result.log == tuple(seen)
    with pytest.raises(BadInput, match="for 8 layers but the model has 5"):
        train(ARCH, weights, CFG, lora, examples, TrainRun(steps=1, plan=make_plan(8, 2, "cyclic")))


def test_train_does_not_modify_the_starting_adapter(setup):
    weights, lora, examples = setup
    before = [p.clone() for p in _flat(lora)]
    train(ARCH, weights, CFG, lora, examples, TrainRun(steps=2, optimizer=OptimizerConfig("adamw", lr=0.1)))
    assert all(torch.equal(a, b) for a, b in zip(before, _flat(lora)))
    assert isinstance(start_run(TrainRun(steps=1), lora), RunState)


def test_train_step_updates_in_place_and_start_run_copies(setup):
    """The update writes into the run's tensors (no second adapter + optimizer state per step); the caller's
    adapter is never touched (start_run copies it)."""
    weights, lora, examples = setup
    before = _flat(lora)
    opt = OptimizerConfig("adamw", lr=1e-2, weight_decay=0.01)
    state = start_run(TrainRun(steps=1, optimizer=opt), lora)
    a0 = state.lora[0][CFG.targets[0]].a
    ptr, copy = a0.data_ptr(), a0.clone()
    new, _ = train_step(ARCH, weights, CFG, state, examples[0], layers=None, config=TrainRun(steps=1, optimizer=opt))
    assert new.lora[0][CFG.targets[0]].a.data_ptr() == ptr and not torch.equal(new.lora[0][CFG.targets[0]].a, copy)
    assert all(torch.equal(a, b) for a, b in zip(_flat(lora), before))


def test_a_warmup_runs_full_backprop_steps_then_the_plan_bit_for_bit(setup, tmp_path):
    """warmup W: steps 0..W-1 equal `train_step` with every layer, later steps the plan without a warm-up at
    the same (global) step index; the telemetry of a warm-up step has no lcsb_phase."""
    weights, lora, examples = setup
    opt = OptimizerConfig("adamw", lr=1e-2, weight_decay=0.01)
    warm, plain = make_plan(ARCH.layers, 2, "cyclic", warmup=4), make_plan(ARCH.layers, 2, "cyclic")
    events = tmp_path / "events.jsonl"
    result = train(ARCH, weights, CFG, lora, examples, TrainRun(steps=7, optimizer=opt, plan=warm, telemetry=events))
    ref_config = TrainRun(steps=7, optimizer=opt)
    state = start_run(ref_config, lora)
    losses = []
    for s in range(7):
        layers = None if s < 4 else plain.layers_at(s)  # None: train_step's full backprop
        state, loss = train_step(ARCH, weights, CFG, state, examples[s % 3], layers=layers, config=ref_config)
        losses.append(loss)
    assert list(result.losses) == losses
    assert all(torch.equal(a, b) for a, b in zip(_flat(result.lora), _flat(state.lora)))
    assert [e.layers for e in result.log] == [tuple(range(ARCH.layers))] * 4 + [plain.layers_at(s) for s in (4, 5, 6)]
    assert plain.layers_at(4) == (1, 2) != plain.layers_at(0)  # 4 % 3 = 1: the schedule does not restart after the warm-up
    steps = [e for e in map(json.loads, events.read_text().splitlines()) if e["type"] == "step"]
    assert [e.get("lcsb_phase") for e in steps] == [None] * 4 + [plain.schedule[s % plain.period] for s in (4, 5, 6)]


def test_resume_refuses_a_checkpoint_of_another_warmup(setup, tmp_path):
    weights, lora, examples = setup
    ck = tmp_path / "ck.safetensors"
    opt = OptimizerConfig("sgd", lr=1e-2)
    train(ARCH, weights, CFG, lora, examples, TrainRun(steps=2, optimizer=opt, checkpoint=ck,
                                                          plan=make_plan(ARCH.layers, 2, "cyclic", warmup=1)))
    with pytest.raises(BadInput, match="LCSB plan"):
        train(ARCH, weights, CFG, lora, examples, TrainRun(steps=3, optimizer=opt, checkpoint=ck, resume=True,
                                                              plan=make_plan(ARCH.layers, 2, "cyclic", warmup=2)))
    resumed = train(ARCH, weights, CFG, lora, examples, TrainRun(steps=3, optimizer=opt, checkpoint=ck, resume=True,
                                                                    plan=make_plan(ARCH.layers, 2, "cyclic", warmup=1)))
    assert len(resumed.losses) == 3
