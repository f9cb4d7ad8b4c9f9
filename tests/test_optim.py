"""toolchain/optim.py: SGD and AdamW over LoRA weights vs torch.optim, step for step, including LCSB's
zero-gradient updates of non-selected layers, `frozen_unselected`, the global step counter, the one
`moves_unselected` rule, and the exported programs' update being the same function."""

from __future__ import annotations

import pytest
import torch

from toolchain.errors import BadInput
from toolchain.lora import LoraConfig, LoraPair
from toolchain.models import ModelArch
from toolchain.optim import OptimizerConfig, init_state, update_all, update_layer


def adamw(**kw) -> OptimizerConfig:
    return OptimizerConfig("adamw", **kw)


def sgd(**kw) -> OptimizerConfig:
    return OptimizerConfig("sgd", **kw)


OPTIMIZERS = [
    pytest.param(adamw(lr=3e-2, weight_decay=0.1), id="adamw-wd"),
    pytest.param(adamw(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0), id="adamw-nowd"),
    pytest.param(sgd(lr=5e-2, momentum=0.9, weight_decay=0.05), id="sgd-momentum-wd"),
    pytest.param(sgd(lr=5e-2), id="sgd"),
]


def _torch_opt(opt, params):
    if opt.kind == "adamw":
        return torch.optim.AdamW(params, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay,
                                 foreach=False)
    return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay, foreach=False)


def _layer(gen, shapes=(("q_proj", 3, 5, 4), ("down_proj", 3, 7, 2)), dtype=torch.float64) -> dict[str, LoraPair]:
    return {t: LoraPair(torch.randn(r, i, generator=gen, dtype=dtype),
                        torch.randn(o, r, generator=gen, dtype=dtype)) for t, r, i, o in shapes}


def _grads_like(layer, gen) -> dict[str, LoraPair]:
    return {t: LoraPair(torch.randn(p.a.shape, generator=gen, dtype=p.a.dtype),
                        torch.randn(p.b.shape, generator=gen, dtype=p.b.dtype)) for t, p in layer.items()}


def _as_list(layer) -> list[torch.Tensor]:
    return [x for t in sorted(layer) for x in layer[t]]


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_update_layer_matches_torch_optim_with_zero_gradients_on_unselected_steps(opt, gen):
    """Selected at steps 1, 2, 5; not selected (zero gradient) at 3, 4, 6: torch.optim given a zero
    .grad is the oracle of LCSB's implicit momentum update."""
    layer = _layer(gen)
    ref = [p.clone().requires_grad_() for p in _as_list(layer)]
    torch_opt = _torch_opt(opt, ref)
    slots = init_state(opt, (layer,)).slots[0]
    for step, selected in enumerate([True, True, False, False, True, False], start=1):
        grads = _grads_like(layer, gen) if selected else None
        for p, g in zip(ref, _as_list(grads) if selected else [torch.zeros_like(p) for p in ref]):
            p.grad = g.clone()
        torch_opt.step()
        layer, slots = update_layer(opt, layer, grads, slots, step)
        for ours, theirs in zip(_as_list(layer), ref):
            torch.testing.assert_close(ours, theirs.detach())


@pytest.mark.parametrize("opt", OPTIMIZERS[:3])
def test_unselected_layer_moves_by_momentum_and_decay_only(opt, gen):
    layer = _layer(gen)
    slots = init_state(opt, (layer,)).slots[0]
    layer1, slots1 = update_layer(opt, layer, _grads_like(layer, gen), slots, 1)
    layer2, slots2 = update_layer(opt, layer1, None, slots1, 2)
    b1, b2 = opt.betas
    for t in layer:
        for which in range(2):
            p1, p2 = layer1[t][which], layer2[t][which]
            if opt.kind == "adamw":
                m1, v1 = slots1[t][0][which], slots1[t][1][which]
                m2, v2 = b1 * m1, b2 * v1              # zero gradient: moments only decay
                torch.testing.assert_close(slots2[t][0][which], m2)
                torch.testing.assert_close(slots2[t][1][which], v2)
                denom = v2.sqrt() / (1 - b2 ** 2) ** 0.5 + opt.eps
                expected = p1 * (1 - opt.lr * opt.weight_decay) - opt.lr / (1 - b1 ** 2) * m2 / denom
            else:
                buf2 = opt.momentum * slots1[t][0][which] + opt.weight_decay * p1
                expected = p1 - opt.lr * buf2
            torch.testing.assert_close(p2, expected)
            assert not torch.equal(p2, p1)  # it does move


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_frozen_unselected_layer_does_not_move_and_step_counter_stays_global(opt, gen):
    from dataclasses import replace

    frozen = replace(opt, frozen_unselected=True)
    layer = _layer(gen)
    slots = init_state(opt, (layer,)).slots[0]
    g1, g3 = _grads_like(layer, gen), _grads_like(layer, gen)
    layer1, slots1 = update_layer(frozen, layer, g1, slots, 1)
    layer2, slots2 = update_layer(frozen, layer1, None, slots1, 2)
    assert layer2 is layer1 and slots2 is slots1
    layer3, _ = update_layer(frozen, layer2, g3, slots2, 3)
    # Oracle: torch.optim stepped with g1, its step counter advanced without an update, then g3.
    ref = [p.clone().requires_grad_() for p in _as_list(layer)]
    torch_opt = _torch_opt(opt, ref)
    for p, g in zip(ref, _as_list(g1)):
        p.grad = g.clone()
    torch_opt.step()
    for p in ref:
        if opt.kind == "adamw":
            torch_opt.state[p]["step"] += 1
    for p, g in zip(ref, _as_list(g3)):
        p.grad = g.clone()
    torch_opt.step()
    for ours, theirs in zip(_as_list(layer3), ref):
        torch.testing.assert_close(ours, theirs.detach())


def test_update_layer_does_not_modify_its_inputs(gen):
    opt = adamw(lr=0.1, weight_decay=0.1)
    layer = _layer(gen)
    before = [p.clone() for p in _as_list(layer)]
    slots = init_state(opt, (layer,)).slots[0]
    grads = _grads_like(layer, gen)
    update_layer(opt, layer, grads, slots, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, _as_list(layer)))
    assert all(float(s.abs().max()) == 0 for t in slots for pair in slots[t] for s in pair)


def test_update_all_selected_and_frozen(gen):
    opt = sgd(lr=0.1, momentum=0.5)
    lora = (_layer(gen), _layer(gen), _layer(gen))
    grads = tuple(_grads_like(layer, gen) for layer in lora)
    state = init_state(opt, lora)
    new, st = update_all(sgd(lr=0.1, momentum=0.5, frozen_unselected=True), lora, grads, state, selected={1})
    assert st.step == 1
    assert new[0] is lora[0] and new[2] is lora[2]
    assert not torch.equal(new[1]["q_proj"].a, lora[1]["q_proj"].a)
    # Without freezing, momentum 0 buffers and zero gradients leave unselected layers in place at step 1 ...
    new, st = update_all(opt, lora, grads, state, selected={1})
    assert torch.equal(new[0]["q_proj"].a, lora[0]["q_proj"].a)
    # ... but not at step 2, once their buffers hold a gradient.
    new, st = update_all(opt, lora, grads, state)
    new2, _ = update_all(opt, new, grads, st, selected={1})
    assert not torch.equal(new2[0]["q_proj"].a, new[0]["q_proj"].a)


# (optimizer, moves an unselected layer, slots per parameter): the one rule, table-driven.
MOVES = [
    (sgd(), False, ()),
    (sgd(weight_decay=0.1), True, ()),
    (sgd(momentum=0.9), True, ("momentum_buffer",)),
    (sgd(momentum=0.9, frozen_unselected=True), False, ("momentum_buffer",)),
    (adamw(), True, ("exp_avg", "exp_avg_sq")),
    (adamw(weight_decay=0.01, frozen_unselected=True), False, ("exp_avg", "exp_avg_sq")),
]


@pytest.mark.parametrize("opt, moves, roles", MOVES, ids=[str(i) for i in range(len(MOVES))])
def test_moves_unselected_is_what_update_layer_does(opt, moves, roles, gen):
    assert opt.moves_unselected is moves and opt.slot_roles == roles
    layer = _layer(gen)
    lr_layer, slots = update_layer(opt, layer, _grads_like(layer, gen), init_state(opt, (layer,)).slots[0], 1)
    after, _ = update_layer(opt, lr_layer, None, slots, 2)
    changed = any(not torch.equal(a, b) for a, b in zip(_as_list(after), _as_list(lr_layer)))
    assert changed is moves


@pytest.mark.parametrize("make, message", [
    (lambda: adamw(lr=0), "`lr` must be a finite number > 0"),
    (lambda: adamw(lr=float("nan")), "`lr`"),
    (lambda: adamw(betas=(0.9, 1.0)), "`betas`"),
    (lambda: sgd(momentum=-0.1), "`momentum`"),
    (lambda: adamw(momentum=0.5), "applies to sgd"),
    (lambda: sgd(weight_decay=-1), "`weight_decay`"),
    (lambda: sgd(weight_decay=float("inf")), "`weight_decay`"),
    (lambda: OptimizerConfig("adam"), "unknown optimizer"),
])
def test_bad_optimizer_settings_are_refused(make, message):
    with pytest.raises(BadInput, match=message):
        make()


# -- the exported programs call the same update --------------------------------------------------------

ARCH = ModelArch(hidden=16, layers=2, heads=4, kv_heads=2, intermediate=24, vocab=37, max_positions=32)
CFG = LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "down_proj"))


@pytest.mark.parametrize("opt", [adamw(weight_decay=0.1), sgd(weight_decay=0.1)], ids=["adamw", "sgd"])
def test_program_skip_update_is_update_layer_with_no_gradient(opt, gen):
    from toolchain.export.bodies import method_module
    from toolchain.program.spec import ProgramSpec, method_specs

    spec = ProgramSpec(ARCH, CFG, 8, optimizer=opt)
    method = method_specs(spec)["block_skip_update"]
    layer = {t: LoraPair(torch.randn(CFG.rank, ARCH.linear_shape(t)[1], generator=gen),
                         torch.randn(ARCH.linear_shape(t)[0], CFG.rank, generator=gen)) for t in CFG.targets}
    slots = {t: tuple(LoraPair(torch.rand(p.a.shape, generator=gen), torch.rand(p.b.shape, generator=gen))
                      for _ in opt.slot_roles) for t, p in layer.items()}
    lr, step = 3e-2, 4
    values = {"lr": torch.tensor([lr]), "step": torch.tensor([float(step)])}
    prefix = {"param": "lora", "exp_avg": "adam_m", "exp_avg_sq": "adam_v"}
    for t in CFG.targets:
        for w in (0, 1):
            values[f"lora_{t}_{'ab'[w]}"] = layer[t][w]
            for r, slot in zip(opt.slot_roles, slots[t]):
                values[f"{prefix[r]}_{t}_{'ab'[w]}"] = slot[w]
    outputs = method_module(spec, "block_skip_update")(*(values[io.name] for io in method.inputs))
    new = dict(zip((io.name.removesuffix("_out") for io in method.outputs), outputs))
    from dataclasses import replace

    ref, ref_slots = update_layer(replace(opt, lr=lr), layer, None, slots, step)
    for t in CFG.targets:
        for w in (0, 1):
            torch.testing.assert_close(new[f"lora_{t}_{'ab'[w]}"], ref[t][w])
            for r, slot in zip(opt.slot_roles, ref_slots[t]):
                torch.testing.assert_close(new[f"{prefix[r]}_{t}_{'ab'[w]}"], slot[w])


def test_programs_refuse_sgd_momentum():
    from toolchain.program.spec import ProgramSpec

    with pytest.raises(BadInput, match="do not implement SGD momentum"):
        ProgramSpec(ARCH, CFG, 8, optimizer=sgd(momentum=0.9))


@pytest.mark.parametrize("kind, weight_decay, expected", [("adamw", None, 0.01), ("sgd", None, 0.0),
                                                          ("adamw", 0.0, 0.0), ("sgd", 0.1, 0.1)])
def test_optimizer_config_weight_decay_default_follows_the_kind(kind, weight_decay, expected):
    from toolchain.optim import optimizer_config

    opt = optimizer_config(kind, lr=3e-4, weight_decay=weight_decay)
    assert (opt.kind, opt.lr, opt.weight_decay) == (kind, 3e-4, expected)


def test_optimizer_config_refuses_momentum_with_adamw():
    from toolchain.optim import optimizer_config

    with pytest.raises(BadInput, match="--momentum applies to --optimizer sgd"):
        optimizer_config("adamw", momentum=0.9)
