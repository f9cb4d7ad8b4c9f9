"""Options shared by several commands, each family defined once so that it is spelled, typed and
explained the same everywhere. A family is a decorator composing `click.option`s; what the values
mean is resolved by the library (`toolchain.lora.resolve`, `toolchain.lcsb.resolve`,
`toolchain.optim.optimizer_config`, `toolchain.mesp.chunk_overrides`), not here."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.atomic import FORCE_HELP
from toolchain.validate import SEED, THREADS, FiniteFloat

__all__ = ["FIELD_OPTIONS", "TARGETS_HELP", "POLICY_CHOICE", "model_options", "rank_option", "targets_option", "lora_shape_options",
           "lora_options", "layers_per_checkpoint_option", "data_option", "force_option", "plan_options", "lcsb_k_option", "chunk_options",
           "optimizer_option", "optimizer_options", "threads_option", "runtime_options", "program_state_options",
           "plan_request", "verbose_requested"]

# Config fields a library error may name (errors.FieldError) -> the option that sets them.
FIELD_OPTIONS = {"rank": "--rank", "seq_len": "--seq-len", "prefill_chunk": "--prefill-chunk",
                 "max_new_tokens": "--max-new-tokens", "temperature": "--temperature"}
TARGETS_HELP = "comma-separated LoRA targets among q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj, or 'all'"
POLICY_CHOICE = click.Choice(["cyclic", "strided", "last", "anchored", "random", "full"])
# StepOptions' defaults (toolchain/mesp/step.py, which imports torch; tests/cli/test_options.py checks them).
_CHUNK_DEFAULTS = {"loss_chunk": 256, "vocab_chunk": 1024, "mlp_chunk": 256}
# `export --compute int8`'s MLP chunk: its int8 kernels run fewer, larger calls at the same peak (docs/export.md)
INT8_MLP_CHUNK = 512


def verbose_requested() -> bool:
    """`toolchain --verbose` (or TOOLCHAIN_VERBOSE=1, which click reads for it): the root command's flag, which
    the commands that open a runtime pass to it (`TrainingSession(..., verbose=...)`)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("verbose"))


def _compose(*decorators):
    """One decorator applying `decorators` so that their options list in the order given."""
    def deco(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return deco


# -- model and adapter ---------------------------------------------------------------------------------
def model_options(default_model: str | None = "tiny", *, required: bool | None = None):
    """--model, --init, --seed: the base model (`toolchain.lora.resolve.load_model_and_adapter`)."""
    return _compose(
        click.option("--model", "model", default=default_model,
                     required=(default_model is None) if required is None else required,
                     show_default=default_model is not None,
                     help="Preset (tiny, demo, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, qwen3-0.6b, "
                          "qwen3-1.7b, qwen3-4b, qwen3-8b, llama3.2-1b, llama3.2-3b, llama3.1-8b) or a Hugging Face checkpoint directory (model_type qwen2, qwen3 or llama; config.json "
                          "fields the step does not compute are refused)."),
        click.option("--init", "init", type=click.Choice(["pretrained", "random"]), default="pretrained",
                     show_default=True, help="'random' builds the preset with seeded random weights (no download)."),
        click.option("--seed", type=SEED, default=0, show_default=True,
                     help="Seed of random weights and of the LoRA init."))


def rank_option(default: int | None = 8, *, default_help: str | None = None):
    """--rank; `default_help` replaces the shown default (e.g. when None means "the program's")."""
    shown = f"  [default: {default_help}]" if default_help else ""
    return click.option("--rank", type=click.IntRange(min=1), default=default, show_default=default_help is None,
                        help="LoRA rank." + shown)


def targets_option(default: str | None = "all", *, default_help: str | None = None):
    shown = f"  [default: {default_help}]" if default_help else ""
    return click.option("--targets", default=default, show_default=default_help is None,
                        help=TARGETS_HELP + "." + shown)


def lora_shape_options(f):
    """--rank, --alpha, --targets: a fresh adapter's shape (commands that take no --adapter)."""
    return _compose(
        rank_option(),
        click.option("--alpha", type=FiniteFloat(min=0, min_open=True), default=None,
                     help="LoRA alpha; scale = alpha / rank.  [default: 2 x rank]"),
        targets_option())(f)


def lora_options(f):
    """--adapter, or a fresh adapter's --rank/--alpha/--targets."""
    return _compose(
        click.option("--adapter", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
                     help="Start from this PEFT adapter directory (its config overrides --rank/--alpha/--targets)."),
        lora_shape_options)(f)


def data_option(f):
    return click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
                        help="JSONL file, one {\"input_ids\": [...], \"labels\"?: [...]} per line.")(f)


def force_option(f):
    """--force: replace an existing non-empty output directory (refused by default)."""
    return click.option("--force", is_flag=True, help=FORCE_HELP)(f)


# -- LCSB plan -----------------------------------------------------------------------------------------
def lcsb_k_option(default_help: str = "every layer"):
    """--lcsb-k K; `default_help` says what the command does without it."""
    return click.option("--lcsb-k", type=click.IntRange(min=1), default=None,
                        help=f"Backpropagate through K layers per step (LCSB).  [default: {default_help}]")


def plan_options(default_help: str = "full backprop"):
    """--plan FILE, or --lcsb-k/--lcsb-policy/--lcsb-seed/--lcsb-warmup to build one on the fly (`PlanRequest`)."""
    return _compose(
        click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None, help=f"LCSB step plan JSON (`toolchain plan lcsb`), instead of --lcsb-k/"
                                        f"--lcsb-policy/--lcsb-seed/--lcsb-warmup.  [default: {default_help}]"),
        lcsb_k_option(default_help),
        click.option("--lcsb-policy", type=POLICY_CHOICE, default=None,
                     help="LCSB policy for --lcsb-k.  [default: cyclic]"),
        click.option("--lcsb-seed", type=SEED, default=None, help="Seed of the random LCSB policy.  [default: 0]"),
        click.option("--lcsb-warmup", type=click.IntRange(min=0), default=None,
                     help="Full-backprop warm-up of the --lcsb-k/--lcsb-policy plan: steps 0..N-1 backpropagate "
                          "through every layer, later steps follow the plan.  [default: 0]"))


def plan_request(plan_path: Path | None, lcsb_k: int | None, lcsb_policy: str | None, lcsb_seed: int | None,
                 lcsb_warmup: int | None = None):
    """`plan_options`' values as a `toolchain.lcsb.PlanRequest`."""
    from toolchain.lcsb import PlanRequest

    return PlanRequest(path=plan_path, k=lcsb_k, policy=lcsb_policy, seed=lcsb_seed, warmup=lcsb_warmup)


# -- step memory knobs ---------------------------------------------------------------------------------
def chunk_options(loss_chunk_default: str = str(_CHUNK_DEFAULTS["loss_chunk"]),
                  mlp_chunk_default: str = str(_CHUNK_DEFAULTS["mlp_chunk"])):
    """--loss-chunk, --vocab-chunk, --mlp-chunk: MeSP's `StepOptions` (`toolchain.mesp.chunk_overrides`).
    Memory/speed trade-offs only: they never change the result."""
    big = 2**31 - 1
    return _compose(
        click.option("--loss-chunk", type=click.IntRange(1, big), default=None,
                     help=f"Tokens per LM-head chunk.  [default: {loss_chunk_default}]"),
        click.option("--vocab-chunk", type=click.IntRange(0, big), default=None,
                     help="Vocabulary entries per LM-head chunk (online softmax; 0: whole rows).  "
                          f"[default: {_CHUNK_DEFAULTS['vocab_chunk']}]"),
        click.option("--mlp-chunk", type=click.IntRange(0, big), default=None,
                     help="Intermediate columns per MLP chunk, forward and backward (0: all at once).  "
                          f"[default: {mlp_chunk_default}]"))


def layers_per_checkpoint_option(default: int | None = 1, *, default_help: str = "1: every layer's input kept"):
    """--layers-per-checkpoint N: `mesp_step`'s / `LayerLoop.train_step`'s checkpoint groups."""
    return click.option("--layers-per-checkpoint", type=click.IntRange(1, 4096), default=default,
                        help="Keep one layer input per N backpropagated layers and recompute the others from it "
                             "when the backward reaches them: fewer [T, d] checkpoints (about 2*sqrt(L) instead of "
                             f"L with N = sqrt(L)), one more forward pass, the same result.  [default: {default_help}]")


# -- optimizer -----------------------------------------------------------------------------------------
def optimizer_option(default: str | None, *, default_help: str | None = None):
    """--optimizer; `default_help` replaces the shown default (e.g. when None means "the program's")."""
    shown = f"  [default: {default_help}]" if default_help else ""
    return click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default=default,
                        show_default=default_help is None,
                        help="Optimizer, applied to each layer right after its backward (AdamW keeps two moments "
                             "per LoRA parameter)." + shown)


def optimizer_options(default: str, *, momentum: bool = True):
    """--optimizer and its knobs (`toolchain.optim.optimizer_config`); `default` is the command's kind.
    `momentum=False` leaves out --momentum (exported programs have no momentum buffer)."""
    options = [
        optimizer_option(default),
        click.option("--weight-decay", type=FiniteFloat(min=0), default=None,
                     help="AdamW: decoupled decay; SGD: L2 added to the gradient.  [default: 0.01 adamw, 0 sgd]"),
        click.option("--momentum", type=FiniteFloat(min=0, max=1, max_open=True), default=0.0, show_default=True,
                     help="SGD momentum."),
        click.option("--frozen-unselected", is_flag=True,
                     help="Leave layers outside a step's selection untouched (default: zero-gradient update, so "
                          "momentum and weight decay still move them, as in the LCSB paper)."),
    ]
    return _compose(*(options if momentum else options[:2] + options[3:]))


# -- running an exported program -----------------------------------------------------------------------
def threads_option(f):
    return click.option("--threads", type=THREADS, default=None,
                        help="Runtime threads (default: its own).")(f)


def runtime_options(f):
    """--target and --threads: which runtime runs a program's methods, on how many threads."""
    return _compose(
        click.option("--target", "target", type=click.Choice(["executorch", "onnx", "eager"]), default=None,
                     help="Runtime (default: the program's first host-runnable target; eager: the same methods "
                          "in PyTorch, the reference)."),
        threads_option)(f)


def program_state_options(f):
    """--adapter or --resume-from: the LoRA state a program runs with (`training.session.program_state`)."""
    return _compose(
        click.option("--adapter", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
                     help="Use this PEFT adapter directory (its config must match the program's); "
                          "default: the program's initial adapter."),
        click.option("--resume-from", "resume_from", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None, help="Use the LoRA state of this `toolchain train --program` checkpoint "
                                        "(*.train-checkpoint.safetensors), e.g. of a run still going."))(f)
