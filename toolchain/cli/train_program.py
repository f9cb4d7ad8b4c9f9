"""`toolchain train --program DIR`: run an exported program on its runtime, exactly as an app would."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["train_with_program", "program_options"]


def program_options(f):
    f = click.option("--checkpoint-every", type=click.IntRange(min=1), default=10, show_default=True,
                     help="--program: write the resumable checkpoint every N steps (and at the end).")(f)
    f = click.option("--resume", is_flag=True, help="--program: continue from the checkpoint of an interrupted run.")(f)
    f = click.option("--telemetry-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="--program: append the run's telemetry events (JSONL) here.")(f)
    f = click.option("--program", "program", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     default=None, help="Train with this exported program (from `toolchain export`) on its runtime "
                                        "instead of the eager step; --model/LoRA/plan options then come from its manifest.")(f)
    return f


def train_with_program(program: Path, data: Path, steps: int, lr: float | None, shuffle_seed: int | None,
                       adapter_out: Path | None, telemetry_out: Path | None, resume: bool, checkpoint_every: int,
                       as_json: bool, *, plan_args: tuple = (None, None, None, None)) -> None:
    from rich.console import Console
    from rich.progress import Progress

    from toolchain.dataset import load_examples
    from toolchain.lora import save_adapter
    from toolchain.memory.measure import read_status
    from toolchain.runtime import ProgramDir, TrainRun, run_program
    from toolchain.runtime.runners import open_runner
    from toolchain.schemas import dumps

    from toolchain.cli.train import resolve_plan

    pdir = ProgramDir(program)
    examples = load_examples(data, pdir.arch)
    lr = lr if lr is not None else pdir.info.default_lr
    plan_path, lcsb_k, lcsb_policy, lcsb_seed = plan_args
    if any(a is not None for a in plan_args):
        plan = resolve_plan(plan_path, lcsb_k, lcsb_policy, lcsb_seed, pdir.arch.layers)
    else:
        plan = pdir.default_plan()
    if plan is not None and plan.policy == "full":
        plan = None
    checkpoint = Path(str(adapter_out or program).rstrip("/") + ".train-checkpoint.safetensors")
    if resume and not checkpoint.exists():
        raise click.UsageError(f"--resume: no checkpoint at {checkpoint}")
    runner = open_runner(pdir)
    run = TrainRun(steps=steps, lr=lr, shuffle_seed=shuffle_seed, checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, resume=resume, telemetry=telemetry_out, plan=plan)
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(f"train ({runner.backend})", total=steps)

        def on_step(step: int, loss: float) -> None:
            progress.update(task, completed=step + 1, description=f"train ({runner.backend}) loss {loss:.4f}")

        result = run_program(pdir, runner, examples, run, on_step=on_step)
    peak_mb = read_status().vm_hwm / 2**20
    if adapter_out is not None:
        save_adapter(adapter_out, pdir.lora_config, pdir.lora_from_state(result.state),
                     base_model=pdir.manifest["model"]["source"])
    if as_json:
        click.echo(dumps({"losses": result.losses, "final_loss": result.losses[-1], "run_id": result.run_id,
                          "program": str(program), "adapter_out": None if adapter_out is None else str(adapter_out),
                          "process_peak_rss_mb": round(peak_mb, 1)}), nl=False)
        return
    for i, loss in enumerate(result.losses):
        layers = "all" if plan is None else ",".join(map(str, plan.layers_at(i)))
        click.echo(f"step {i:4d}  loss {loss:.4f}  layers {layers}")
    click.echo(f"process peak RSS {peak_mb:.1f} MB (includes Python and the runtime; see `toolchain bench memory`)")
    if adapter_out is not None:
        click.echo(f"adapter -> {adapter_out}")
