"""LCSB vs full MeSP backprop, side by side: same model, same seed, same data order, same steps.

Both arms start from the same random weights and the same adapter, see the same example at every
step, and use the same optimizer; they differ only in the step plan (full backprop every step vs the
LCSB plan). Steps of the two arms alternate (full step s, then LCSB step s) so the machine's load
drifts affect both alike. Reported:
  step_s_full / step_s_lcsb   mean wall time per step, first `warmup` steps excluded
  speedup                     step_s_full / step_s_lcsb
  loss_gap                    mean over the last 10% of steps of (loss_lcsb - loss_full) / loss_full,
                              both losses of the same example at the same step
  val_loss_*                  held-out loss (the corpus' last `val_fraction`) of the final adapters
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from toolchain.dataset import ByteTokenizer, bundled_examples
from toolchain.errors import BadInput
from toolchain.lcsb import AdamW, make_plan
from toolchain.lcsb.plan import Policy
from toolchain.lora import LoraConfig, init_lora
from toolchain.models import PRESETS, Qwen25Arch, random_weights
from toolchain.train import TrainConfig, evaluate, start_run, train_step

__all__ = ["BENCH_ARCHS", "LcsbBenchConfig", "run_lcsb_bench"]

# A Qwen2.5-shaped model small enough for a 2-core host: head dim 64, GQA, MLP width ~5.5 x hidden
# (as the 0.5B), byte-level vocabulary so the LM head does not dwarf the blocks.
BENCH_ARCHS: dict[str, Qwen25Arch] = {
    "mid": Qwen25Arch(hidden=256, layers=12, heads=4, kv_heads=2, intermediate=1408, vocab=ByteTokenizer.vocab,
                      max_positions=1024),
}


@dataclass(frozen=True)
class LcsbBenchConfig:
    """The benchmark's knobs; recorded verbatim in the JSON it writes.

    Args:
        model: a key of BENCH_ARCHS or a preset (random weights; the byte corpus).
        steps: training steps of each arm.
        seq_len: tokens per example (bundled corpus windows).
        policy, k: the LCSB arm's plan (k layers per step).
        lr, weight_decay: AdamW settings (betas 0.9/0.999, eps 1e-8), shared by both arms.
        rank, alpha: LoRA on all seven projections.
        seed: seed of the random weights and of the LoRA init (PEFT init: B = 0).
        warmup: first steps left out of the timing.
        val_fraction: tail of the corpus held out for evaluation.
    """

    model: str = "mid"
    steps: int = 300
    seq_len: int = 128
    policy: Policy = "cyclic"
    k: int = 4
    lr: float = 1e-3
    weight_decay: float = 0.01
    rank: int = 16
    alpha: float = 32.0
    seed: int = 0
    warmup: int = 3
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.model not in BENCH_ARCHS and self.model not in PRESETS:
            raise BadInput(f"unknown bench model {self.model!r}; choose {', '.join([*BENCH_ARCHS, *PRESETS])}")
        if self.steps < 10:
            raise BadInput(f"`steps` must be >= 10 (the loss gap averages the last 10%), got {self.steps}")
        if not 0 <= self.warmup < self.steps:
            raise BadInput(f"`warmup` must be in 0..steps-1, got {self.warmup}")
        if not 0 < self.val_fraction < 1:
            raise BadInput(f"`val_fraction` must be in (0, 1), got {self.val_fraction}")
        if self.policy == "full":
            raise BadInput("the LCSB arm needs a selective policy (cyclic, strided, last or random), not full")
        make_plan(self.arch.layers, self.k, self.policy)  # raises BadInput for k outside 1..layers

    @property
    def arch(self) -> Qwen25Arch:
        return BENCH_ARCHS.get(self.model) or PRESETS[self.model]


Arm = Literal["full", "lcsb"]
OnStep = Callable[[int, dict[str, float]], None]


def _split(config: LcsbBenchConfig):
    examples = bundled_examples(ByteTokenizer(), seq_len=config.seq_len)
    n_val = max(1, round(len(examples) * config.val_fraction))
    if len(examples) - n_val < 1:
        raise BadInput(f"the bundled corpus gives only {len(examples)} windows of {config.seq_len} tokens; "
                       f"lower --seq-len")
    return examples[:-n_val], examples[-n_val:]


def run_lcsb_bench(config: LcsbBenchConfig, *, on_step: OnStep | None = None) -> dict[str, Any]:
    """Train both arms step by step, alternating, and return the report (the bench_lcsb document)."""
    arch = config.arch
    train_rows, val_rows = _split(config)
    weights = random_weights(arch, seed=config.seed)
    cfg = LoraConfig(rank=config.rank, alpha=config.alpha)
    lora0 = init_lora(arch, cfg, seed=config.seed)
    opt = AdamW(lr=config.lr, weight_decay=config.weight_decay)
    plans = {"full": make_plan(arch.layers, None, "full"), "lcsb": make_plan(arch.layers, config.k, config.policy)}
    train_cfg = TrainConfig(steps=config.steps, optimizer=opt)
    states = {arm: start_run(train_cfg, lora0) for arm in plans}
    losses: dict[Arm, list[float]] = {"full": [], "lcsb": []}
    times: dict[Arm, list[float]] = {"full": [], "lcsb": []}
    val0 = evaluate(arch, weights, cfg, lora0, val_rows)
    t_start = time.perf_counter()
    for s in range(config.steps):
        example = train_rows[s % len(train_rows)]
        for arm, plan in plans.items():
            t0 = time.perf_counter()
            states[arm], loss = train_step(arch, weights, cfg, states[arm], example, plan.layers_at(s), train_cfg)
            times[arm].append(time.perf_counter() - t0)
            losses[arm].append(loss)
        if on_step is not None:
            on_step(s + 1, {arm: losses[arm][-1] for arm in plans})
    train_s = time.perf_counter() - t_start
    val = {arm: evaluate(arch, weights, cfg, states[arm].lora, val_rows) for arm in plans}
    return _report(config, arch, plans["lcsb"], losses, times, val0, val, train_s, len(train_rows), len(val_rows))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _report(config, arch, plan, losses, times, val0, val, train_s, n_train, n_val) -> dict[str, Any]:
    tail = max(1, math.ceil(config.steps / 10))
    gaps = [(lc - fu) / fu for fu, lc in zip(losses["full"][-tail:], losses["lcsb"][-tail:])]
    step_s = {arm: _mean(times[arm][config.warmup:]) for arm in times}
    return {
        "schema_version": 1,
        "speedup": step_s["full"] / step_s["lcsb"],
        "loss_gap": _mean(gaps),
        "step_s_full": step_s["full"],
        "step_s_lcsb": step_s["lcsb"],
        "final_loss_full": _mean(losses["full"][-tail:]),
        "final_loss_lcsb": _mean(losses["lcsb"][-tail:]),
        "initial_loss": losses["full"][0],
        "val_loss_initial": val0,
        "val_loss_full": val["full"],
        "val_loss_lcsb": val["lcsb"],
        "val_loss_gap": (val["lcsb"] - val["full"]) / val["full"],
        "tail_steps": tail,
        "losses_full": losses["full"],
        "losses_lcsb": losses["lcsb"],
        "config": {**asdict(config), "arch": asdict(arch), "plan": plan.to_dict(), "optimizer": "adamw",
                   "betas": [0.9, 0.999], "eps": 1e-8, "targets": list(LoraConfig().targets),
                   "train_examples": n_train, "val_examples": n_val, "batch": 1},
        "host": {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
                 "train_s": train_s},
    }
