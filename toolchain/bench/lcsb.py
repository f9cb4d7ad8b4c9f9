"""LCSB vs full MeSP backprop, side by side: same model, same seed, same data order, same steps.

Both arms fine-tune the same fresh adapter on the same base, see the same example at every step and
use the same optimizer; they differ only in the step plan (full backprop every step vs the LCSB plan).
Steps of the two arms alternate (full step s, then LCSB step s) so drifts in the machine's load hit
both alike.

The base. There are no real weights on this machine, and LoRA on a *random* base is not fine-tuning:
the adapter has to learn the language from nothing, a regime where LCSB, which gives each layer a
gradient only every ceil(L / k) steps, lags full backprop by a few percent (docs/lcsb.md has the
numbers). The papers fine-tune pretrained models. As a stand-in, the bench first "pretrains" the
random base: a rank-`pretrain_rank` adapter is trained with full backprop for `pretrain_steps` steps
on the training split and merged into the weights (W + s B A). Both arms then start from that same
base with a fresh adapter. `pretrain_steps = 0` compares the arms on the random base instead.

Reported (top-level keys of the bench_lcsb document):
  step_s_full / step_s_lcsb   mean wall time per fine-tuning step, the first `warmup` steps excluded
  speedup                     step_s_full / step_s_lcsb (speedup_median: the same with medians)
  loss_gap                    mean over the last 10% of steps of (loss_lcsb - loss_full) / loss_full,
                              both losses of the same example at the same step (before its update)
  val_loss_*                  loss of the final adapters on the held-out tail of the corpus
  surrogate_cosine            per layer, cosine between its LCSB and its exact gradient (final LCSB
                              adapter, first held-out example): how far the stop-gradient surrogate is
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from toolchain.text.dataset import DataRow, bundled_examples, text_examples
from toolchain.errors import BadInput
from toolchain.lcsb import make_plan
from toolchain.lcsb.plan import Policy, StepPlan
from toolchain.lora import LoraConfig, LoraWeights, init_lora, lora_state_dict
from toolchain.mesp import mesp_step
from toolchain.models import PRESETS, LayerWeights, ModelWeights, ModelArch, random_weights
from toolchain.optim import OptimizerConfig
from toolchain.text.shuffle import permutation
from toolchain.text.tokenizer import ByteTokenizer
from toolchain.training import TrainRun, evaluate, start_run, train, train_step

__all__ = ["BENCH_ARCHS", "LcsbBenchConfig", "run_lcsb_bench", "merge_lora", "surrogate_cosine", "text_pretrain_rows",
           "split_rows", "pretrain_base"]

# A Qwen2.5-shaped model small enough for a 2-core host: head dim 64, GQA, MLP width 5.5 x hidden
# (as the 0.5B), byte-level vocabulary so that the LM head does not dwarf the blocks.
BENCH_ARCHS: dict[str, ModelArch] = {
    "mid": ModelArch(hidden=256, layers=12, heads=4, kv_heads=2, intermediate=1408, vocab=ByteTokenizer.vocab,
                      max_positions=1024),
}

# (phase, step, losses by arm): phase is "pretrain" (arm "full" only) or "compare".
OnStep = Callable[[str, int, dict[str, float]], None]


@dataclass(frozen=True)
class LcsbBenchConfig:
    """The benchmark's knobs; recorded verbatim in the JSON it writes.

    Args:
        model: a key of BENCH_ARCHS or a preset (random weights either way; the byte corpus).
        steps: fine-tuning steps of each arm.
        seq_len: tokens per example (bundled corpus windows).
        policy, k: the LCSB arm's plan (k layers per step).
        lr, weight_decay: AdamW settings (betas 0.9/0.999, eps 1e-8), shared by both arms.
        rank, alpha: the fine-tuned LoRA, on all seven projections.
        pretrain_steps, pretrain_rank, pretrain_lr: the shared stand-in pretraining (module docstring);
            0 steps skips it.
        seed: seed of the random weights and of the LoRA inits (PEFT init: B = 0).
        threads: torch intra-op threads during the run (restored after).
        warmup: first fine-tuning steps left out of the timing.
        plan_warmup: the LCSB arm's full-backprop warm-up (`StepPlan.warmup`): its first `plan_warmup`
            steps backpropagate through every layer, then the plan. Default 0 (none).
        val_fraction: tail of the corpus held out for evaluation.
    """

    model: str = "mid"
    steps: int = 300
    seq_len: int = 128
    policy: Policy = "anchored"
    k: int = 4
    lr: float = 2e-4
    weight_decay: float = 0.01
    rank: int = 16
    alpha: float = 32.0
    pretrain_steps: int = 300
    pretrain_rank: int = 32
    pretrain_lr: float = 5e-4
    seed: int = 0
    threads: int = 1
    warmup: int = 3
    val_fraction: float = 0.1
    plan_warmup: int = 0

    def __post_init__(self) -> None:
        if self.model not in BENCH_ARCHS and self.model not in PRESETS:
            raise BadInput(f"unknown bench model {self.model!r}; choose {', '.join([*BENCH_ARCHS, *PRESETS])}")
        if self.steps < 10:
            raise BadInput(f"`steps` must be >= 10 (the loss gap averages the last 10%), got {self.steps}")
        for name in ("pretrain_steps", "warmup", "plan_warmup"):
            if getattr(self, name) < 0:
                raise BadInput(f"`{name}` must be >= 0, got {getattr(self, name)}")
        if self.warmup >= self.steps:
            raise BadInput(f"`warmup` ({self.warmup}) must be below `steps` ({self.steps})")
        if self.threads < 1:
            raise BadInput(f"`threads` must be >= 1, got {self.threads}")
        if not 0 < self.val_fraction < 1:
            raise BadInput(f"`val_fraction` must be in (0, 1), got {self.val_fraction}")
        if self.policy == "full":
            raise BadInput("the LCSB arm needs a selective policy (cyclic, strided, last or random), not full")
        make_plan(self.arch.layers, self.k, self.policy, warmup=self.plan_warmup)  # raises BadInput for k outside 1..layers
        OptimizerConfig("adamw", lr=self.lr, weight_decay=self.weight_decay)
        LoraConfig(rank=self.rank, alpha=self.alpha)

    @property
    def arch(self) -> ModelArch:
        return BENCH_ARCHS.get(self.model) or PRESETS[self.model]


def merge_lora(weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights) -> ModelWeights:
    """The base with the adapter folded in: W <- W + scale * B @ A for every adapted projection."""
    layers = []
    for lw, pairs in zip(weights.layers, lora):
        merged = lw._asdict()        # absent tensors stay None
        for target, p in pairs.items():
            merged[target] = merged[target] + cfg.scale * (p.b @ p.a)        # [out, r] @ [r, in]
        layers.append(LayerWeights(**merged))
    return ModelWeights(weights.embed, tuple(layers), weights.final_norm, weights.lm_head)


def split_rows(config: LcsbBenchConfig) -> tuple[list[DataRow], list[DataRow]]:
    examples = bundled_examples(ByteTokenizer(), seq_len=config.seq_len)
    n_val = max(1, round(len(examples) * config.val_fraction))
    if len(examples) - n_val < 1:
        raise BadInput(f"the bundled corpus gives only {len(examples)} windows of {config.seq_len} tokens; "
                       f"lower --seq-len")
    return examples[:-n_val], examples[-n_val:]


def text_pretrain_rows(config: LcsbBenchConfig, text: str) -> list[DataRow]:
    """Stand-in pretraining rows from another text than the fine-tuning corpus (the bench itself pretrains on
    its training split): `text` in windows of `config.seq_len` bytes (BOS first), in the order of
    `toolchain.text.shuffle.permutation(windows, config.seed)`, so that a pretraining shorter than one pass samples
    the whole text rather than its beginning."""
    examples = text_examples(text, ByteTokenizer(), seq_len=config.seq_len)
    if not examples:
        raise BadInput(f"the pretraining text gives no window of {config.seq_len} tokens")
    return [examples[i] for i in permutation(len(examples), config.seed)]


def pretrain_base(config, arch, weights, rows, on_step) -> tuple[ModelWeights, dict[str, Any]]:
    cfg = LoraConfig(rank=config.pretrain_rank, alpha=2.0 * config.pretrain_rank)
    lora = init_lora(arch, cfg, seed=config.seed + 1)
    opt = OptimizerConfig("adamw", lr=config.pretrain_lr, weight_decay=0.0)
    t0 = time.perf_counter()
    result = train(arch, weights, cfg, lora, rows, TrainRun(steps=config.pretrain_steps, optimizer=opt),
                   on_step=None if on_step is None else (lambda e: on_step("pretrain", e.step, {"full": e.loss})))
    tail = max(1, math.ceil(config.pretrain_steps / 10))
    info = {"steps": config.pretrain_steps, "rank": config.pretrain_rank, "alpha": cfg.alpha,
            "lr": config.pretrain_lr, "weight_decay": 0.0, "final_loss": statistics.fmean(result.losses[-tail:]),
            "seconds": time.perf_counter() - t0}
    return merge_lora(weights, cfg, result.lora), info


def run_lcsb_bench(config: LcsbBenchConfig, *, on_step: OnStep | None = None) -> dict[str, Any]:
    """Pretrain the shared base (unless 0 steps), then fine-tune both arms step by step, alternating.

    Returns:
        The report (a bench_lcsb document; see the module docstring for its numbers).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _run(config, on_step)
    finally:
        torch.set_num_threads(threads)


def _run(config: LcsbBenchConfig, on_step: OnStep | None) -> dict[str, Any]:
    arch = config.arch
    train_rows, val_rows = split_rows(config)
    weights = random_weights(arch, seed=config.seed)
    pretrain = None
    if config.pretrain_steps:
        weights, pretrain = pretrain_base(config, arch, weights, train_rows, on_step)
    cfg = LoraConfig(rank=config.rank, alpha=config.alpha)
    lora0 = init_lora(arch, cfg, seed=config.seed)
    plans = {"full": make_plan(arch.layers, None, "full"), "lcsb": make_plan(arch.layers, config.k, config.policy,
                                                                         warmup=config.plan_warmup)}
    train_cfg = TrainRun(steps=config.steps, optimizer=OptimizerConfig("adamw", lr=config.lr, weight_decay=config.weight_decay))
    states = {arm: start_run(train_cfg, lora0) for arm in plans}
    losses: dict[str, list[float]] = {arm: [] for arm in plans}
    times: dict[str, list[float]] = {arm: [] for arm in plans}
    val0 = evaluate(arch, weights, cfg, lora0, val_rows)
    t_start = time.perf_counter()
    for s in range(config.steps):
        example = train_rows[(config.pretrain_steps + s) % len(train_rows)]  # the data goes on where it stopped
        for arm, plan in plans.items():
            t0 = time.perf_counter()
            states[arm], loss = train_step(arch, weights, cfg, states[arm], example, layers=plan.layers_at(s),
                                           config=train_cfg)
            times[arm].append(time.perf_counter() - t0)
            losses[arm].append(loss)
        if on_step is not None:
            on_step("compare", s + 1, {arm: losses[arm][-1] for arm in plans})
    compare_s = time.perf_counter() - t_start
    val = {arm: evaluate(arch, weights, cfg, states[arm].lora, val_rows) for arm in plans}
    report = _report(config, losses, times, val0, val)
    with torch.no_grad():
        report["surrogate_cosine"] = surrogate_cosine(arch, weights, cfg, states["lcsb"].lora, plans["lcsb"],
                                                      val_rows[0])
    report["config"] = {**asdict(config), "arch": asdict(arch), "plan": plans["lcsb"].to_dict(), "optimizer": "adamw",
                        "betas": [0.9, 0.999], "eps": 1e-8, "targets": list(cfg.targets), "batch": 1,
                        "train_examples": len(train_rows), "val_examples": len(val_rows), "pretrain": pretrain}
    report["host"] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
                      "compare_s": compare_s, "pretrain_s": pretrain["seconds"] if pretrain else 0.0}
    return report


def surrogate_cosine(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, plan: StepPlan,
                     example: DataRow) -> list[float]:
    """Per layer: cosine between its LCSB gradient (mean over the phases that select it) and its exact
    gradient, on one example. 1.0 means exact (every layer above it selected too)."""
    exact = mesp_step(arch, weights, cfg, lora, example.input_ids, example.labels).grads
    cosines: list[list[float]] = [[] for _ in range(arch.layers)]
    for phase in plan.phases:
        grads = mesp_step(arch, weights, cfg, lora, example.input_ids, example.labels, backward_layers=phase).grads
        for i in phase:
            a, b = (torch.cat([t.flatten().double() for t in lora_state_dict((g[i],)).values()])
                    for g in (grads, exact))
            cosines[i].append(float(a @ b / (a.norm() * b.norm())))
    return [statistics.fmean(c) for c in cosines]


def _report(config, losses, times, val0, val) -> dict[str, Any]:
    tail = max(1, math.ceil(config.steps / 10))
    gaps = [(lc - fu) / fu for fu, lc in zip(losses["full"][-tail:], losses["lcsb"][-tail:])]
    mean_s = {arm: statistics.fmean(times[arm][config.warmup:]) for arm in times}
    median_s = {arm: statistics.median(times[arm][config.warmup:]) for arm in times}
    return {
        "schema_version": 1,
        "speedup": mean_s["full"] / mean_s["lcsb"],
        "speedup_median": median_s["full"] / median_s["lcsb"],
        "loss_gap": statistics.fmean(gaps),
        "step_s_full": mean_s["full"],
        "step_s_lcsb": mean_s["lcsb"],
        "final_loss_full": statistics.fmean(losses["full"][-tail:]),
        "final_loss_lcsb": statistics.fmean(losses["lcsb"][-tail:]),
        "initial_loss": losses["full"][0],
        "val_loss_initial": val0,
        "val_loss_full": val["full"],
        "val_loss_lcsb": val["lcsb"],
        "val_loss_gap": (val["lcsb"] - val["full"]) / val["full"],
        "tail_steps": tail,
        "losses_full": losses["full"],
        "losses_lcsb": losses["lcsb"],
    }
