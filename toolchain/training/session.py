"""The host session: one exported program directory loaded once, trained, evaluated and generated from on
that one program and state, the host twin of the apps' `TrainingSession` (android/trainer-core TrainingSession.kt,
ios/TrainerCore TrainingSession.swift). `toolchain eval`, `generate`, `train --program` and `demo` run it.

    session = TrainingSession(program_dir)            # the program directory, checked (`ProgramDir`)
    session.load_state(adapter=...)                  # optional: else state_init.bin
    session.evaluate(examples)                       # held-out loss (runtime/evaluate.py)
    session.generate(prompt_ids, max_new_tokens)     # text (runtime/generate.py)
    session.start_training(examples, run, held=..., eval_every=N)   # resume check, telemetry
    session.train(on_step=...)                       # eval at the start, every N steps and after the last; the gate

What is loaded once: the program directory (manifest, checksums, SIGBUS guard), the runtime (one `ProgramRuntime`
with the methods of `use`, opened on first need or by `open_runtime`), one `LayerLoop` on it and the flat
state. Training runs on that loop and trains that state in place (`ProgramTrainer`), so evaluation and
generation after or during training read the live state; nothing is re-exported and no adapter file is
written in between.

It lives in `toolchain.training` (not `toolchain.runtime`) because training is the layer above the
runtime: the steps, checkpoints, resume and telemetry are the trainer's (training/loop.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from torch import Tensor

from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput
from toolchain.program.directory import ProgramDir
from toolchain.runtime.evaluate import evaluate_program
from toolchain.runtime.generate import GenerationResult, Prompt, generate, prompt_for
from toolchain.runtime.loop import LayerLoop
from toolchain.training.checkpoint import load_program_state
from toolchain.training.loop import TrainRun
from toolchain.training.program import ProgramTrainer, runtime_baseline
from toolchain.training.result import StepLog, RunOutcome

__all__ = ["TrainingSession", "EvalPoint", "program_state", "state_from_adapter"]

EvalPoint = dict[str, Any]   # {"step", "loss", "rows", "tokens"}: one held-out loss of the live state


class TrainingSession:
    """One program directory with its runtime, layer loop and flat state.

    Args:
        program: an exported program directory (`toolchain export`).
        target: the runtime (default: the program's first host-runnable target; "eager": PyTorch).
        threads: the runtime's threads.
        use: the methods the runtime loads (`program_runtime.role_methods`: "train", "eval", "generate", "all").
        verbose: the runtime's native log lines are shown (`toolchain --verbose`).

    Raises:
        BadInput: the directory is not a usable program (`ProgramDir`).
    """

    def __init__(self, program: Path, *, target: str | None = None, threads: int | None = None,
                 use: str = "all", verbose: bool = False) -> None:
        from toolchain.runtime.mapped_guard import guard_program

        self.pdir = ProgramDir(program)
        guard_program(self.pdir)              # a SIGBUS from the mapped weights is one Error: line
        self.target, self.threads, self.use, self.verbose = target, threads, use, verbose
        self.baseline: dict | None = None     # the loaded-runtime baseline (`measure_baseline`)
        self.trainer: ProgramTrainer | None = None
        self._runtime = None
        self._loop: LayerLoop | None = None
        self._state: Tensor | None = None

    # -- what is loaded ------------------------------------------------------------------------------
    @property
    def arch(self):
        return self.pdir.arch

    def examples(self, path: Path) -> list[DataRow]:
        """A data file's rows (JSONL, data_row.schema.json) checked against this program's model."""
        from toolchain.text.dataset import load_examples

        return load_examples(path, self.pdir.arch)

    def load_state(self, *, adapter: Path | None = None, resume_from: Path | None = None) -> Tensor:
        """The state to run with: an adapter's, a training checkpoint's, or (neither) the program's initial one."""
        self._state = program_state(self.pdir, adapter=adapter, resume_from=resume_from)
        return self._state

    @property
    def state(self) -> Tensor:
        """The flat float32 state (the live one while and after training; state_init.bin unless loaded)."""
        if self._state is None:
            self._state = self.pdir.state_init()
        return self._state

    def measure_baseline(self) -> dict | None:
        """The loaded-runtime baseline (`training.program.runtime_baseline`: the runtime loaded, the program
        not yet), logged as the training run's baseline `memory` event; before the runtime is opened."""
        if self._runtime is not None:
            raise RuntimeError("measure_baseline() after the runtime was opened: it would count the program")
        self.baseline = runtime_baseline(self.pdir, self.target)
        return self.baseline

    def open_runtime(self):
        """The runtime (opened once: `program_runtime.open_runtime` with this session's target, threads and use)."""
        if self._runtime is None:
            from toolchain.runtime.program_runtime import open_runtime

            self._runtime = open_runtime(self.pdir, self.target, threads=self.threads, use=self.use,
                                         verbose=self.verbose)
        return self._runtime

    @property
    def runtime(self):
        return self.open_runtime()

    @property
    def backend(self) -> str:
        return self.runtime.backend

    @property
    def loop(self) -> LayerLoop:
        """The one layer loop on the runtime (its weight bindings are made once and shared by every call)."""
        if self._loop is None:
            self._loop = LayerLoop(self.pdir, self.runtime)
        return self._loop

    # -- evaluate and generate -----------------------------------------------------------------------
    def evaluate(self, examples: Sequence[DataRow], *, state: Tensor | None = None) -> dict:
        """Held-out loss of `state` (default: the session's) on `examples` (`evaluate.evaluate_program`)."""
        return evaluate_program(self.pdir, self.runtime, self.state if state is None else state, examples,
                                loop=self.loop)

    def prompt(self, *, text: str | None = None, ids: str | None = None, chat: bool = False) -> Prompt:
        """A prompt for `generate` (`generate.prompt_for`: the program's tokenizer, or comma-separated ids)."""
        return prompt_for(self.pdir, text=text, ids=ids, chat=chat)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *, state: Tensor | None = None,
                 temperature: float = 0.0, seed: int | None = None, stop_ids: Sequence[int] = (),
                 on_token: Callable[[int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> GenerationResult:
        """New tokens after `prompt_ids` with the adapter in `state` (default: the session's; read, never
        written) on the generation methods (`generate.generate`)."""
        return generate(self.pdir, self.runtime, self.state if state is None else state, prompt_ids,
                        max_new_tokens, temperature=temperature, seed=seed, stop_ids=stop_ids, on_token=on_token,
                        should_stop=should_stop, loop=self.loop)

    # -- train ---------------------------------------------------------------------------------------
    def start_training(self, examples: Sequence[DataRow], run: TrainRun, *, held: Sequence[DataRow] | None = None,
                       eval_every: int | None = None, on_eval: Callable[[EvalPoint], None] | None = None,
                       memory_peak: bool | None = None, gate: bool = True) -> ProgramTrainer:
        """Everything before the first step (`Trainer.start`: the plan checked, the checkpoint of `run.resume`
        verified and restored into the state, telemetry opened with run_start and the baseline). `train` runs
        the steps, with the held-out evaluations and the gate (training/gate.py).

        Args:
            examples: the training rows.
            run: steps, lr, order, plan, checkpoints, resume, telemetry, memory budget (`TrainRun`).
            held: held-out rows (their first `HELD_OUT_EVAL_ROWS`, as the apps), evaluated on the live state
                before the first step (of this session: a resumed run's start is the checkpoint's), every
                `eval_every` steps (None or 0: only then and after the last step) and after the last; each one
                an `eval` telemetry event, a point of `evals` and a call of `on_eval`.
            memory_peak: the step memory events carry peak_bytes (VmHWM reset at or after the baseline;
                default: when a baseline was measured).
            gate: with `held`, decide at the end which adapter to keep (gate.py; the program's probe, if it has
                one, checks forgetting); False: evaluate only (`train --no-gate`).
        """
        from toolchain.contract import HELD_OUT_EVAL_ROWS
        from toolchain.training.gate import Evaluation

        trainer = ProgramTrainer(self.pdir, self.runtime, examples, run, loop=self.loop, state=self.state)
        trainer.baseline = self.baseline      # logged after run_start: the report's like-for-like planner check
        trainer.memory_peak = self.baseline is not None if memory_peak is None else memory_peak
        if held is not None:
            trainer.evaluation = Evaluation(list(held)[:HELD_OUT_EVAL_ROWS], every=eval_every or 0, gate=gate,
                                            probe=self.pdir.probe_rows() if gate else None, on_eval=on_eval)
        trainer.start()
        self.trainer, self._state = trainer, trainer.state   # a resumed run's state is the checkpoint's
        return trainer

    @property
    def evals(self) -> list[EvalPoint]:
        """The held-out losses of the training run, in step order."""
        ev = None if self.trainer is None else self.trainer.evaluation
        return [] if ev is None else list(ev.points)

    def train(self, *, on_step: Callable[[StepLog], None] | None = None,
              progress: AbstractContextManager | None = None) -> RunOutcome:
        """The steps of the run `start_training` set up, on the session's state (trained in place), with the
        held-out loss every `eval_every` steps and after the last, and the gate's decision (`RunOutcome.gate`;
        the session's state is then the kept one). `progress`: a context the steps run in (a progress display),
        entered after `start_training`'s work."""
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("train() before start_training()")
        with progress if progress is not None else nullcontext():
            result = trainer.run(on_step=on_step)
        self._state = result.state
        return result


def state_from_adapter(pdir: ProgramDir, adapter_dir) -> Tensor:
    """A PEFT adapter directory as the program's flat state (its LoRA slices; optimizer moments zero).
    The adapter's config must match the program's (rank, alpha, targets, layers)."""
    from toolchain.lora.peft_io import load_adapter
    from toolchain.program.spec import flat_state, state_layout

    cfg, lora = load_adapter(adapter_dir, pdir.arch)
    want = pdir.lora_config
    if (cfg.rank, cfg.alpha, tuple(cfg.targets), cfg.use_rslora) != (want.rank, want.alpha, tuple(want.targets),
                                                                      want.use_rslora):
        raise BadInput(f"{adapter_dir}: adapter r={cfg.rank} alpha={cfg.alpha} targets={','.join(cfg.targets)} does not "
                       f"match the program's r={want.rank} alpha={want.alpha} targets={','.join(want.targets)}; "
                       f"re-export the program with this adapter's config (or --adapter)")
    layout = state_layout(pdir.arch, pdir.lora_config, pdir.optimizer)
    state = flat_state(layout, lora)
    if state.numel() != pdir.state_numel:
        raise BadInput(f"{adapter_dir}: gives {state.numel()} state values, the program has {pdir.state_numel}")
    return state


def program_state(pdir: ProgramDir, *, adapter=None, resume_from=None) -> Tensor:
    """The flat state to run with: an adapter's (`--adapter`), a training checkpoint's (`--resume-from`,
    read as `--resume` reads it: `checkpoint.load_program_state`), or the program's initial one.

    Raises:
        BadInput: both given, or either does not fit the program.
    """
    if adapter is not None and resume_from is not None:
        raise BadInput("give either --adapter or --resume-from, not both")
    if adapter is not None:
        return state_from_adapter(pdir, adapter)
    if resume_from is not None:
        return load_program_state(resume_from, pdir.state_numel)
    return pdir.state_init()
