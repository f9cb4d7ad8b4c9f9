"""`toolchain train --program DIR`: run an exported program on its runtime, exactly as an app would;
and what both modes of `toolchain train` share (progress bar, report)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["train_with_program", "program_options", "progress_run", "report"]


def program_options(f):
    f = click.option("--eval-every", type=click.IntRange(min=1), default=None,
                     help="--program with --eval-data: evaluate every N steps (default: 10% of --steps), before the "
                          "first and after the last.")(f)
    f = click.option("--eval-data", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="--program: held-out rows (JSONL); their loss (the live adapter, forward only on the "
                          "program's methods) is printed and logged as `eval` telemetry events.")(f)
    f = click.option("--checkpoint-every", type=click.IntRange(min=1), default=10, show_default=True,
                     help="Write the resumable checkpoint every N steps (and at the end).")(f)
    f = click.option("--resume", is_flag=True,
                     help="Continue from the checkpoint of an interrupted run (same program or model, data, lr, "
                          "optimizer, --shuffle and plan; else an error names the difference); its --adapter-out "
                          "is then replaced without --force.")(f)
    f = click.option("--telemetry-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Append the run's telemetry events (JSONL) here.")(f)
    f = click.option("--program", "program", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     default=None, help="Train with this exported program (from `toolchain export`) on its runtime "
                                        "instead of the eager step; model, LoRA config and optimizer then come from "
                                        "its manifest (--model/--rank/--optimizer/... are refused).")(f)
    return f


def progress_run(trainer, description: str, steps: int, *, after_start=None, after_step=None):
    """`trainer.run()` under a progress bar on stderr (resume checks first, so errors come without one).
    `after_start()` runs once the run is set up (telemetry open), `after_step(entry)` after every step."""
    from rich.console import Console
    from rich.progress import Progress

    trainer.start()
    if after_start is not None:
        after_start()
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=steps)

        def on_step(entry) -> None:
            progress.update(task, completed=entry.step, description=f"{description} loss {entry.loss:.4f}")
            if after_step is not None:
                after_step(entry)

        return trainer.run(on_step=on_step)


def report(result, as_json: bool, *, plan, optimizer, adapter_out: Path | None, **extra) -> None:
    """The run's steps and result on stdout (text or --json), the same for both modes."""
    from toolchain.schemas import dumps

    if as_json:
        click.echo(dumps({"steps": [entry._asdict() for entry in result.log], "losses": list(result.losses),
                          "final_loss": result.final_loss, "run_id": result.run_id,
                          "plan": None if plan is None else plan.to_dict(), "optimizer": optimizer.to_dict(),
                          "adapter_out": None if adapter_out is None else str(adapter_out), **extra}), nl=False)
        return
    for entry in result.log:
        click.echo(f"step {entry.step:4d}  loss {entry.loss:.4f}  layers {_span(entry.layers)}")
    if "process_peak_rss_mb" in extra:
        click.echo(f"process peak RSS {extra['process_peak_rss_mb']:.1f} MB (includes Python and the runtime; "
                   f"see `toolchain bench memory`)")
    if adapter_out is not None:
        click.echo(f"adapter -> {adapter_out}")


def _span(layers: tuple[int, ...]) -> str:
    """1,2,3,7 -> '1-3,7'."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def check_outputs(adapter_out: Path | None, telemetry_out: Path | None, *, force: bool, resume: bool) -> None:
    """Before any work: --adapter-out must be new or empty (or --force; --resume replaces the adapter of
    the run it continues), --telemetry-out a writable file path."""
    from toolchain.atomic import check_output_dir, check_output_file

    if adapter_out is not None:
        check_output_dir(adapter_out, force=force or resume, option="--adapter-out")
    if telemetry_out is not None:
        check_output_file(telemetry_out, option="--telemetry-out", streams=True)


def train_with_program(program: Path, data: Path, *, plan, lr: float | None, adapter_out: Path | None,
                       as_json: bool, force: bool, eval_data: Path | None, eval_every: int | None, steps: int,
                       shuffle_seed: int | None, checkpoint_every: int, resume: bool, telemetry: Path | None,
                       layers_per_checkpoint: int = 1) -> None:
    """`toolchain train --program`: `plan` is the `PlanRequest` of the plan options (nothing given: the plan
    recorded at export)."""
    import dataclasses

    from toolchain.dataset import load_examples
    from toolchain.errors import BadInput
    from toolchain.lora import save_adapter
    from toolchain.memory.measure import read_status, reset_peak
    from toolchain.runtime import ProgramDir
    from toolchain.runtime.runners import open_runner
    from toolchain.training import ProgramTrainer, TrainRun, checkpoint_path
    from toolchain.training.program import runtime_baseline

    check_outputs(adapter_out, telemetry, force=force, resume=resume)
    from toolchain.runtime.mapped_guard import guard_program

    pdir = ProgramDir(program)
    guard_program(pdir)                   # a SIGBUS from the mapped weights is one Error: line
    examples = load_examples(data, pdir.arch)
    lr = lr if lr is not None else pdir.info.default_lr
    step_plan = plan.resolve_lcsb(pdir.arch.layers) if plan.given else pdir.default_plan()
    if step_plan is not None and step_plan.policy == "full":
        step_plan = None
    checkpoint = checkpoint_path(adapter_out or program)
    if resume and not checkpoint.exists():
        raise BadInput(f"--resume: no checkpoint at {checkpoint}")
    baseline = runtime_baseline(pdir, None) if telemetry is not None else None  # before the program is loaded
    if baseline is not None:
        reset_peak()                      # the steps' peak_bytes count from the loaded-runtime baseline on
    runner = open_runner(pdir)
    run = TrainRun(steps=steps, lr=lr, shuffle_seed=shuffle_seed, checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, resume=resume, telemetry=telemetry, plan=step_plan,
                   layers_per_checkpoint=layers_per_checkpoint)
    trainer = ProgramTrainer(pdir, runner, examples, run)
    trainer.baseline, trainer.memory_peak = baseline, baseline is not None   # the report's like-for-like planner check
    hooks = {} if eval_data is None else _eval_hooks(pdir, trainer, load_examples(eval_data, pdir.arch), steps,
                                                     eval_every, fresh=not (resume and checkpoint.exists()))
    result = progress_run(trainer, f"train ({runner.backend})", steps, **hooks)
    evals = hooks["after_step"].evals if hooks else None
    peak_mb = read_status().vm_hwm / 2**20
    if adapter_out is not None:
        save_adapter(adapter_out, pdir.lora_config, result.lora, base_model=pdir.manifest.model.source)
    report(result, as_json, plan=step_plan, optimizer=dataclasses.replace(pdir.info.optimizer, lr=lr),
           adapter_out=adapter_out, program=str(program), process_peak_rss_mb=round(peak_mb, 1),
           **({} if evals is None else {"evals": evals}))


def _eval_hooks(pdir, trainer, held, steps: int, every: int | None, *, fresh: bool) -> dict:
    """Held-out loss of the live state (trainer.state, through the training runner's embed / block_forward /
    head_loss) before the first step (a fresh run), every `every` steps and after the last; each one an
    `eval` telemetry event and a line on stderr."""
    import time

    from toolchain.runtime.evaluate import evaluate_program
    from toolchain.training.checkpoint import finite_or_none

    every = every or max(1, steps // 10)

    def run_eval(step: int) -> None:
        t0 = time.perf_counter()
        ev = evaluate_program(pdir, None, trainer.state, held, loop=trainer.loop)
        dt = time.perf_counter() - t0
        trainer.emit("eval", step=step, loss=finite_or_none(ev["loss"]), rows=ev["rows"], tokens=ev["tokens"],
                     eval_time_s=round(dt, 6))
        after_step.evals.append({"step": step, "loss": ev["loss"], "rows": ev["rows"], "tokens": ev["tokens"]})
        click.echo(f"eval after {step} steps: held-out loss {ev['loss']:.4f} ({ev['tokens']} tokens)", err=True)

    def after_step(entry) -> None:
        if entry.step % every == 0 or entry.step == steps:
            run_eval(entry.step)

    after_step.evals = []
    return {"after_start": (lambda: run_eval(0)) if fresh else None, "after_step": after_step}
