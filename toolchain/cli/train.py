"""`toolchain train`: train a LoRA adapter on the host (eager PyTorch MeSP steps, optional LCSB plan).

The command is three parts so that other ways of running the step (an exported program) slot in as
another `_run_*` next to `_run_eager`: resolve the inputs (model, adapter, data, plan, optimizer)
and validate them all before any work; run the steps with a progress bar; report and save.
"""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import data_option, load_model_and_adapter, lora_options, model_options
from toolchain.cli.train_program import program_options, train_with_program


def plan_options(f):
    """--plan FILE, or --lcsb-k/--lcsb-policy/--lcsb-seed to build one on the fly (neither: full backprop)."""
    f = click.option("--lcsb-seed", type=int, default=None, help="Seed of the random LCSB policy.  [default: 0]")(f)
    f = click.option("--lcsb-policy", type=click.Choice(["cyclic", "strided", "last", "random", "full"]),
                     default=None, help="LCSB policy for --lcsb-k.  [default: cyclic]")(f)
    f = click.option("--lcsb-k", type=click.IntRange(min=1), default=None,
                     help="Backpropagate through K layers per step (LCSB).")(f)
    f = click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None, help="LCSB step plan JSON (toolchain plan lcsb). Default: full backprop.")(f)
    return f


def resolve_plan(plan_path: Path | None, k: int | None, policy: str | None, seed: int | None, layers: int):
    """The step plan the options ask for, checked against the model's layer count."""
    from toolchain.errors import BadInput
    from toolchain.lcsb import make_plan, read_plan

    if plan_path is not None and (k is not None or policy is not None or seed is not None):
        raise BadInput("--plan and --lcsb-k/--lcsb-policy/--lcsb-seed are exclusive; give one or the other")
    if plan_path is not None:
        step_plan = read_plan(plan_path)
        step_plan.check_layers(layers, where=f"plan {plan_path}")
        return step_plan
    policy = policy or ("cyclic" if k is not None else "full")
    return make_plan(layers, k, policy, seed=seed if policy == "random" else None)


def optimizer_from(name: str, lr: float, weight_decay: float | None, momentum: float):
    from toolchain.errors import BadInput
    from toolchain.lcsb import SGD, AdamW

    if name == "adamw":
        if momentum:
            raise BadInput("--momentum applies to --optimizer sgd (AdamW has beta1 = 0.9)")
        return AdamW(lr=lr, weight_decay=0.01 if weight_decay is None else weight_decay)
    return SGD(lr=lr, momentum=momentum, weight_decay=weight_decay or 0.0)


def _run_eager(arch, weights, cfg, lora, examples, config, description: str):
    from rich.console import Console
    from rich.progress import Progress

    from toolchain.train import train as train_loop

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=config.steps)

        def on_step(entry) -> None:
            progress.update(task, advance=1, description=f"{description} loss {entry.loss:.4f}")

        return train_loop(arch, weights, cfg, lora, examples, config, on_step=on_step)


@click.command()
@model_options(default_model=None, required=False)
@lora_options
@data_option
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True, help="Training steps (batch 1).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Learning rate.  [default: 1e-4; --program: the manifest's default_lr]")
@click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True)
@click.option("--weight-decay", type=click.FloatRange(min=0), default=None,
              help="AdamW: decoupled decay; SGD: L2 added to the gradient.  [default: 0.01 adamw, 0 sgd]")
@click.option("--momentum", type=click.FloatRange(min=0, max=1, max_open=True), default=0.0, show_default=True,
              help="SGD momentum.")
@plan_options
@click.option("--frozen-unselected", is_flag=True,
              help="Leave layers outside a step's selection untouched (default: zero-gradient update, so "
                   "momentum and weight decay still move them, as in the LCSB paper).")
@click.option("--shuffle", "shuffle_seed", type=int, default=None, metavar="SEED",
              help="Visit rows in a seeded random order (default: file order, cycling).")
@click.option("--adapter-out", type=click.Path(file_okay=False, writable=True, path_type=Path), default=None,
              help="Write the trained adapter here (PEFT format).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@program_options
def train(model, init, seed, adapter, rank, alpha, targets, data, steps, lr, optimizer, weight_decay, momentum,
          plan_path, lcsb_k, lcsb_policy, lcsb_seed, frozen_unselected, shuffle_seed, adapter_out, as_json,
          program, telemetry_out, resume, checkpoint_every) -> None:
    """Train a LoRA adapter on --data with eager MeSP steps, optionally LCSB (--plan or --lcsb-k);
    or, with --program DIR, run an exported program on its runtime exactly as the apps do (model,
    LoRA config and optimizer then come from the program's manifest; the LCSB layers are chosen at run
    time: --plan/--lcsb-k, else the plan recorded at export, else full backprop)."""
    if program is not None:
        if model is not None or adapter is not None:
            raise click.UsageError("--program takes its model and adapter from its manifest; drop --model/--adapter")
        train_with_program(program, data, steps, lr, shuffle_seed, adapter_out, telemetry_out, resume,
                           checkpoint_every, as_json, plan_args=(plan_path, lcsb_k, lcsb_policy, lcsb_seed))
        return
    if model is None:
        raise click.UsageError("give --model (eager training) or --program (an exported program)")
    lr = 1e-4 if lr is None else lr
    from toolchain.dataset import load_examples
    from toolchain.lora import save_adapter
    from toolchain.schemas import dumps
    from toolchain.train import TrainConfig

    opt = optimizer_from(optimizer, lr, weight_decay, momentum)
    arch, weights, cfg, lora = load_model_and_adapter(model, init, seed, adapter, rank, alpha, targets)
    examples = load_examples(data, arch)
    step_plan = resolve_plan(plan_path, lcsb_k, lcsb_policy, lcsb_seed, arch.layers)
    config = TrainConfig(steps=steps, optimizer=opt, plan=step_plan, frozen_unselected=frozen_unselected,
                         shuffle_seed=shuffle_seed)
    result = _run_eager(arch, weights, cfg, lora, examples, config, f"train ({step_plan.policy})")
    if adapter_out is not None:
        save_adapter(adapter_out, cfg, result.lora, base_model=None if init == "random" else model)
    if as_json:
        click.echo(dumps({"steps": [entry._asdict() for entry in result.log], "final_loss": result.log[-1].loss,
                          "plan": step_plan.to_dict(), "optimizer": {"name": optimizer, **opt.__dict__},
                          "adapter_out": None if adapter_out is None else str(adapter_out)}), nl=False)
        return
    for entry in result.log:
        click.echo(f"step {entry.step:4d}  loss {entry.loss:.4f}  layers {_span(entry.layers)}")
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
