"""Options shared by several commands, defined once so they are spelled the same everywhere."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.atomic import FORCE_HELP
from toolchain.validate import SEED, FiniteFloat

__all__ = ["model_options", "lora_options", "lora_shape_options", "data_option", "force_option", "lora_config_from",
           "load_model_and_adapter"]

TARGETS_HELP = "comma-separated LoRA targets among q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj, or 'all'"


def model_options(default_model: str | None = "tiny", *, required: bool | None = None):
    def deco(f):
        f = click.option("--seed", type=SEED, default=0, show_default=True,
                         help="Seed of random weights and of the LoRA init.")(f)
        f = click.option("--init", "init", type=click.Choice(["pretrained", "random"]), default="pretrained",
                         show_default=True,
                         help="'random' builds the preset with seeded random weights (no download).")(f)
        f = click.option("--model", "model", default=default_model,
                         required=(default_model is None) if required is None else required,
                         show_default=default_model is not None,
                         help="Preset (tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b) or a Hugging Face "
                              "Qwen2 checkpoint directory.")(f)
        return f
    return deco


def lora_shape_options(f):
    """--rank, --alpha, --targets: a fresh adapter's shape (commands that take no --adapter)."""
    f = click.option("--targets", default="all", show_default=True, help=TARGETS_HELP)(f)
    f = click.option("--alpha", type=FiniteFloat(min=0, min_open=True), default=None,
                     help="LoRA alpha; scale = alpha / rank.  [default: 2 x rank]")(f)
    f = click.option("--rank", type=click.IntRange(min=1), default=8, show_default=True, help="LoRA rank.")(f)
    return f


def lora_options(f):
    f = lora_shape_options(f)
    f = click.option("--adapter", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
                     help="Start from this PEFT adapter directory (its config overrides --rank/--alpha/--targets).")(f)
    return f


def data_option(f):
    return click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
                        help="JSONL file, one {\"input_ids\": [...], \"labels\"?: [...]} per line.")(f)


def force_option(f):
    """--force: replace an existing non-empty output directory (refused by default)."""
    return click.option("--force", is_flag=True, help=FORCE_HELP)(f)


def lora_config_from(rank: int, alpha: float | None, targets: str):
    from toolchain.lora import LoraConfig, parse_targets

    return LoraConfig(rank=rank, alpha=alpha if alpha is not None else 2.0 * rank, targets=parse_targets(targets))


def load_model_and_adapter(model: str, init: str, seed: int, adapter: Path | None, rank: int, alpha: float | None,
                           targets: str, *, dtype=None, zero_b: bool = True):
    """Resolve the model and the starting adapter (a PEFT directory, or PEFT's default init)."""
    import torch

    from toolchain.lora import init_lora, load_adapter
    from toolchain.models import load_model

    dtype = dtype or torch.float32
    arch, weights = load_model(model, init=init, seed=seed, dtype=dtype)
    if adapter is not None:
        cfg, lora = load_adapter(adapter, arch, dtype=dtype)
    else:
        from toolchain.validate import check_rank

        cfg = lora_config_from(rank, alpha, targets)
        check_rank(cfg.rank, arch, cfg.targets)
        lora = init_lora(arch, cfg, seed=seed, dtype=dtype, zero_b=zero_b)
    return arch, weights, cfg, lora
