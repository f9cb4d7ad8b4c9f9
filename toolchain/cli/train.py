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

from toolchain.cli.options import (data_option, force_option, layers_per_checkpoint_option, lora_options,
                                   model_options, optimizer_options, plan_options, plan_request)
from toolchain.cli.train_program import (DEFAULT_TRAIN_STEPS, check_outputs, program_options, progress_run, report,
                                         train_program_dpo, train_with_program)
from toolchain.validate import SEED, STEPS, FiniteFloat

# Options that only eager training uses: --program takes them from its manifest.
EAGER_ONLY = ("model", "init", "seed", "adapter", "rank", "alpha", "targets", "optimizer", "weight_decay", "momentum",
              "frozen_unselected")


def _given(ctx: click.Context, names) -> list[str]:
    """The options among `names` the user set (not left at their default), as they are spelled."""
    from click.core import ParameterSource

    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return [flags[n] for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)]


@click.command()
@model_options(default_model=None, required=False)
@lora_options
@data_option
@click.option("--steps", type=STEPS, default=None,
              help="Training steps (batch 1).  [default: 100; --program: the manifest's defaults.steps, else 100]")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Learning rate.  [default: 1e-4; --program: the manifest's default_lr]")
@optimizer_options("adamw")
@plan_options("full backprop; --program: the plan recorded at export, else full backprop")
@layers_per_checkpoint_option()
@click.option("--shuffle", "shuffle_seed", type=SEED, default=None, metavar="SEED",
              help="Visit rows in a seeded random order, a new permutation per pass (default: file order, cycling).")
@click.option("--adapter-out", type=click.Path(file_okay=False, writable=True, path_type=Path), default=None,
              help="Write the trained adapter here (PEFT format); the resumable checkpoint goes next to it "
                   "(DIR.train-checkpoint.safetensors).")
@force_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--objective", type=click.Choice(["sft", "dpo"]), default="sft", show_default=True,
              help="sft: --data holds rows (next-token cross-entropy); dpo: --data holds preference pairs (schema "
                   "preference_pair, e.g. from `data --feedback --pairs-out`), DPO loss against the base model; "
                   "--eval-data then holds held-out pairs, and the gate compares their DPO loss.")
@click.option("--beta", type=FiniteFloat(min=0, min_open=True), default=None,
              help="DPO temperature (> 0; --objective dpo).  [default: 0.1]")
@click.option("--sft-data", "sft_data", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="--objective dpo: SFT rows mixed into the run (steps visit the pairs, then these rows).")
@click.option("--dpo-weight", "dpo_weight", type=FiniteFloat(min=0, min_open=True), default=None,
              help="--objective dpo: a DPO step's loss weight relative to an SFT step's (1).  [default: 1]")
@program_options
@click.pass_context
def train(ctx, *, model, init, seed, adapter, rank, alpha, targets, data, steps, lr, optimizer, weight_decay, momentum,
          plan_path, lcsb_k, lcsb_policy, lcsb_seed, lcsb_warmup, layers_per_checkpoint, frozen_unselected, shuffle_seed,
          adapter_out, force, as_json, objective, beta, sft_data, dpo_weight, program, telemetry_out, resume,
          checkpoint_every, eval_data, eval_every, no_gate, memory_budget) -> None:
    """Train a LoRA adapter on --data with eager MeSP steps, optionally LCSB (--plan or --lcsb-k);
    or, with --program DIR, run an exported program on its runtime exactly as the apps do (model,
    LoRA config and optimizer then come from the program's manifest; the LCSB layers are chosen at run
    time: --plan/--lcsb-k, else the plan recorded at export, else full backprop). --resume continues
    an interrupted run from its checkpoint, which must be of the same program or model, data, lr,
    optimizer, --shuffle and plan. One run at a time holds a --adapter-out (a lock beside its checkpoint)."""
    import contextlib

    from toolchain.outputs import run_lock
    from toolchain.training.checkpoint import checkpoint_path

    # One run per checkpoint (and so per --adapter-out) at a time: a second one is refused at once.
    base = adapter_out if adapter_out is not None else program
    lock = None if base is None else run_lock(base, option="--adapter-out" if adapter_out is not None else "--program",
                                              lock_file=checkpoint_path(base).with_suffix(".lock"))
    with lock or contextlib.nullcontext() as held:
        if held is not None:
            from toolchain.runtime.mapped_guard import remove_on_fault

            remove_on_fault(held)     # a run ended by a SIGBUS (mapped weights truncated) leaves no lock file
        _train(ctx, **ctx.params)


def _train(ctx, *, model, init, seed, adapter, rank, alpha, targets, data, steps, lr, optimizer, weight_decay,
           momentum, plan_path, lcsb_k, lcsb_policy, lcsb_seed, lcsb_warmup, layers_per_checkpoint, frozen_unselected,
           shuffle_seed, adapter_out, force, as_json, objective, beta, sft_data, dpo_weight, program, telemetry_out,
           resume, checkpoint_every, eval_data, eval_every, no_gate, memory_budget) -> None:
    from toolchain.errors import BadInput

    if objective == "sft":
        dpo_only = _given(ctx, ["beta", "sft_data", "dpo_weight"])
        if dpo_only:
            raise BadInput(f"{', '.join(dpo_only)} go with --objective dpo")
    dpo = None if objective == "sft" else dict(beta=0.1 if beta is None else beta, sft_data=sft_data,
                                               dpo_weight=1.0 if dpo_weight is None else dpo_weight)

    plan = plan_request(plan_path, lcsb_k, lcsb_policy, lcsb_seed, lcsb_warmup)
    run = dict(steps=steps, shuffle_seed=shuffle_seed, checkpoint_every=checkpoint_every, resume=resume,
               telemetry=telemetry_out, layers_per_checkpoint=layers_per_checkpoint, memory_budget=memory_budget)
    if eval_every is not None and eval_data is None:
        raise BadInput("--eval-every needs --eval-data (the held-out rows it evaluates)")
    if no_gate and eval_data is None:
        raise BadInput("--no-gate needs --eval-data (without held-out rows there is no gate to turn off)")
    if program is not None:
        ignored = _given(ctx, EAGER_ONLY)
        if ignored:
            raise BadInput(f"--program takes the model, LoRA config and optimizer from its manifest; "
                           f"drop {', '.join(ignored)}")
        if dpo is not None:
            train_program_dpo(program, data, dpo=dpo, plan=plan, lr=lr, adapter_out=adapter_out, as_json=as_json,
                              force=force, eval_data=eval_data, eval_every=eval_every, no_gate=no_gate, **run)
            return
        train_with_program(program, data, plan=plan, lr=lr, adapter_out=adapter_out, as_json=as_json, force=force,
                           eval_data=eval_data, eval_every=eval_every, no_gate=no_gate, **run)
        return
    if model is None:
        raise BadInput("give --model (eager training) or --program (an exported program)")
    if adapter_out is None and (resume or _given(ctx, ["checkpoint_every"])):
        raise BadInput(f"{'--resume' if resume else '--checkpoint-every'} needs --adapter-out: eager training "
                       f"keeps its checkpoint next to the adapter")
    from toolchain.optim import optimizer_config

    run["steps"] = DEFAULT_TRAIN_STEPS if steps is None else steps
    opt = optimizer_config(optimizer, lr=1e-4 if lr is None else lr, weight_decay=weight_decay, momentum=momentum,
                           frozen_unselected=frozen_unselected)
    check_outputs(adapter_out, telemetry_out, force=force, resume=resume)
    load = dict(model=model, init=init, seed=seed, adapter=adapter, rank=rank, alpha=alpha, targets=targets)
    _train_eager(data, load=load, optimizer=opt, plan=plan, adapter_out=adapter_out, replace=force or resume,
                 as_json=as_json, dpo=dpo, eval_data=eval_data, eval_every=eval_every, no_gate=no_gate, **run)


def _train_eager(data: Path, *, load: dict, optimizer, plan, adapter_out: Path | None, replace: bool, as_json: bool,
                 steps: int, shuffle_seed: int | None, checkpoint_every: int, resume: bool, telemetry: Path | None,
                 layers_per_checkpoint: int, eval_data: Path | None, eval_every: int | None, no_gate: bool,
                 memory_budget: float | None, dpo: dict | None = None) -> None:
    """Eager training; `load` holds the arguments of `load_model_and_adapter`."""
    from toolchain.text.dataset import load_examples
    from toolchain.errors import BadInput
    from toolchain.lora import save_adapter
    from toolchain.lora.resolve import load_model_and_adapter
    from toolchain.cli.train_program import budget_bytes, echo_eval, gate_off
    from toolchain.contract import HELD_OUT_EVAL_ROWS
    from toolchain.training import EagerTrainer, TrainRun, checkpoint_path
    from toolchain.training.gate import Evaluation

    checkpoint = None if adapter_out is None else checkpoint_path(adapter_out)
    if resume and not checkpoint.exists():
        raise BadInput(f"--resume: no checkpoint at {checkpoint}")
    name = load["model"]
    arch, weights, cfg, lora = load_model_and_adapter(**load)
    step_plan = plan.resolve(arch.layers)
    if eval_data is None:
        held = None
    elif dpo is None:
        held = load_examples(eval_data, arch)[:HELD_OUT_EVAL_ROWS]
    else:                     # held-out pairs: the gate's loss is their DPO loss (training/preference.py)
        from toolchain.training.preference import load_pairs

        held = load_pairs(eval_data, arch, weights, cfg, lora)[:HELD_OUT_EVAL_ROWS]
    config = TrainRun(steps=steps, optimizer=optimizer, plan=step_plan, shuffle_seed=shuffle_seed,
                      checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume, telemetry=telemetry,
                      layers_per_checkpoint=layers_per_checkpoint, memory_budget_bytes=budget_bytes(memory_budget))
    if dpo is None:
        trainer = EagerTrainer(arch, weights, cfg, lora, load_examples(data, arch), config, model_name=Path(name).name)
    else:
        from toolchain.training.preference import PreferenceTrainer, load_pairs

        rows = [] if dpo["sft_data"] is None else load_examples(dpo["sft_data"], arch)
        trainer = PreferenceTrainer(arch, weights, cfg, lora, load_pairs(data, arch, weights, cfg, lora), rows, config,
                                    beta=dpo["beta"], dpo_weight=dpo["dpo_weight"], model_name=Path(name).name)
    if held is not None:        # eager runs have no program, so no forgetting probe
        trainer.evaluation = Evaluation(held, every=eval_every or max(1, steps // 10), gate=not no_gate,
                                        on_eval=echo_eval)
    result = progress_run(trainer, f"train ({step_plan.policy})", steps)
    if adapter_out is not None:
        save_adapter(adapter_out, cfg, result.lora, base_model=None if load["init"] == "random" else name,
                     replace=replace)
    report(result, as_json, plan=step_plan, optimizer=optimizer, adapter_out=adapter_out,
           gate_off=gate_off(eval_data, no_gate), **({} if held is None else {"evals": trainer.evaluation.points}))
