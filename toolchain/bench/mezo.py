"""`bench mezo-cosine`: how good is a MeZO (SPSA) gradient estimate, and what does MeZO save?

For one batch and the initial adapter: the exact LoRA gradient g (MeSP), and one MeZO estimate
g_hat(seed) = g_proj z(seed) per seed. Reported: cos(g_hat, g) over all LoRA parameters flattened
(the MeSP paper reports ~0.001 for Qwen2.5-0.5B), the cosine of the seeds' mean estimate (it grows
like sqrt(seeds) while that stays << 1), and the value a single estimate is expected to reach,
E|cos| = sqrt(2 / (pi n)) for n parameters (z is isotropic: cos(g_hat, g) = |cos(z, g)|, up to
the finite-difference error). Then, unless skipped, `bench memory` for mesp and mezo: peak
memory and step time side by side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolchain.baselines.mezo import DEFAULT_EPS, mezo_grad_estimate
from toolchain.bench.memory import (BenchWorkload, MemoryBenchConfig, call_worker, check_config, host_info,
                                    run_memory_bench)
from toolchain.errors import BadInput
from toolchain.lora import LoraWeights, init_lora, lora_state_dict
from toolchain.mesp import mesp_step

__all__ = ["MezoCosineConfig", "run_mezo_cosine", "flat", "cosine"]


@dataclass(frozen=True)
class MezoCosineConfig(BenchWorkload):
    """A `BenchWorkload` (see `bench.memory`) and

    Args:
        seeds: number of MeZO estimates (perturbation seeds 0..seeds-1). Default: 8.
        eps: SPSA perturbation scale. Default: 1e-3 (MeZO's).
        memory: also run `bench memory` for mesp and mezo. Default: True.
    """

    seeds: int = 8
    eps: float = DEFAULT_EPS
    memory: bool = True

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise BadInput(f"`seeds` must be >= 1, got {self.seeds}")
        if not self.eps > 0:
            raise BadInput(f"`eps` must be > 0, got {self.eps}")
        super().__post_init__()

    def memory_config(self) -> MemoryBenchConfig:
        return MemoryBenchConfig(**self.workload(), modes=("mesp", "mezo"), check_grads=False)


def flat(grads: LoraWeights) -> torch.Tensor:
    """All LoRA tensors as one float64 vector (PEFT key order)."""
    return torch.cat([t.reshape(-1).double() for _, t in sorted(lora_state_dict(grads).items())])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def _load(config: MezoCosineConfig):
    """Build (if needed) and map the cached float32 weights, as `bench memory` does."""
    import tempfile

    from toolchain.bench.weights_cache import load_mmap_weights, weights_cache_dir

    check_config(config.memory_config())
    from toolchain.atomic import discarded_on_stop

    with tempfile.TemporaryDirectory(prefix="bench-mezo-") as tmp_name, discarded_on_stop(Path(tmp_name)) as tmp:
        call_worker(tmp, "prepare", {"cache_dir": str(config.cache_dir), "model": config.model, "init": config.init,
                                     "seed": config.seed}, config.threads)
    return load_mmap_weights(weights_cache_dir(config.cache_dir, config.model, config.init, config.seed))


def run_mezo_cosine(config: MezoCosineConfig, *, on_seed: Callable[[int], None] | None = None,
                    on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Returns the `bench_mezo` document (see the module docstring)."""
    torch.set_num_threads(config.threads)
    arch, weights = _load(config)
    cfg = config.lora_config()
    lora = init_lora(arch, cfg, seed=config.seed, zero_b=False)
    gen = torch.Generator().manual_seed(config.seed)
    input_ids = torch.randint(0, arch.vocab, (config.seq_len,), generator=gen)
    with torch.no_grad():
        exact = mesp_step(arch, weights, cfg, lora, input_ids, input_ids)
    g = flat(exact.grads)
    cosines, projected, total = [], [], torch.zeros_like(g)
    for s in range(config.seeds):
        if on_seed:
            on_seed(s)
        res = mezo_grad_estimate(arch, weights, cfg, lora, input_ids, input_ids, seed=s, eps=config.eps)
        est = flat(res.grads)
        cosines.append(cosine(est, g))
        projected.append(float(res.projected))
        total += est
        del res, est
    memory = None
    if config.memory:
        memory = run_memory_bench(config.memory_config(), on_mode=on_stage)
    n = g.numel()
    cfg_json = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(config).items()}
    return {"schema_version": 1, "config": cfg_json, "n_params": n, "cosines": cosines, "projected_grads": projected,
            "cosine_mean": sum(cosines) / len(cosines), "cosine_abs_mean": sum(map(abs, cosines)) / len(cosines),
            "cosine_of_mean_estimate": cosine(total, g), "expected_abs_cosine": math.sqrt(2 / (math.pi * n)),
            "exact_grad_norm": float(g.norm()), "loss": float(exact.loss), "memory": memory,
            "host": memory["host"] if memory else host_info()}
