"""`toolchain train --program DIR`: run an exported program on its runtime, exactly as an app would;
and what both modes of `toolchain train` share (progress bar, report)."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import verbose_requested
from toolchain.validate import FiniteFloat

__all__ = ["train_with_program", "train_program_dpo", "program_options", "progress_run", "ProgressBar", "report",
           "DEFAULT_TRAIN_STEPS", "gate_off", "budget_bytes", "echo_eval"]

# `toolchain train --steps` when none is given and the program records no `defaults.steps` (eager training, older programs)
DEFAULT_TRAIN_STEPS = 100


def program_options(f):
    f = click.option("--memory-budget", "memory_budget", type=FiniteFloat(min=0, min_open=True), default=None,
                     metavar="MIB",
                     help="Anonymous-memory budget in MiB (what a phone counts): after a step whose peak is over it, "
                          "the next steps run with a smaller working set (checkpoint groups, then LCSB layers per "
                          "step, then eager rows' length: docs/training.md), each change a `memory_adapted` event; "
                          "the run stops (checkpoint saved) only when nothing smaller is left.")(f)
    f = click.option("--no-gate", "no_gate", is_flag=True,
                     help="Keep the last adapter whatever its held-out loss (the gate is on with --eval-data: the "
                          "last adapter is kept only if it beats the starting one, else the best evaluated one, "
                          "else the starting one is restored; docs/training.md).")(f)
    f = click.option("--eval-every", type=click.IntRange(min=1), default=None,
                     help="With --eval-data: evaluate every N steps (default: 10% of --steps), before the "
                          "first and after the last.")(f)
    f = click.option("--eval-data", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="Held-out rows (JSONL, the first 32 used; --objective dpo: held-out preference pairs, "
                          "their mean DPO loss); their loss (the live adapter, forward only; "
                          "--program: on the program's methods) is printed and logged as `eval` telemetry events, and "
                          "the evaluation gate decides which adapter the run keeps.")(f)
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


class ProgressBar:
    """A progress bar of `steps` steps on stderr, shown while the context is open; `update(entry)` after
    each step (the step's loss in the description)."""

    def __init__(self, description: str, steps: int) -> None:
        self.description, self.steps = description, steps
        self._progress = self._task = None

    def __enter__(self) -> ProgressBar:
        from rich.console import Console
        from rich.progress import Progress

        import sys

        # no bar when stderr is not a terminal: rich's transient bar still leaves a newline there when it clears
        self._progress = Progress(console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
        self._progress.__enter__()
        self._task = self._progress.add_task(self.description, total=self.steps)
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)
        self._progress = None

    def update(self, entry) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=entry.step,
                                  description=f"{self.description} loss {entry.loss:.4f}")


def progress_run(trainer, description: str, steps: int):
    """`trainer.run()` under a progress bar on stderr (resume checks first, so errors come without one)."""
    trainer.start()
    with ProgressBar(description, steps) as bar:
        return trainer.run(on_step=bar.update)


def report(result, as_json: bool, *, plan, optimizer, adapter_out: Path | None, gate_off: str | None = None,
           **extra) -> None:
    """The run's steps and result on stdout (text or --json), the same for both modes: the steps, the memory
    adaptations, the gate's decision (or why there is none: `gate_off`)."""
    from toolchain.schemas import dumps

    gate = getattr(result, "gate", None)
    adaptations = list(getattr(result, "adaptations", ()))
    if as_json:
        click.echo(dumps({"steps": [entry._asdict() for entry in result.log], "losses": list(result.losses),
                          "final_loss": result.final_loss, "run_id": result.run_id,
                          "plan": None if plan is None else plan.to_dict(), "optimizer": optimizer.to_dict(),
                          "adapter_out": None if adapter_out is None else str(adapter_out),
                          "gate": None if gate is None else gate.event_fields(),
                          "memory_adapted": adaptations, **extra}), nl=False)
        return
    for entry in result.log:
        click.echo(f"step {entry.step:4d}  loss {entry.loss:.4f}  layers {_span(entry.layers)}")
    for a in adaptations:
        click.echo(f"memory: before step {a['step'] + 1}, {a['knob']} {a['from'].get(a['knob']) or 'all'} -> "
                   f"{a['to'].get(a['knob'])} (peak {a['measured_bytes'] / 2**20:.1f} MiB over the "
                   f"{a['budget_bytes'] / 2**20:g} MiB budget, {a['trigger']})")
    if gate is not None:
        for line in gate.lines():
            click.echo(line)
    elif gate_off:
        click.echo(f"gate: off ({gate_off})")
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
                       as_json: bool, force: bool, eval_data: Path | None, eval_every: int | None, steps: int | None,
                       shuffle_seed: int | None, checkpoint_every: int, resume: bool, telemetry: Path | None,
                       layers_per_checkpoint: int = 1, no_gate: bool = False,
                       memory_budget: float | None = None) -> None:
    """`toolchain train --program`: `plan` is the `PlanRequest` of the plan options (nothing given: the plan
    recorded at export)."""
    import dataclasses

    from toolchain.errors import BadInput
    from toolchain.lora import save_adapter
    from toolchain.memory.measure import read_status, reset_peak
    from toolchain.training import TrainRun, checkpoint_path
    from toolchain.training.session import TrainingSession

    if eval_every is not None and eval_data is None:
        raise BadInput("--eval-every needs --eval-data (the held-out rows it evaluates)")
    if no_gate and eval_data is None:
        raise BadInput("--no-gate needs --eval-data (without held-out rows there is no gate to turn off)")
    check_outputs(adapter_out, telemetry, force=force, resume=resume)
    session = TrainingSession(program, use="train", verbose=verbose_requested())
    pdir = session.pdir
    examples = session.examples(data)
    lr = lr if lr is not None else pdir.default_lr
    # the manifest's run defaults (`defaults.steps`, as the apps take it), else the CLI's 100
    steps = steps if steps is not None else (pdir.default_steps or DEFAULT_TRAIN_STEPS)
    step_plan = plan.resolve_lcsb(pdir.arch.layers) if plan.given else pdir.default_plan()
    if step_plan is not None and step_plan.policy == "full":
        step_plan = None
    checkpoint = checkpoint_path(adapter_out or program)
    if resume and not checkpoint.exists():
        raise BadInput(f"--resume: no checkpoint at {checkpoint}")
    if telemetry is not None and session.measure_baseline() is not None:   # before the program is loaded
        reset_peak()                      # the steps' peak_bytes count from the loaded-runtime baseline on
    backend = session.open_runtime().backend
    run = TrainRun(steps=steps, lr=lr, shuffle_seed=shuffle_seed, checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, resume=resume, telemetry=telemetry, plan=step_plan,
                   layers_per_checkpoint=layers_per_checkpoint, memory_budget_bytes=budget_bytes(memory_budget))
    held = None if eval_data is None else session.examples(eval_data)

    session.start_training(examples, run, held=held, eval_every=eval_every or max(1, steps // 10), on_eval=echo_eval,
                           gate=not no_gate)
    bar = ProgressBar(f"train ({backend})", steps)
    result = session.train(on_step=bar.update, progress=bar)
    peak_mb = read_status().vm_hwm / 2**20
    if adapter_out is not None:
        save_adapter(adapter_out, pdir.lora_config, result.lora, base_model=pdir.model.source,
                     replace=force or resume)
    report(result, as_json, plan=step_plan, optimizer=dataclasses.replace(pdir.optimizer, lr=lr),
           adapter_out=adapter_out, program=str(program), process_peak_rss_mb=round(peak_mb, 1),
           gate_off=gate_off(eval_data, no_gate), **({} if held is None else {"evals": session.evals}))


def train_program_dpo(program: Path, data: Path, *, dpo: dict, plan, lr: float | None, adapter_out: Path | None,
                      as_json: bool, force: bool, steps: int | None, shuffle_seed: int | None, checkpoint_every: int,
                      resume: bool, telemetry: Path | None, layers_per_checkpoint: int = 1,
                      memory_budget: float | None = None, eval_data: Path | None = None, eval_every: int | None = None,
                      no_gate: bool = False) -> None:
    """`toolchain train --program --objective dpo`: preference pairs (and `--sft-data` rows) on a program exported
    with --preference (training/preference.py); `dpo` holds beta, sft_data and dpo_weight. `eval_data`: held-out
    pairs, the gate's loss their DPO loss (with the program's forgetting probe, if it has one)."""
    import dataclasses

    from toolchain.errors import BadInput
    from toolchain.lora import save_adapter
    from toolchain.training import TrainRun, checkpoint_path
    from toolchain.contract import HELD_OUT_EVAL_ROWS
    from toolchain.training.gate import Evaluation
    from toolchain.training.preference import program_preference_trainer, read_pair_items
    from toolchain.training.session import TrainingSession

    if eval_every is not None and eval_data is None:
        raise BadInput("--eval-every needs --eval-data (the held-out pairs it evaluates)")
    if no_gate and eval_data is None:
        raise BadInput("--no-gate needs --eval-data (without held-out pairs there is no gate to turn off)")
    check_outputs(adapter_out, telemetry, force=force, resume=resume)
    session = TrainingSession(program, use="train", verbose=verbose_requested())
    pdir = session.pdir
    if "block_backward_pair" not in pdir.methods:
        raise BadInput(f"{program} was exported without block_backward_pair; re-export it with --preference for "
                       f"--objective dpo")
    pairs = read_pair_items(data, pdir.arch.vocab, pdir.seq_len)
    held = None if eval_data is None else read_pair_items(eval_data, pdir.arch.vocab, pdir.seq_len)[:HELD_OUT_EVAL_ROWS]
    rows = [] if dpo["sft_data"] is None else session.examples(dpo["sft_data"])
    lr = lr if lr is not None else pdir.default_lr
    steps = steps if steps is not None else (pdir.default_steps or DEFAULT_TRAIN_STEPS)
    step_plan = plan.resolve_lcsb(pdir.arch.layers) if plan.given else pdir.default_plan()
    if step_plan is not None and step_plan.policy == "full":
        step_plan = None
    checkpoint = checkpoint_path(adapter_out or program)
    if resume and not checkpoint.exists():
        raise BadInput(f"--resume: no checkpoint at {checkpoint}")
    run = TrainRun(steps=steps, lr=lr, shuffle_seed=shuffle_seed, checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, resume=resume, telemetry=telemetry, plan=step_plan,
                   layers_per_checkpoint=layers_per_checkpoint, memory_budget_bytes=budget_bytes(memory_budget))
    trainer = program_preference_trainer(pdir, session.open_runtime(), pairs, rows, run, beta=dpo["beta"],
                                         dpo_weight=dpo["dpo_weight"])
    if held is not None:
        trainer.evaluation = Evaluation(trainer.with_reference(held), every=eval_every or max(1, steps // 10),
                                        gate=not no_gate, probe=pdir.probe_rows() if not no_gate else None,
                                        on_eval=echo_eval)
    result = progress_run(trainer, f"train dpo ({trainer.backend})", steps)
    if adapter_out is not None:
        save_adapter(adapter_out, pdir.lora_config, result.lora, base_model=pdir.model.source,
                     replace=force or resume)
    report(result, as_json, plan=step_plan, optimizer=dataclasses.replace(pdir.optimizer, lr=lr),
           adapter_out=adapter_out, program=str(program), margins=trainer.margins,
           gate_off=gate_off(eval_data, no_gate),
           **({} if held is None else {"evals": trainer.evaluation.points}))


def echo_eval(point) -> None:
    """One held-out evaluation on stderr (a progress line, like the bar)."""
    click.echo(f"eval after {point['step']} steps: held-out loss {point['loss']:.4f} ({point['tokens']} tokens)",
               err=True)


def gate_off(eval_data: Path | None, no_gate: bool) -> str | None:
    """Why a run has no gate decision (None: it has one)."""
    if no_gate:
        return "--no-gate"
    return "no --eval-data: no held-out rows to compare" if eval_data is None else None


def budget_bytes(memory_budget_mib: float | None) -> int | None:
    return None if memory_budget_mib is None else max(1, round(memory_budget_mib * 2**20))
