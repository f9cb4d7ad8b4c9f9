"""The target-neutral program contract (no exporter involved): which state entries a method returns,
the flat state layout, and the eager step against the MeSP gradients + the optimizer rule."""

from __future__ import annotations

import torch

from toolchain.export.program import (OptimizerSpec, StepProgram, TrainMethod, example_inputs, flat_state,
                                      unflatten_state)
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import mesp_step
from toolchain.models import Qwen25Arch, random_weights

ARCH = Qwen25Arch(hidden=24, layers=3, heads=3, kv_heads=1, intermediate=40, vocab=50, max_positions=32)
CFG = LoraConfig(rank=2, alpha=4, targets=("k_proj", "up_proj"))


def _program(**kw) -> StepProgram:
    return StepProgram(ARCH, random_weights(ARCH, seed=1), CFG, **kw)


def test_sgd_phase_returns_only_its_layers_params():
    p = _program()
    names = [e.name for e in p.updated_entries((1,))]
    assert names == ["lora_1_k_proj_a", "lora_1_k_proj_b", "lora_1_up_proj_a", "lora_1_up_proj_b"]
    assert [e.name for e in p.updated_entries(None)] == [e.name for e in p.layout]


def test_adamw_and_weight_decay_move_every_entry():
    for opt in (OptimizerSpec("adamw"), OptimizerSpec("sgd", weight_decay=0.1)):
        p = _program(optimizer=opt)
        assert [e.name for e in p.updated_entries((0,))] == [e.name for e in p.layout]
    frozen = _program(optimizer=OptimizerSpec("adamw", frozen_unselected=True))
    kept = {e.name for e in frozen.updated_entries((2,))}
    assert "adam_step" in kept and "adam_m_2_k_proj_a" in kept and "lora_0_k_proj_a" not in kept


def test_flat_state_layout_round_trip():
    p = _program(optimizer=OptimizerSpec("adamw"))
    lora = init_lora(ARCH, CFG, seed=2, zero_b=False)
    flat = flat_state(p.layout, lora)
    assert flat.numel() == p.layout[-1].offset + 1
    views = unflatten_state(p.layout, flat)
    assert torch.equal(views["lora_2_up_proj_b"], lora[2]["up_proj"].b.float())
    assert float(views["adam_step"][0]) == 0.0 and float(views["adam_v_1_k_proj_a"].abs().sum()) == 0.0
    views["lora_0_k_proj_a"].fill_(3.0)  # views write through
    assert float(flat[p.layout[0].offset]) == 3.0


def test_train_method_outputs_follow_updated_entries():
    p = _program()
    method = TrainMethod(p, (0, 2))
    args = example_inputs(p, 8)
    assert len(args) == 3 + len(p.layout)
    with torch.no_grad():
        out = method(*args)
    expected = p.updated_entries((0, 2))
    assert len(out) == 1 + len(expected)
    assert [tuple(t.shape) for t in out[1:]] == [e.shape for e in expected]


def test_eager_step_is_mesp_gradient_plus_sgd():
    p = _program()
    lora = init_lora(ARCH, CFG, seed=3, zero_b=False)
    state = flat_state(p.layout, lora)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, ARCH.vocab, (10,), generator=g)
    ref = mesp_step(ARCH, random_weights(ARCH, seed=1), lora, CFG, ids, ids.clone(), backward_layers={1, 2})
    loss = p.eager_step(ids, ids.clone(), 0.5, state, (1, 2))
    assert abs(loss - float(ref.loss)) <= 1e-6 * abs(float(ref.loss))
    views = unflatten_state(p.layout, state)
    for i in range(ARCH.layers):
        for t in CFG.targets:
            pair, grad = lora[i][t], ref.grads[i].get(t)
            for which in ("a", "b"):
                before = getattr(pair, which).float()
                expect = before - 0.5 * getattr(grad, which) if grad is not None else before
                torch.testing.assert_close(views[f"lora_{i}_{t}_{which}"], expect, rtol=1e-6, atol=1e-7)
    assert not ref.grads[0]  # layer 0 was outside the phase: untouched above
