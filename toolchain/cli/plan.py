"""`toolchain plan ...`: plan a training run before it runs. This module defines the `plan` group and
`plan fit`; other subcommands add themselves to the group with `@plan.command(...)`."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import (POLICY_CHOICE, chunk_options, layers_per_checkpoint_option, lcsb_k_option,
                                   optimizer_option, rank_option, targets_option)
from toolchain.validate import SEED, FiniteFloat


@click.group()
def plan() -> None:
    """Plan a training run before it runs (does it fit a phone? which layers per step?)."""


def _fit_text(preamble: str, r) -> list[str]:
    verdict = "FITS" if r.fits else "DOES NOT FIT"
    spare = f"{r.margin_mb:.1f} MB to spare" if r.fits else f"{-r.margin_mb:.1f} MB over"
    where = f", peak during {r.phase}" if r.phase else ""
    lines = [preamble, f"predicted peak {r.predicted_peak_mb:.1f} MB ({r.source}{where}) vs budget {r.budget_mb:.0f} MB "
             f"-> {verdict} ({spare})"]
    lines += [f"  {name:<28} {mb:9.1f} MB" for name, mb in sorted(r.parts_mb.items(), key=lambda kv: -kv[1])]
    if r.source == "program":
        lines.append(f"  (on this host, one arena shared by the methods: {r.host_peak_mb:.1f} MB; "
                     f"analytic model of the eager step: {r.analytic_peak_mb:.1f} MB)")
    seq = "none (even 1 token is over budget)" if r.largest_seq_len is None else str(r.largest_seq_len)
    rank = "none" if r.largest_rank is None else f"{r.largest_rank}" + (
        " (the largest meaningful rank)" if r.largest_rank == r.max_rank else "")
    lines += [f"largest seq len that fits at this rank: {seq}", f"largest rank that fits at this seq len: {rank}"]
    lines.append(_fallback_text(r.fallback))
    return lines + [f"note: {n}" for n in r.notes]


def _fallback_text(fb: dict | None) -> str:
    """The `fallback` line: what a run under memory pressure would lower its working set to (docs/training.md)."""
    if fb is None:
        return "fallback under memory pressure: -"
    settings = f"layers_per_checkpoint {fb['layers_per_checkpoint']}, lcsb_k {fb['lcsb_k'] or 'all'}" + (
        "" if fb["seq_len"] is None else f", seq_len {fb['seq_len']}")
    peak = "-" if fb["predicted_peak_mb"] is None else f"{fb['predicted_peak_mb']:.1f} MB"
    if not fb["notches"]:
        return f"fallback under memory pressure: none needed ({settings} fits)"
    verdict = "fits" if fb["fits"] else "still DOES NOT FIT: nothing smaller"
    from collections import Counter

    lowered = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in Counter(fb["notches"]).items())
    return f"fallback under memory pressure: {settings} -> {peak} ({verdict}; lowered {lowered})"


@plan.command()
@click.option("--model", default=None,
              help="Preset (qwen2.5-0.5b ... qwen2.5-7b, qwen3-*, llama3.*, tiny; `toolchain export --help` lists "
                   "them).  [default: --program's; else required]")
@click.option("--seq-len", type=click.IntRange(min=1), default=None,
              help="Tokens per training step.  [default: --program's; else required]")
@rank_option(None, default_help="--program's, else 8")
@targets_option(None, default_help="--program's, else all")
@lcsb_k_option("every layer; with --program, its default plan")
@click.option("--device", required=True,
              help="Device profile: android-6gb, android-8gb, android-12gb, android-16gb, ios-6gb, ios-8gb, ios-12gb or a "
                   "JSON file.")
@click.option("--program", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Exported program directory: predict from its ExecuTorch memory plan (phone: every "
                   "method's arena; the host figure is printed too) instead of the analytic model; the model, "
                   "--seq-len, --rank, --targets, --optimizer and chunk sizes are then the program's.")
@click.option("--method", type=click.Choice(["mesp", "mebp", "autograd"]), default="mesp", show_default=True,
              help="Training step to model (mebp/autograd: the baselines as `bench memory` runs them).")
@optimizer_option(None, default_help="--program's, else sgd")
@chunk_options()
@layers_per_checkpoint_option()
@click.option("--overhead-mb", type=FiniteFloat(min=0), default=None,
              help="Runtime memory added to the tensors.  [default: calibrated with `toolchain bench memory`]")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def fit(*, model, seq_len, rank, targets, lcsb_k, device, program, method, optimizer, loss_chunk, vocab_chunk,
        mlp_chunk, layers_per_checkpoint, overhead_mb, as_json) -> None:
    """Predict the peak memory of a training step and say whether it fits the device's budget."""
    from toolchain.memory.fit import fit_shape, plan_fit
    from toolchain.memory.profiles import load_profile
    from toolchain.mesp import chunk_overrides
    from toolchain.validate import dumps

    profile = load_profile(device)
    fields = {"method": method, "lcsb_k": lcsb_k, "layers_per_checkpoint": layers_per_checkpoint,
              **chunk_overrides(loss_chunk=loss_chunk, vocab_chunk=vocab_chunk,
                                                                     mlp_chunk=mlp_chunk)}
    if optimizer is not None:
        fields["optimizer"] = optimizer
    model, shape = fit_shape(model=model, seq_len=seq_len, program_dir=program, rank=rank, targets=targets, **fields)
    report = plan_fit(shape, profile, program_dir=program, overhead_mb=overhead_mb)
    if as_json:
        click.echo(dumps({"model": model, "seq_len": shape.seq_len, "rank": shape.rank, "lcsb_k": lcsb_k,
                          "method": method, **report.as_dict()}, where="the --json answer", indent=2, sort_keys=True))
        return
    lcsb = f"LCSB k={lcsb_k}" if lcsb_k else "LCSB off"
    preamble = (f"{model}, seq {shape.seq_len}, rank {shape.rank}, {method}, {lcsb}, {shape.optimizer} on "
                f"{profile.name} ({profile.platform})")
    click.echo("\n".join(_fit_text(preamble, report)))


@plan.command()
@click.option("--layers", type=click.IntRange(1, 4096), default=None, help="Decoder layers of the model.")
@click.option("--model", default=None, help="Or a preset whose layer count to use (qwen2.5-0.5b: 24, ...).")
@click.option("--k", "k", type=click.IntRange(min=1), default=None, help="Layers backpropagated per step.")
@click.option("--policy", type=POLICY_CHOICE, default="cyclic",
              show_default=True, help="How layers are chosen per step.")
@click.option("--seed", type=SEED, default=None, help="Random policy only: the seed.  [default: 0]")
@click.option("--period", type=click.IntRange(1, 100_000), default=None,
              help="Random policy only: steps before the draws repeat.  [default: 4 x ceil(L / k)]")
@click.option("--warmup", type=click.IntRange(0, 100_000_000), default=0, show_default=True,
              help="Full-backprop warm-up: steps 0..N-1 backpropagate through every layer, later steps follow the "
                   "schedule (global step index; written as `warmup` when > 0).")
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=Path), required=True,
              help="Step plan JSON to write (shared_schemas/step_plan.schema.json; an existing file is replaced "
                   "atomically).")
def lcsb(*, layers, model, k, policy, seed, period, warmup, out) -> None:
    """Write an LCSB step plan: which layers each training step backpropagates through."""
    from toolchain.atomic import check_output_file
    from toolchain.lcsb import make_plan, write_plan
    from toolchain.models import get_preset

    if (layers is None) == (model is None):
        raise click.UsageError("give exactly one of --layers and --model")
    check_output_file(out)
    n_layers = layers if layers is not None else get_preset(model).layers
    step_plan = make_plan(n_layers, k, policy, seed=seed, period=period, warmup=warmup)
    write_plan(out, step_plan)
    for i, phase in enumerate(step_plan.phases):
        click.echo(f"phase {i}: layers {', '.join(map(str, phase))}")
    if step_plan.warmup:
        click.echo(f"warm-up: steps 0..{step_plan.warmup - 1} backpropagate through every layer")
    click.echo(f"{step_plan.policy} plan, k={step_plan.k}, period {step_plan.period} steps -> {out}")
