"""The run loop both trainers share: row order, LCSB plan, resume from a verified checkpoint,
telemetry, periodic checkpoints, progress callback.

A trainer (`EagerTrainer`, `ProgramTrainer`) supplies one step on its state and the state's tensors;
`Trainer.run` does the rest the same way for both, so `train --shuffle S` and `train --program ...
--shuffle S` visit the same rows, checkpoint alike and resume alike.

Telemetry (shared_schemas/telemetry_event.schema.json) goes to a JSONL file, numbered per run. After a
resume, events continue after the highest `seq` already in the file for the run, and steps whose event
is already there (written after the last checkpoint, before the kill) are not logged again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import Tensor

from toolchain.errors import BadInput
from toolchain.lcsb.plan import StepPlan
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepOptions
from toolchain.optim import OptimizerConfig
from toolchain.memory.fallback import KNOBS, WorkingSet
from toolchain.training.checkpoint import check_settings, finite_or_none, load_checkpoint, save_checkpoint
from toolchain.training.order import DataOrder
from toolchain.training.result import StepLog, RunOutcome

__all__ = ["TrainRun", "Trainer", "OnStep", "host_info"]

OnStep = Callable[[StepLog], None]


@dataclass(frozen=True)
class TrainRun:
    """How to run a training run, for both trainers (what is trained is the trainer's: the model and starting
    adapter of `EagerTrainer`, the exported program of `ProgramTrainer`).

    Args:
        steps: training steps, one row each.
        lr: the learning rate of every step. Program trainer: None takes the program's `default_lr`. Eager
            trainer: replaces `optimizer.lr` when given.
        optimizer: eager trainer only (a program's optimizer is fixed at export, but for its lr). None: AdamW,
            lr 1e-4, weight decay 0.01 (the LCSB paper).
        options: eager trainer only (a program's are fixed at export): static step options (loss/MLP
            chunking). None: `StepOptions()`.
        plan: the LCSB layers per step (chosen at run time); None: full backprop every step.
        shuffle_seed: visit the rows in a seeded random order, reshuffled every pass (order.py); None keeps
            file order.
        layers_per_checkpoint: keep one layer input per this many selected layers and recompute the rest
            (`mesp_step`'s checkpoint groups, `LayerLoop.train_step`): less memory, one more forward. Default: 1
            (every selected layer's input kept).
        checkpoint: file the resumable state is written to every `checkpoint_every` steps (default 10, as
            `toolchain train --checkpoint-every`) and at the end; None: no checkpoints.
        resume: continue from `checkpoint` if it exists (it must belong to this run: checkpoint.py).
        telemetry: JSONL file the run's telemetry events are appended to; None: none.
        memory_budget_bytes: adapt to memory pressure (pressure.py): after a step whose anonymous peak is over
            this, the next steps run with a smaller working set (`memory.fallback`), and the run stops when
            nothing smaller is left; None: no budget.
    """

    steps: int
    lr: float | None = None
    optimizer: OptimizerConfig | None = None
    options: StepOptions | None = None
    plan: StepPlan | None = None
    shuffle_seed: int | None = None
    layers_per_checkpoint: int = 1
    checkpoint: Path | None = None
    checkpoint_every: int = 10
    resume: bool = False
    telemetry: Path | None = None
    memory_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise BadInput(f"`memory_budget_bytes` must be >= 1, got {self.memory_budget_bytes}")
        if self.steps < 1:
            raise BadInput(f"`steps` must be >= 1, got {self.steps}")
        if self.checkpoint_every < 1:
            raise BadInput(f"`checkpoint_every` must be >= 1, got {self.checkpoint_every}")
        if self.layers_per_checkpoint < 1:
            raise BadInput(f"`layers_per_checkpoint` must be >= 1, got {self.layers_per_checkpoint}")


class _Logged(NamedTuple):
    last_seq: int          # -1: none
    steps: frozenset[int]  # 0-based steps with a `step` event
    ended: frozenset[int]  # steps_completed of its run_end events (a run extended by --steps ends again)
    evals: frozenset[int] = frozenset()   # steps of its `eval` events (a resumed run's start may repeat one)


def _logged(path: Path | None, run_id: str | None) -> _Logged:
    if path is None or run_id is None or not path.is_file():    # a device (/dev/null, a terminal): nothing to read
        return _Logged(-1, frozenset(), frozenset())
    last, steps, ended, evals = -1, set(), set(), set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        if not isinstance(event, dict) or event.get("run_id") != run_id:
            continue
        if isinstance(event.get("seq"), int):
            last = max(last, event["seq"])
        if event.get("type") == "step" and isinstance(event.get("step"), int):
            steps.add(event["step"])
        if event.get("type") == "run_end" and isinstance(event.get("steps_completed"), int):
            ended.add(event["steps_completed"])
        if event.get("type") == "eval" and isinstance(event.get("step"), int):
            evals.add(event["step"])
    return _Logged(last, frozenset(steps), frozenset(ended), frozenset(evals))


def host_info() -> dict[str, Any]:
    """The run_start fields describing this host (platform linux, budget = physical RAM)."""
    import os
    import platform

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"platform": "linux", "device_model": platform.machine() or "host", "os": platform.platform(),
            "total_ram_bytes": total, "budget_bytes": total}


def _memory_fields(peak: bool) -> dict[str, int]:
    """linux_proc_status fields of this process now: anon (RssAnon) and, with `peak`, the anonymous
    high-water mark (VmHWM - RssFile - RssShmem: meaningful when the front end reset VmHWM at its baseline)."""
    from toolchain.memory.measure import read_status

    try:
        status = read_status()
    except (OSError, BadInput):
        return {}
    return {"anon_bytes": status.rss_anon, **({"peak_bytes": max(0, status.peak_anon)} if peak else {})}


class Trainer:
    """Base of the two trainers. Subclasses set `run_options`, `layers`, `rows` (row count) and implement
    the hooks below; `run` drives the steps.

    Inside `on_step`, the trainer is the place to reach the run: `trainer.lora` (the adapter now),
    `trainer.emit(type, **fields)` (a telemetry event in this run's numbering; a no-op without
    telemetry). An evaluation hook plugs in there.

    A front end that measured the loaded-runtime baseline (the process with the runtime loaded, before the
    program's methods, arenas and state are) sets `baseline` to that memory sample's fields (probe, anon_bytes,
    ...): it is logged as a `memory` event with `baseline: true` right after run_start, and the report measures
    the program-attributable peak above it. `memory_peak`: the per-step memory events also carry peak_bytes
    (set it when VmHWM was reset at or after the baseline, e.g. inside `memory.measure.measure_peak`).
    """

    run_options: TrainRun
    layers: int
    rows: int
    backend: str = "eager"
    _recorder = None
    _lr: float | None = None
    _start: int | None = None  # set by `start`, consumed by `run`
    baseline: dict[str, Any] | None = None
    memory_peak: bool = False
    evaluation = None             # gate.Evaluation: held-out losses and the gate (set by the front end)
    working: WorkingSet | None = None   # the step's run-time knobs (set by `start`; lowered under memory pressure)
    pressure_knobs: tuple = KNOBS       # the knobs of `working` the steps apply (memory.fallback's ladder)

    # -- hooks -------------------------------------------------------------------------------------
    def step(self, step: int, row: int, layers: tuple[int, ...] | None) -> tuple[float, int]:
        """Train one step (0-based `step`) on row `row` through `layers` (None: all); (loss, tokens)."""
        raise NotImplementedError

    def tensors(self) -> dict[str, Tensor]:
        """The state a checkpoint holds."""
        raise NotImplementedError

    def restore(self, tensors: dict[str, Tensor], step: int, where: str) -> None:
        """Continue from a checkpoint's tensors taken after `step` steps; BadInput when they do not fit."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpointed one (checkpoint.py)."""
        raise NotImplementedError

    def run_info(self) -> dict[str, Any]:
        """The run_start event's fields."""
        raise NotImplementedError

    def inputs_changed(self) -> str | None:
        """Why an input the steps read in place (a memory-mapped weights file) changed since the run
        started, checked before every step; None: unchanged (the default: nothing is mapped)."""
        return None

    def checkpoint_saved(self, step: int, path: Path) -> None:
        """Called after each checkpoint is written (the program trainer names it in its SIGBUS line)."""

    def held_out(self, rows) -> dict[str, Any]:
        """{"loss", "rows", "tokens"}: the mean next-token loss of the live state over `rows` (forward only)."""
        raise NotImplementedError

    def snapshot(self) -> Any:
        """A copy of the trainable state (the gate keeps the start's and the best one)."""
        raise NotImplementedError

    def load_snapshot(self, snap: Any) -> None:
        """Make a `snapshot` the live state again."""
        raise NotImplementedError

    def predict_peak_mb(self, ws: WorkingSet) -> float | None:
        """The planner's peak (MB) of a step with the working set `ws` (None: no figure)."""
        return None

    def row_tokens(self, row: int) -> int | None:
        """Tokens of row `row` as the step takes them (None: fixed, a program's seq_len)."""
        return None

    @property
    def lora(self) -> LoraWeights:
        raise NotImplementedError

    @property
    def state(self) -> Any:
        raise NotImplementedError

    # -- the loop ----------------------------------------------------------------------------------
    def emit(self, type: str, **fields: Any) -> dict | None:
        return None if self._recorder is None else self._recorder.emit(type, **fields)

    def logged_eval(self, step: int) -> bool:
        """An `eval` event of this run at `step` is in the telemetry file already (written before a kill)."""
        logged = getattr(self, "_logged", None)
        return logged is not None and step in logged.evals

    def start(self) -> None:
        """Everything before the first step: check the plan, resume from the verified checkpoint, open
        the telemetry. `run` calls it unless it was called already (callers that show progress call it
        first, so that an error is reported before any progress bar).

        Raises:
            BadInput: no rows, a plan for another model, a checkpoint that is unreadable, for another
                run (the message names the difference) or past `steps`.
        """
        from toolchain.telemetry.events import TelemetryRecorder

        run = self.run_options
        self._order = DataOrder(self.rows, run.shuffle_seed)
        if run.plan is not None:
            run.plan.check_layers(self.layers, where="LCSB plan")
        start, run_id, seq, losses = 0, None, 0, []
        if run.resume and run.checkpoint is not None and run.checkpoint.exists():
            ck = load_checkpoint(run.checkpoint)
            check_settings(run.checkpoint, ck.settings, self.settings())
            if ck.step > run.steps:
                raise BadInput(f"checkpoint {run.checkpoint} is at step {ck.step}, past --steps {run.steps}; give "
                               f"--steps {ck.step} or more, or delete it to start over")
            self.restore(ck.tensors, ck.step, str(run.checkpoint))
            start, run_id, seq, losses = ck.step, ck.run_id, ck.seq, list(ck.losses)
        self._logged = _logged(run.telemetry, run_id)
        self._recorder = None
        if run.telemetry is not None:
            self._recorder = TelemetryRecorder(run.telemetry, run_id, start_seq=max(seq, self._logged.last_seq + 1))
            run_id = self._recorder.run_id
        self._start, self._run_id, self._losses = start, run_id or "local", losses
        plan = run.plan
        k = None if plan is None or plan.policy == "full" else plan.k
        seq = [self.row_tokens(r) for r in range(self.rows)]
        self.working = WorkingSet(run.layers_per_checkpoint, k, None if None in seq or not seq else max(seq))
        self._plan = plan
        self.adaptations: list[dict] = []
        info = self.run_info()
        if run.memory_budget_bytes is not None:
            info["budget_bytes"] = run.memory_budget_bytes
        self._lr = info.get("lr")
        if start == 0:
            self.emit("run_start", **info, steps_planned=run.steps)
        if self.baseline is not None:
            self.emit("memory", **self.baseline, baseline=True)
        self._evaluating = self.evaluation is not None and start < run.steps
        if self._evaluating:      # the held-out loss (and the gate's starting point) before the first step
            self.evaluation.begin(self, start)

    def run(self, *, on_step: OnStep | None = None) -> RunOutcome:
        """Train for `run_options.steps` steps (from the checkpoint's step with `resume`); see `start`. With
        `evaluation`, the held-out loss before the first step, every `evaluation.every` steps and after the last,
        then the gate's decision (gate.py); with `run_options.memory_budget_bytes`, the working set adapted at step
        boundaries (pressure.py)."""
        from toolchain.training.pressure import MemoryGuard, check_budget

        if self._start is None:
            self.start()
        run, order, logged, losses, run_id = self.run_options, self._order, self._logged, self._losses, self._run_id
        start, self._start = self._start, None
        log: list[StepLog] = []
        t_run = time.perf_counter()
        saved = start
        guard = None if run.memory_budget_bytes is None else MemoryGuard(run.memory_budget_bytes, self.layers,
                                                                          self.predict_peak_mb, self.pressure_knobs)
        if guard is not None:
            self.memory_peak = True       # each step's memory event carries that step's peak (VmHWM reset before it)
            self.predict_peak_mb(self.working)   # whatever the planner loads, before the first measured step
        evaluation = self.evaluation if self._evaluating else None
        for s in range(start, run.steps):
            changed = self.inputs_changed()
            if changed is not None:
                self._stop_changed(changed, s, saved, losses)
            layers = None if self._plan is None else self._plan.layers_at(s)
            row = order[s]
            if guard is not None:
                guard.before_step()
            t0 = time.perf_counter()
            loss, tokens = self.step(s, row, layers)
            dt = time.perf_counter() - t0
            measured = None if guard is None else guard.after_step()
            losses.append(loss)
            entry = StepLog(s + 1, loss, row, tuple(range(self.layers)) if layers is None else layers, dt)
            log.append(entry)
            if s not in logged.steps:
                self._emit_step(s, entry, tokens)
            if on_step is not None:
                on_step(entry)
            if evaluation is not None:
                evaluation.after_step(self, s + 1, s + 1 == run.steps)
            if run.checkpoint is not None and ((s + 1) % run.checkpoint_every == 0 or s + 1 == run.steps):
                self._save(s + 1, losses)
                saved = s + 1
            if guard is not None and s + 1 < run.steps:
                saved = check_budget(self, guard, measured, s, order[s + 1], saved, losses)
        decision = None if evaluation is None else evaluation.finish(self)
        if decision is not None and decision.decision != "kept" and run.checkpoint is not None and saved == run.steps:
            self._save(run.steps, losses)              # the kept adapter is what the run leaves behind
        if run.steps not in logged.ended:
            final = losses[-1] if losses else None
            self.emit("run_end", status="completed", steps_completed=run.steps,
                      duration_s=round(time.perf_counter() - t_run, 6),
                      final_loss=None if final is None else finite_or_none(final))
        return RunOutcome(self.lora, tuple(log), tuple(losses), run_id, self.state, gate=decision,
                          adaptations=tuple(self.adaptations))

    def _save(self, step: int, losses: list) -> None:
        run = self.run_options
        save_checkpoint(run.checkpoint, self.tensors(), step=step, run_id=self._run_id,
                        seq=self._recorder.seq if self._recorder else 0, losses=losses, settings=self.settings())
        self.checkpoint_saved(step, run.checkpoint)

    def _stop_changed(self, why: str, step: int, saved: int, losses: list) -> None:
        """An input changed before step `step` (0-based): checkpoint the `step` completed steps (whole: the
        last step finished before the change was seen), then stop with one error."""
        run = self.run_options
        where = ""
        if run.checkpoint is not None and step > saved:
            save_checkpoint(run.checkpoint, self.tensors(), step=step, run_id=self._run_id,
                            seq=self._recorder.seq if self._recorder else 0, losses=losses, settings=self.settings())
            saved = step
        if run.checkpoint is not None and saved > 0 and run.checkpoint.exists():
            where = f"; the checkpoint of step {saved} is at {run.checkpoint}: restore the file and --resume"
        raise BadInput(f"stopped before step {step + 1}: {why} while the run was using it{where}")

    def _emit_step(self, s: int, entry: StepLog, tokens: int) -> None:
        if self._recorder is None:
            return
        plan = self._plan                        # the run's plan, or the one memory pressure adapted it to
        index = None if plan is None else plan.phase_at(s)  # None: no plan, or a warm-up step
        phase = {} if index is None else {"lcsb_phase": index}
        dt = entry.step_s
        lr = self._lr
        self.emit("step", step=s, loss=finite_or_none(entry.loss),
                  step_time_s=round(dt, 6), tokens=tokens, tokens_per_s=round(tokens / dt, 3) if dt > 0 else 0.0,
                  **({"lr": lr} if lr is not None else {}), **phase)
        memory = _memory_fields(self.memory_peak)
        if memory:
            self.emit("memory", probe="linux_proc_status", step=s, **memory)

