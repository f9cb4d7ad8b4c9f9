"""Baseline: MeZO, zeroth-order training by SPSA (Malladi et al. 2023, arXiv 2305.17333).

With a random direction z ~ N(0, I) over all LoRA tensors and a small eps:
  g_proj = (L(theta + eps z) - L(theta - eps z)) / (2 eps)      (two forward passes, no backward)
  g_hat  = g_proj * z                                             (E[g_hat] = grad L + O(eps^2))
  SGD:     theta <- theta - lr * g_proj * z
z is never stored: it is regenerated tensor by tensor from its seed (a `torch.Generator` walked
over the LoRA tensors in a fixed order: layer, target, then A before B), so the perturbation
costs one tensor-sized transient at a time, and the parameters are perturbed in place
(theta + eps z, then - 2 eps z, then + eps z back; restoring is exact up to float rounding).
A single estimate in n = #LoRA-params dimensions has cosine ~ 1/sqrt(n) with the true gradient
(MeSP reports ~0.001 for Qwen2.5-0.5B); `bench mezo-cosine` measures it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp import StepOptions, model_loss
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights

__all__ = ["DEFAULT_EPS", "MezoResult", "MezoEstimate", "perturbation", "perturb_", "mezo_grad_estimate", "mezo_step"]

DEFAULT_EPS = 1e-3  # MeZO's default perturbation scale


class MezoResult(NamedTuple):
    loss: Tensor        # [] (L+ + L-) / 2, the loss at theta up to O(eps^2)
    projected: Tensor   # [] g_proj = (L+ - L-) / (2 eps)


class MezoEstimate(NamedTuple):
    """Like `StepResult` (loss, grads), plus the scalar the estimate is made of."""

    loss: Tensor          # [] (L+ + L-) / 2
    grads: LoraWeights    # g_proj * z, per layer and target
    projected: Tensor     # [] g_proj


def _tensors(lora: LoraWeights) -> Iterator[Tensor]:
    for layer in lora:
        for target in sorted(layer):  # fixed order, independent of dict insertion order
            yield layer[target].a
            yield layer[target].b


def perturbation(lora: LoraWeights, seed: int) -> Iterator[Tensor]:
    """z for each LoRA tensor in `_tensors` order, regenerated from `seed` (same seed: same z)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for t in _tensors(lora):
        yield torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)


def perturb_(lora: LoraWeights, seed: int, scale: float) -> None:
    """theta += scale * z(seed), in place, one z-sized transient at a time."""
    with torch.no_grad():
        for t, z in zip(_tensors(lora), perturbation(lora, seed)):
            t.add_(z, alpha=scale)


def _spsa(arch, weights, cfg, lora, input_ids, labels, *, seed, eps, options) -> MezoResult:
    """Two forwards around theta; `lora` is perturbed in place and restored before returning."""
    with torch.no_grad():
        perturb_(lora, seed, eps)
        loss_plus = model_loss(arch, weights, cfg, lora, input_ids, labels, options=options)
        perturb_(lora, seed, -2 * eps)
        loss_minus = model_loss(arch, weights, cfg, lora, input_ids, labels, options=options)
        perturb_(lora, seed, eps)
    return MezoResult((loss_plus + loss_minus) / 2, (loss_plus - loss_minus) / (2 * eps))


def mezo_grad_estimate(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
                       input_ids: Tensor, labels: Tensor, *, seed: int = 0, eps: float = DEFAULT_EPS,
                       options: StepOptions = StepOptions()) -> MezoEstimate:
    """One SPSA estimate g_hat = g_proj * z of the LoRA gradient, in the structure `mesp_step` returns.

    The caller's `lora` is left untouched (the estimate perturbs a copy); materializing g_hat is for
    analysis (`toolchain grads --mode mezo`, `bench mezo-cosine`): MeZO training never does it.

    Args:
        seed: seed of the direction z. Default: 0.
        eps: perturbation scale. Default: 1e-3.

    Returns:
        loss (L+ + L-) / 2, the estimate per layer and target, and g_proj.
    """
    work = tuple({t: LoraPair(p.a.detach().clone(), p.b.detach().clone()) for t, p in layer.items()} for layer in lora)
    res = _spsa(arch, weights, cfg, work, input_ids, labels, seed=seed, eps=eps, options=options)
    z = perturbation(lora, seed)
    grads = tuple({t: LoraPair(res.projected * next(z), res.projected * next(z)) for t in sorted(layer)}
                  for layer in lora)
    # Re-key in the caller's target order (the same keys; dict order follows the config).
    grads = tuple({t: g[t] for t in layer} for g, layer in zip(grads, lora))
    return MezoEstimate(res.loss, grads, res.projected)


def mezo_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, input_ids: Tensor,
              labels: Tensor, *, seed: int, lr: float, eps: float = DEFAULT_EPS,
              options: StepOptions = StepOptions()) -> MezoResult:
    """One MeZO-SGD training step, in place on `lora`: two forwards, then theta -= lr * g_proj * z.

    Use a new `seed` every step (the direction must change). Nothing gradient-sized is allocated.
    """
    res = _spsa(arch, weights, cfg, lora, input_ids, labels, seed=seed, eps=eps, options=options)
    perturb_(lora, seed, -lr * float(res.projected))
    return res
