"""`toolchain bench ...`: side-by-side measurements, one subcommand per comparison."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def bench() -> None:
    """Benchmarks that run every mode side by side in one process (compare ratios, not absolute times)."""


@bench.command("lcsb")
@click.option("--model", default="mid", show_default=True,
              help="'mid' (a 12-layer Qwen2.5-shaped model with a byte vocabulary) or a preset; random weights.")
@click.option("--steps", type=click.IntRange(min=10), default=None, help="Steps of each arm.  [default: 300]")
@click.option("--seq-len", type=click.IntRange(min=2), default=None, help="Tokens per example.  [default: 128]")
@click.option("--k", "k", type=click.IntRange(min=1), default=None, help="LCSB layers per step.  [default: 6]")
@click.option("--policy", type=click.Choice(["cyclic", "strided", "last", "random"]), default=None,
              help="LCSB policy.  [default: cyclic]")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, help="AdamW learning rate.")
@click.option("--seed", type=int, default=None, help="Seed of the weights and the LoRA init.  [default: 0]")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the full report (bench_lcsb schema) here.")
def lcsb(model, steps, seq_len, k, policy, lr, seed, json_out) -> None:
    """Train the same model from the same seed with full MeSP backprop and with LCSB; report the
    step-time speedup and the loss gap."""
    from rich.console import Console
    from rich.progress import Progress

    from toolchain.bench.lcsb import LcsbBenchConfig, run_lcsb_bench
    from toolchain.schemas import write_json

    given = {"model": model, "steps": steps, "seq_len": seq_len, "k": k, "policy": policy, "lr": lr, "seed": seed}
    config = LcsbBenchConfig(**{name: v for name, v in given.items() if v is not None})
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench lcsb", total=config.steps)

        def on_step(step: int, losses: dict[str, float]) -> None:
            progress.update(task, completed=step,
                            description=f"bench lcsb  full {losses['full']:.3f}  lcsb {losses['lcsb']:.3f}")

        report = run_lcsb_bench(config, on_step=on_step)
    if json_out is not None:
        write_json(json_out, "bench_lcsb", report)
    plan = report["config"]["plan"]
    click.echo(f"model {config.model}, {config.steps} steps, seq {config.seq_len}, AdamW lr {config.lr:g}, "
               f"LCSB {plan['policy']} k={plan['k']} of {plan['layers']} layers")
    click.echo(f"{'':6} {'s/step':>8} {'loss (last 10%)':>16} {'val loss':>9}")
    for arm in ("full", "lcsb"):
        click.echo(f"{arm:6} {report[f'step_s_{arm}']:8.4f} {report[f'final_loss_{arm}']:16.4f} "
                   f"{report[f'val_loss_{arm}']:9.4f}")
    click.echo(f"speedup {report['speedup']:.3f}  loss_gap {report['loss_gap']:+.4f}  "
               f"val_loss_gap {report['val_loss_gap']:+.4f}  (val loss before training {report['val_loss_initial']:.4f})")
