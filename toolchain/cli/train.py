"""`toolchain train`: train a LoRA adapter on the host, with eager PyTorch MeSP steps (optional LCSB
plan), or with `--program DIR` an exported program on its runtime exactly as the apps run it.

Both modes run the same loop (toolchain/training): same row order, checkpoints, `--resume` (verified
against this run's settings) and telemetry. The command resolves and validates every input before any
work (an option the chosen mode does not use is an error, not ignored), runs the steps with a progress
bar, then reports and saves.
"""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import data_option, force_option, load_model_and_adapter, lora_options, model_options
from toolchain.validate import STEPS, FiniteFloat
from toolchain.cli.train_program import check_outputs, program_options, progress_run, report, train_with_program

# Options that only eager training uses: --program takes them from its manifest.
EAGER_ONLY = ("model", "init", "seed", "adapter", "rank", "alpha", "targets", "optimizer", "weight_decay", "momentum",
              "frozen_unselected")


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
    if seed is not None and policy != "random":
        raise BadInput(f"--lcsb-seed applies to --lcsb-policy random, not {policy}; drop it or choose random")
    return make_plan(layers, k, policy, seed=seed if policy == "random" else None)


def optimizer_from(name: str, lr: float, weight_decay: float | None, momentum: float, frozen_unselected: bool):
    from toolchain.errors import BadInput
    from toolchain.optim import OptimizerConfig

    if name == "adamw" and momentum:
        raise BadInput("--momentum applies to --optimizer sgd (AdamW has beta1 = 0.9)")
    default_wd = 0.01 if name == "adamw" else 0.0
    return OptimizerConfig(name, lr=lr, momentum=momentum, frozen_unselected=frozen_unselected,
                           weight_decay=default_wd if weight_decay is None else weight_decay)


def _given(ctx: click.Context, names) -> list[str]:
    """The options among `names` the user set (not left at their default), as they are spelled."""
    from click.core import ParameterSource

    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return [flags[n] for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)]


@click.command()
@model_options(default_model=None, required=False)
@lora_options
@data_option
@click.option("--steps", type=STEPS, default=100, show_default=True, help="Training steps (batch 1).")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Learning rate.  [default: 1e-4; --program: the manifest's default_lr]")
@click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True,
              help="Eager only (a program has its optimizer built in).")
@click.option("--weight-decay", type=FiniteFloat(min=0), default=None,
              help="AdamW: decoupled decay; SGD: L2 added to the gradient.  [default: 0.01 adamw, 0 sgd]")
@click.option("--momentum", type=FiniteFloat(min=0, max=1, max_open=True), default=0.0, show_default=True,
              help="SGD momentum.")
@plan_options
@click.option("--frozen-unselected", is_flag=True,
              help="Leave layers outside a step's selection untouched (default: zero-gradient update, so "
                   "momentum and weight decay still move them, as in the LCSB paper).")
@click.option("--shuffle", "shuffle_seed", type=int, default=None, metavar="SEED",
              help="Visit rows in a seeded random order, a new permutation per pass (default: file order, cycling).")
@click.option("--adapter-out", type=click.Path(file_okay=False, writable=True, path_type=Path), default=None,
              help="Write the trained adapter here (PEFT format); the resumable checkpoint goes next to it "
                   "(DIR.train-checkpoint.safetensors).")
@force_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@program_options
@click.pass_context
def train(ctx, model, init, seed, adapter, rank, alpha, targets, data, steps, lr, optimizer, weight_decay, momentum,
          plan_path, lcsb_k, lcsb_policy, lcsb_seed, frozen_unselected, shuffle_seed, adapter_out, force, as_json,
          program, telemetry_out, resume, checkpoint_every, eval_data, eval_every) -> None:
    """Train a LoRA adapter on --data with eager MeSP steps, optionally LCSB (--plan or --lcsb-k);
    or, with --program DIR, run an exported program on its runtime exactly as the apps do (model,
    LoRA config and optimizer then come from the program's manifest; the LCSB layers are chosen at run
    time: --plan/--lcsb-k, else the plan recorded at export, else full backprop). --resume continues
    an interrupted run from its checkpoint, which must be of the same program or model, data, lr,
    optimizer, --shuffle and plan."""
    from toolchain.errors import BadInput

    plan_args = (plan_path, lcsb_k, lcsb_policy, lcsb_seed)
    if program is not None:
        ignored = _given(ctx, EAGER_ONLY)
        if ignored:
            raise BadInput(f"--program takes the model, LoRA config and optimizer from its manifest; "
                                   f"drop {', '.join(ignored)}")
        train_with_program(program, data, steps, lr, shuffle_seed, adapter_out, telemetry_out, resume,
                           checkpoint_every, as_json, plan_args=plan_args, force=force, eval_data=eval_data,
                           eval_every=eval_every)
        return
    if eval_data is not None or eval_every is not None:
        raise BadInput("--eval-data / --eval-every need --program (held-out loss on the program's methods)")
    if model is None:
        raise BadInput("give --model (eager training) or --program (an exported program)")
    if adapter_out is None and (resume or _given(ctx, ["checkpoint_every"])):
        raise BadInput(f"{'--resume' if resume else '--checkpoint-every'} needs --adapter-out: eager training "
                               f"keeps its checkpoint next to the adapter")
    opt = optimizer_from(optimizer, 1e-4 if lr is None else lr, weight_decay, momentum, frozen_unselected)
    check_outputs(adapter_out, telemetry_out, force=force, resume=resume)
    _train_eager(model, init, seed, adapter, rank, alpha, targets, data, steps, opt, plan_args, shuffle_seed,
                 adapter_out, telemetry_out, resume, checkpoint_every, as_json)


def _train_eager(model, init, seed, adapter, rank, alpha, targets, data, steps, opt, plan_args, shuffle_seed,
                 adapter_out, telemetry_out, resume, checkpoint_every, as_json) -> None:
    from toolchain.dataset import load_examples
    from toolchain.lora import save_adapter
    from toolchain.errors import BadInput
    from toolchain.training import EagerTrainer, TrainConfig, checkpoint_path

    checkpoint = None if adapter_out is None else checkpoint_path(adapter_out)
    if resume and not checkpoint.exists():
        raise BadInput(f"--resume: no checkpoint at {checkpoint}")
    arch, weights, cfg, lora = load_model_and_adapter(model, init, seed, adapter, rank, alpha, targets)
    examples = load_examples(data, arch)
    step_plan = resolve_plan(*plan_args, arch.layers)
    config = TrainConfig(steps=steps, optimizer=opt, plan=step_plan, shuffle_seed=shuffle_seed, checkpoint=checkpoint,
                         checkpoint_every=checkpoint_every, resume=resume, telemetry=telemetry_out)
    trainer = EagerTrainer(arch, weights, cfg, lora, examples, config, model_name=Path(model).name)
    result = progress_run(trainer, f"train ({step_plan.policy})", steps)
    if adapter_out is not None:
        save_adapter(adapter_out, cfg, result.lora, base_model=None if init == "random" else model)
    report(result, as_json, plan=step_plan, optimizer=opt, adapter_out=adapter_out)
