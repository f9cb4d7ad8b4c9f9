"""MeZO (SPSA): the direction is regenerated from its seed (same seed, same estimate; the caller's
adapter untouched), g_proj is the directional derivative along z (float64, vs the exact MeSP
gradient), the estimates average to the gradient, the training step moves theta by -lr g_proj z,
and `toolchain grads --mode mezo` writes the estimate."""

from __future__ import annotations

import torch
from click.testing import CliRunner
from helpers import flat_grads

from toolchain.baselines.mezo import mezo_grad_estimate, mezo_step, perturb_, perturbation
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import mesp_step
from toolchain.models import ModelArch, random_weights

# Small enough that a thousand estimates take seconds; every target kind of the block is adapted.
ARCH = ModelArch(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=12, vocab=23, max_positions=32)
CFG = LoraConfig(rank=1, alpha=2.0, targets=("q_proj", "v_proj", "down_proj"))


def _problem(dtype=torch.float64):
    weights = random_weights(ARCH, seed=3, dtype=dtype)
    lora = init_lora(ARCH, CFG, seed=3, dtype=dtype, zero_b=False)
    ids = torch.randint(0, ARCH.vocab, (12,), generator=torch.Generator().manual_seed(3))
    return weights, lora, ids


def _vec(grads) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for _, t in sorted(flat_grads(grads).items())])


def _z(lora, seed) -> torch.Tensor:
    """z in the same (PEFT key) order as `_vec`."""
    zs = perturbation(lora, seed)
    layers = tuple({t: type(p)(next(zs), next(zs)) for t, p in sorted(layer.items())} for layer in lora)
    return _vec(layers)


def test_same_seed_same_estimate_and_the_adapter_is_untouched():
    weights, lora, ids = _problem()
    before = {k: v.clone() for k, v in flat_grads(lora).items()}
    a = mezo_grad_estimate(ARCH, weights, CFG, lora, ids, ids, seed=7)
    b = mezo_grad_estimate(ARCH, weights, CFG, lora, ids, ids, seed=7)
    c = mezo_grad_estimate(ARCH, weights, CFG, lora, ids, ids, seed=8)
    assert torch.equal(_vec(a.grads), _vec(b.grads)) and float(a.loss) == float(b.loss)
    assert not torch.equal(_vec(a.grads), _vec(c.grads))
    for k, v in flat_grads(lora).items():
        assert torch.equal(v, before[k]), k
    assert sorted(flat_grads(a.grads)) == sorted(flat_grads(lora))  # same structure as the adapter


def test_the_estimate_is_g_proj_times_z_and_g_proj_is_the_directional_derivative():
    weights, lora, ids = _problem()
    exact = _vec(mesp_step(ARCH, weights, CFG, lora, ids, ids).grads)
    for seed in range(3):
        # eps 1e-5: the truncation error (eps^2 times the third derivative along z, weight-dependent: 1.35e-6
        # relative at eps 1e-4 on one draw of the random weights) lies well under the bound, float64 rounding
        # (~1e-16 / eps) too
        est = mezo_grad_estimate(ARCH, weights, CFG, lora, ids, ids, seed=seed, eps=1e-5)
        z = _z(lora, seed)
        torch.testing.assert_close(_vec(est.grads), est.projected * z)
        # Central differences: error O(eps^2) relative to the derivative.
        torch.testing.assert_close(est.projected, exact @ z, rtol=1e-6, atol=1e-9)


def test_estimates_average_to_the_exact_gradient():
    weights, lora, ids = _problem()
    exact = _vec(mesp_step(ARCH, weights, CFG, lora, ids, ids).grads)
    n_estimates = 600
    mean = sum(_vec(mezo_grad_estimate(ARCH, weights, CFG, lora, ids, ids, seed=s).grads)
               for s in range(n_estimates)) / n_estimates
    # E[(g.z) z] = g; with n parameters the mean of N estimates has cos ~ 1/sqrt(1 + (n+1)/N).
    n = exact.numel()
    cos = float(mean @ exact / (mean.norm() * exact.norm()))
    single = float(_vec(mezo_grad_estimate(ARCH, weights, CFG, lora, ids, ids, seed=0).grads) @ exact)
    assert n < 150 and cos > 0.85, (n, cos)
    assert 0.8 < float(mean.norm() / exact.norm()) < 1.3
    assert single > 0  # a single estimate points uphill: (g.z)^2 >= 0


def test_perturbation_round_trip_restores_the_adapter():
    _, lora, _ = _problem(torch.float32)
    before = _vec(lora).clone()
    for scale in (1e-3, -2e-3, 1e-3):
        perturb_(lora, 5, scale)
    torch.testing.assert_close(_vec(lora), before, rtol=0, atol=1e-6)


def test_mezo_step_moves_theta_by_minus_lr_g_proj_z():
    weights, lora, ids = _problem()
    before = _vec(lora).clone()
    res = mezo_step(ARCH, weights, CFG, lora, ids, ids, seed=11, lr=0.5)
    torch.testing.assert_close(_vec(lora) - before, -0.5 * res.projected * _z(lora, 11))


def test_grads_cli_mezo_writes_the_estimate(tmp_path):
    from safetensors.torch import load_file

    from toolchain.cli import cli

    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8]}\n')
    out = {mode: tmp_path / f"{mode}.safetensors" for mode in ("mezo", "mesp")}
    for mode, path in out.items():
        args = ["grads", "--model", "tiny", "--init", "random", "--data", str(data), "--mode", mode, "--out", str(path)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
    mezo, mesp = load_file(str(out["mezo"])), load_file(str(out["mesp"]))
    assert sorted(mezo) == sorted(mesp)
    assert any(v.abs().max() > 0 for v in mezo.values())
