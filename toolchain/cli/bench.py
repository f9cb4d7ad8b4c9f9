"""`toolchain bench ...`: side-by-side measurements, one subcommand per comparison."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import (POLICY_CHOICE, chunk_options, layers_per_checkpoint_option, lora_shape_options,
                                   model_options)
from toolchain.validate import SEED, STEPS, THREADS, FiniteFloat


@click.group()
def bench() -> None:
    """Benchmarks that run every mode side by side in one process (compare ratios, not absolute times)."""


@bench.command("lcsb")
@click.option("--model", default="mid", show_default=True,
              help="'mid' (a 12-layer Qwen2.5-shaped model with a byte vocabulary) or a preset; random weights.")
@click.option("--steps", type=click.IntRange(10, STEPS.max), default=None,
              help="Fine-tuning steps of each arm.  [default: 300]")
@click.option("--seq-len", type=click.IntRange(min=2), default=None, help="Tokens per example.  [default: 128]")
@click.option("--k", "k", type=click.IntRange(min=1), default=None, help="LCSB layers per step.  [default: 4]")
@click.option("--policy", type=click.Choice([p for p in POLICY_CHOICE.choices if p != "full"]), default=None,
              help="LCSB policy.  [default: anchored]")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None,
              help="AdamW learning rate of both arms.  [default: 2e-4]")
@click.option("--pretrain-steps", type=click.IntRange(min=0), default=None,
              help="Full-backprop steps that turn the random base into a stand-in pretrained one before the "
                   "comparison (0: compare on the random base).  [default: 300]")
@click.option("--threads", type=THREADS, default=None, help="torch threads.  [default: 1]")
@click.option("--seed", type=SEED, default=None, help="Seed of the weights and the LoRA init.  [default: 0]")
@click.option("--warmup", "plan_warmup", type=click.IntRange(min=0), default=None,
              help="LCSB arm only: its first N steps backpropagate through every layer (a full-backprop warm-up), "
                   "then the plan; recorded as config.plan_warmup.  [default: 0]")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the full report (bench_lcsb schema) here (an existing file is replaced).")
def lcsb(*, model, steps, seq_len, k, policy, lr, pretrain_steps, threads, seed, plan_warmup, json_out) -> None:
    """Fine-tune the same model from the same seed with full MeSP backprop and with LCSB, side by
    side; report the step-time speedup and the loss gap (docs/lcsb.md)."""
    from toolchain.bench.lcsb import LcsbBenchConfig, run_lcsb_bench
    from toolchain.schemas import write_json

    if json_out is not None:
        check_output_file(json_out, option="--json")

    given = {"model": model, "steps": steps, "seq_len": seq_len, "k": k, "policy": policy, "lr": lr,
             "pretrain_steps": pretrain_steps, "threads": threads, "seed": seed,
             "plan_warmup": plan_warmup}
    config = LcsbBenchConfig(**{name: v for name, v in given.items() if v is not None})
    with _progress() as progress:
        tasks = {"pretrain": progress.add_task("pretrain base", total=config.pretrain_steps, visible=False),
                 "compare": progress.add_task("full vs lcsb", total=config.steps)}

        def on_step(phase: str, step: int, losses: dict[str, float]) -> None:
            text = "  ".join(f"{arm} {loss:.3f}" for arm, loss in losses.items())
            progress.update(tasks[phase], completed=step, visible=True, description=f"{phase}  {text}")

        report = run_lcsb_bench(config, on_step=on_step)
    if json_out is not None:
        write_json(json_out, "bench_lcsb", report)
    for line in _lcsb_table(report):
        click.echo(line)


def _lcsb_table(report: dict) -> list[str]:
    c, plan, pre = report["config"], report["config"]["plan"], report["config"]["pretrain"]
    base = f"base pretrained {pre['steps']} steps (loss {pre['final_loss']:.3f})" if pre else "random base"
    lines = [f"model {c['model']}, {base}; {c['steps']} steps, seq {c['seq_len']}, AdamW lr {c['lr']:g}, "
             f"LCSB {plan['policy']} k={plan['k']} of {plan['layers']} layers",
             f"{'':6} {'s/step':>8} {'loss (last 10%)':>16} {'val loss':>9}"]
    for arm in ("full", "lcsb"):
        lines.append(f"{arm:6} {report[f'step_s_{arm}']:8.4f} {report[f'final_loss_{arm}']:16.4f} "
                     f"{report[f'val_loss_{arm}']:9.4f}")
    lines.append(f"speedup {report['speedup']:.3f} (medians: {report['speedup_median']:.3f})  "
                 f"loss_gap {report['loss_gap']:+.4f}  val_loss_gap {report['val_loss_gap']:+.4f}  "
                 f"(val loss before fine-tuning {report['val_loss_initial']:.4f})")
    lines.append("cosine(LCSB gradient, exact gradient) by layer: "
                 + " ".join(f"{c:.2f}" for c in report["surrogate_cosine"]))
    return lines


def _bench_run_options(f):
    """Options of the memory benchmarks (bench memory, tables, mezo-cosine), defined once."""
    f = click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Where the float32 weights are cached for memory-mapping.  "
                          "[default: $TOOLCHAIN_CACHE_DIR or ~/.cache/toolchain]")(f)
    f = click.option("--threads", type=THREADS, default=1, show_default=True,
                     help="torch threads in every benchmark process (the same for every mode).")(f)
    f = click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Measured steps per memory process, and timed steps per mode (after a warm-up step).")(f)
    return f


def _step_chunk_options(f):
    """MeSP's chunk sizes and the memory workers' allocator."""
    f = click.option("--allocator", type=click.Choice(["phone-like", "glibc"]), default="phone-like", show_default=True,
                     help="malloc of the memory processes: 'phone-like' maps blocks >= 128 KiB one by one (as phone "
                          "allocators do); 'glibc' keeps glibc's defaults (peaks include heap fragmentation).")(f)
    return chunk_options()(f)


def _given(**values) -> dict:
    """The options the user set (None: left to the config's default)."""
    return {name: value for name, value in values.items() if value is not None}


def check_output_file(path: Path, option: str) -> None:
    from toolchain.atomic import check_output_file as check

    check(path, option=option)


def _progress():
    from rich.console import Console
    from rich.progress import Progress

    import sys

    return Progress(console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())


@bench.command("memory")
@model_options(default_model=None)
@lora_shape_options
@click.option("--seq-len", type=click.IntRange(min=2), default=None,
              help="Tokens per step (with --program: must be the program's).  [default: --program's, else 256]")
@click.option("--modes", default="autograd,mebp,mesp", show_default=True,
              help="Comma-separated among autograd,mebp,mesp,mesp_groups,mezo,executorch,executorch_groups,onnx,"
                   "onnx_groups (one process each for memory; *_groups: with --layers-per-checkpoint).")
@layers_per_checkpoint_option(None, default_help="round(sqrt(L)); the *_groups modes only")
@click.option("--program", type=click.Path(exists=True, file_okay=False, path_type=Path), multiple=True,
              help="Exported program directory (for --modes executorch or onnx); repeatable: each program mode runs "
                   "on every program of the same workload (e.g. its --compute fp32 and int8 exports), side by side.")
@click.option("--lr", type=FiniteFloat(min=0), default=1e-4, show_default=True, help="SGD learning rate.")
@click.option("--no-grad-check", is_flag=True, help="Skip the comparison of the exact modes' gradients.")
@click.option("--quant", type=click.Choice(["none", "int8", "int4"]), default=None,
              help="Frozen projection weights of the eager modes: float32, or the program's int8/int4 format "
                   "(dequantized per row chunk where used, as the program does).  [default: --program's, else none]")
@click.option("--quant-group", type=click.IntRange(min=2), default=None,
              help="Quantization group size.  [default: --program's, else 64]")
@click.option("--dequant-chunk-mb", type=FiniteFloat(min=0, min_open=True, max=65536), default=None,
              help="MiB (float32) dequantized at once, as `toolchain export --dequant-chunk-mb`.  "
                   "[default: --program's, else 1]")
@_step_chunk_options
@_bench_run_options
@click.option("--json", "json_out", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the report (bench_memory schema) here (an existing file is replaced).")
def memory(*, model, init, seed, rank, alpha, targets, seq_len, modes, layers_per_checkpoint, program, lr,
           no_grad_check, quant, quant_group, dequant_chunk_mb, loss_chunk, vocab_chunk, mlp_chunk, allocator, repeat, threads, cache_dir, json_out) -> None:
    """Peak memory (as phones count it) and step time of one training step per mode, side by side.
    With --program and --modes executorch/onnx, the exported program runs on its runtime through the
    host's layer loop, beside the eager modes on the same weights (--quant) and thread count."""
    from toolchain.bench.memory import MemoryBenchConfig, format_table, program_settings, run_memory_bench
    from toolchain.lora import parse_targets
    from toolchain.mesp import chunk_overrides
    from toolchain.program.spec import chunk_elems_from_mib
    from toolchain.schemas import write_json

    if json_out is not None:
        check_output_file(json_out, option="--json")
    programs, program = tuple(program), (program[0] if program else None)
    settings = {**(program_settings(program) if program is not None else {}),
                **_given(seq_len=seq_len, quant=quant, quant_group=quant_group,
                         quant_chunk_elems=None if dequant_chunk_mb is None else chunk_elems_from_mib(dequant_chunk_mb)),
                **chunk_overrides(loss_chunk=loss_chunk, vocab_chunk=vocab_chunk, mlp_chunk=mlp_chunk),
                **_given(repeat=repeat, threads=threads, cache_dir=cache_dir, allocator=allocator)}
    config = MemoryBenchConfig(model=model, init=init, seed=seed, rank=rank, alpha=alpha, targets=parse_targets(targets),
                               modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
                               lr=lr, program_dir=program, more_programs=programs[1:], check_grads=not no_grad_check,
                               layers_per_checkpoint=layers_per_checkpoint, **settings)
    with _progress() as progress:
        task = progress.add_task("bench memory", total=len(config.row_keys()) + 1)

        def on_stage(stage: str) -> None:
            progress.update(task, advance=0 if stage == "weights" else 1, description=f"bench memory: {stage}")

        doc = run_memory_bench(config, on_mode=on_stage)
    if json_out is not None:
        write_json(json_out, "bench_memory", doc)
    click.echo(f"{model} ({init}), seq {config.seq_len}, LoRA r{config.rank} on {','.join(config.targets)}, "
               f"{threads} thread(s), SGD, weights {config.quant}; peak = anonymous memory above the process baseline (MiB)")
    click.echo(format_table(doc))


@bench.command("tables")
@click.option("--cells", "cells_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("docs/benchmarks-cells.json"), show_default=True,
              help="Finished cells (bench_tables schema); read to resume, written after every cell.")
@click.option("--doc", type=click.Path(dir_okay=False, path_type=Path), default=Path("docs/benchmarks.md"),
              show_default=True, help="Markdown file whose generated section receives the tables.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=Path("docs/benchmarks.png"),
              show_default=True, help="PNG plot of the grid.")
@click.option("--only", multiple=True, help="Run only these cells (e.g. qwen2.5-0.5b/seq256/r8); repeatable.")
@click.option("--render-only", is_flag=True, help="Measure nothing: write --doc and --plot from the cached cells.")
@_step_chunk_options
@_bench_run_options
def tables(*, cells_path, doc, plot, only, render_only, loss_chunk, vocab_chunk, mlp_chunk, allocator, repeat, threads,
           cache_dir) -> None:
    """The MeSP paper's grid (0.5B/1.5B/3B; seq 128-1024; rank 4-32) for MeBP and MeSP, resumable;
    writes the tables into --doc and a plot to --plot, next to the paper's numbers."""
    from toolchain.atomic import atomic_write_text
    from toolchain.bench.memory import MemoryBenchConfig
    from toolchain.validate import read_text
    from toolchain.bench.tables import GRID, cell_key, plot_tables, render_markdown, replace_section, run_tables
    from toolchain.errors import BadInput
    from toolchain.mesp import chunk_overrides

    for option, path in (("--cells", cells_path), ("--doc", doc), ("--plot", plot)):
        check_output_file(path, option=option)
    unknown = sorted(set(only) - {cell_key(c) for c in GRID})
    if unknown:
        raise BadInput(f"unknown cell(s) {', '.join(unknown)}; choose from {', '.join(cell_key(c) for c in GRID)}")
    cells = () if render_only else tuple(c for c in GRID if not only or cell_key(c) in only)
    base = MemoryBenchConfig(**chunk_overrides(loss_chunk=loss_chunk, vocab_chunk=vocab_chunk, mlp_chunk=mlp_chunk),
                             **_given(repeat=repeat, threads=threads, cache_dir=cache_dir, allocator=allocator))
    with _progress() as progress:
        task = progress.add_task("bench tables", total=len(cells))

        current = ["bench tables"]

        def on_cell(i: int, cell, cached: bool) -> None:
            current[0] = f"bench tables: {cell_key(cell)}{' (cached)' if cached else ''}"
            progress.update(task, completed=i, description=current[0])

        def on_stage(stage: str) -> None:
            progress.update(task, description=f"{current[0]} [{stage}]")

        unreliable: list[str] = []

        def on_unreliable(cell, reasons: list[str]) -> None:
            unreliable.append(cell_key(cell))
            for reason in reasons:
                progress.console.print(f"[yellow]{cell_key(cell)} not recorded[/]: {reason}", highlight=False)

        result = run_tables(cells_path, base, cells=cells, on_cell=on_cell, on_stage=on_stage,
                            on_unreliable=on_unreliable)
    section = render_markdown(result)
    old = read_text(doc, what=f"--doc {doc}") if doc.is_file() else "# Benchmarks\n"
    atomic_write_text(doc, replace_section(old, section))
    plot_tables(result, plot)
    click.echo(section)
    click.echo(f"-> {doc}, {plot}, {cells_path}")
    if unreliable:
        raise click.ClickException(f"{len(unreliable)} cell(s) not recorded, their peaks unreliable (memory "
                                   f"pressure): {', '.join(unreliable)}; run them again with more free memory")


@bench.command("mezo-cosine")
@model_options(default_model=None)
@lora_shape_options
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True, help="Tokens of the batch.")
@click.option("--seeds", type=click.IntRange(min=1), default=8, show_default=True,
              help="MeZO estimates (perturbation seeds 0..N-1).")
@click.option("--eps", type=FiniteFloat(min=0, min_open=True, max=1), default=1e-3, show_default=True,
              help="SPSA perturbation scale.")
@click.option("--no-memory", is_flag=True, help="Skip the memory/time comparison of MeSP and MeZO.")
@_bench_run_options
@click.option("--json", "json_out", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the report (bench_mezo schema) here (an existing file is replaced).")
def mezo_cosine(*, model, init, seed, rank, alpha, targets, seq_len, seeds, eps, no_memory, repeat, threads, cache_dir,
                json_out) -> None:
    """Cosine similarity of MeZO (SPSA) gradient estimates with the exact gradient, and MeZO's peak
    memory and step time next to MeSP's."""
    from toolchain.bench.memory import format_table
    from toolchain.bench.mezo import MezoCosineConfig, run_mezo_cosine
    from toolchain.lora import parse_targets
    from toolchain.schemas import write_json

    if json_out is not None:
        check_output_file(json_out, option="--json")
    config = MezoCosineConfig(model=model, init=init, seed=seed, seq_len=seq_len, rank=rank, alpha=alpha,
                              targets=parse_targets(targets), seeds=seeds, eps=eps, memory=not no_memory,
                              **_given(repeat=repeat, threads=threads, cache_dir=cache_dir))
    with _progress() as progress:
        task = progress.add_task("bench mezo-cosine", total=seeds)
        report = run_mezo_cosine(config, on_seed=lambda s: progress.update(task, completed=s),
                                 on_stage=lambda stage: progress.update(task, description=f"memory: {stage}"))
    if json_out is not None:
        write_json(json_out, "bench_mezo", report)
    click.echo(f"{model} ({init}), seq {seq_len}, {report['n_params']} LoRA parameters, eps {eps:g}")
    click.echo("cosine(MeZO estimate, exact gradient) per seed: " + " ".join(f"{c:.5f}" for c in report["cosines"]))
    click.echo(f"mean |cosine| {report['cosine_abs_mean']:.5f}  (expected sqrt(2/(pi n)) = "
               f"{report['expected_abs_cosine']:.5f});  "
               f"cosine of the {seeds}-seed mean {report['cosine_of_mean_estimate']:.5f}")
    if report["memory"] is not None:
        click.echo(format_table(report["memory"]))
