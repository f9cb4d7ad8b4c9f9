"""The program trainer: train with an exported program the way the phone apps do (host plays the phone).

The trainer owns the flat state (from the program's state_init.bin). Per step: the layers to
backpropagate (the run's LCSB plan, else full backprop), the row padded to seq_len (ids with
pad_token_id, labels with -100), the layer loop (runtime/loop.py) on the state. Rows, checkpoints,
resume and telemetry are the shared loop's (loop.py), as for the eager trainer, so a killed run
resumes with the same result as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from toolchain.contract import MANIFEST_NAME, sha256_file
from toolchain.text.dataset import DataRow, pad_row
from toolchain.errors import BadInput
from toolchain.lora.weights import LoraWeights
from toolchain.program.directory import ProgramDir
from toolchain.runtime.loop import LayerLoop
from toolchain.training.checkpoint import program_state_of, rows_sha256
from toolchain.training.loop import OnStep, Trainer, TrainRun, host_info
from toolchain.training.result import RunOutcome

__all__ = ["ProgramTrainer", "run_program", "pad_row", "host_run_info", "runtime_baseline"]


def host_run_info(pdir: ProgramDir, backend: str, lr: float) -> dict:
    """The run_start fields for a run of `pdir` on this host."""
    return {"model": pdir.model.source, "method": "mesp", "backend": backend, "seq_len": pdir.seq_len,
            "rank": pdir.lora_config.rank, "targets": list(pdir.lora_config.targets), "optimizer": pdir.optimizer.kind,
            "lr": lr, "quant": pdir.spec.quant.kind, "compute": pdir.spec.compute, **host_info(),
            "program": pdir.path.name}


class ProgramTrainer(Trainer):
    """`run_program` as an object; `state` is the flat state, `loop` the layer loop on the runtime.
    `loop` / `state`: a loop on `runtime` and a flat state to train in place (`TrainingSession` passes its
    own); default: a new loop and the program's initial state."""

    def __init__(self, pdir: ProgramDir, runtime, examples: Sequence[DataRow], run: TrainRun, *,
                 run_info: dict | None = None, loop: LayerLoop | None = None, state: Tensor | None = None) -> None:
        if run.optimizer is not None or run.options is not None:
            raise BadInput("a program's optimizer and step options are fixed at export (only its lr is a step input); "
                           "give lr, not optimizer or options")
        self.pdir, self.run_options, self.examples = pdir, run, examples
        self.lr = pdir.default_lr if run.lr is None else run.lr
        self.layers, self.rows = pdir.arch.layers, len(examples)
        self.backend = getattr(runtime, "backend", "executorch")
        pad_id = pdir.pad_token_id
        self._rows = [pad_row(ex, pdir.seq_len, pad_id, f"data row {i + 1}") for i, ex in enumerate(examples)]
        self._state = pdir.state_init() if state is None else state
        self.loop = LayerLoop(pdir, runtime) if loop is None else loop
        self._run_info = run_info
        self._settings: dict[str, Any] | None = None
        self.runtime = runtime
        self._predicted: dict[tuple, float | None] = {}

    @property
    def state(self) -> Tensor:
        return self._state

    @property
    def lora(self) -> LoraWeights:
        return self.pdir.lora_from_state(self._state)

    def step(self, step: int, row: int, layers: tuple[int, ...] | None) -> tuple[float, int]:
        ids, labels = self._rows[row]
        every = self.run_options.layers_per_checkpoint if self.working is None else self.working.layers_per_checkpoint
        loss = self.loop.train_step(ids, labels, self.lr, self._state, layers, layers_per_checkpoint=every)
        return loss, int((labels != -100).sum())

    def held_out(self, rows) -> dict[str, Any]:
        from toolchain.runtime.evaluate import evaluate_program

        return evaluate_program(self.pdir, self.runtime, self._state, rows, loop=self.loop)

    def snapshot(self) -> Tensor:
        return self._state.clone()

    def load_snapshot(self, snap: Tensor) -> None:
        self._state.copy_(snap)                  # in place: the session and the loop hold this tensor

    def predict_peak_mb(self, ws) -> float | None:
        """The planner's host figure (`memory.fit.program_peak`) for `ws`; None without an ExecuTorch memory plan."""
        from toolchain.errors import ToolchainError
        from toolchain.memory.fit import program_peak

        key = (ws.lcsb_k, ws.layers_per_checkpoint)
        if key not in self._predicted:
            try:
                self._predicted[key] = program_peak(self.pdir.path, lcsb_k=ws.lcsb_k,
                                                    layers_per_checkpoint=ws.layers_per_checkpoint).host_peak_mb
            except ToolchainError:
                self._predicted[key] = None
        return self._predicted[key]

    def tensors(self) -> dict[str, Tensor]:
        return {"state": self._state}

    def inputs_changed(self) -> str | None:
        return self.pdir.weights_changed()

    def checkpoint_saved(self, step: int, path: Path) -> None:
        from toolchain.runtime import mapped_guard

        mapped_guard.set_note(f"the checkpoint of step {step} is at {path}: restore the file and --resume")

    def restore(self, tensors: dict[str, Tensor], step: int, where: str) -> None:
        self._state = program_state_of(tensors, self.pdir.state_numel, where)

    def settings(self) -> dict[str, Any]:
        if self._settings is None:
            run = self.run_options
            optimizer = dataclasses.replace(self.pdir.optimizer, lr=self.lr)
            self._settings = {
                "trainer": "program",
                "program": sha256_file(self.pdir.path / MANIFEST_NAME),
                "data": rows_sha256(self.examples), "optimizer": optimizer.to_dict(),
                "shuffle_seed": run.shuffle_seed, "plan": None if run.plan is None else run.plan.to_dict()}
        return self._settings

    def run_info(self) -> dict[str, Any]:
        info = dict(self._run_info) if self._run_info is not None else host_run_info(self.pdir, self.backend, self.lr)
        if self.run_options.plan is not None:
            info["lcsb_k"] = self.run_options.plan.k
        info["lr"] = self.lr
        if "planner_estimate_bytes" not in info:
            info.update(self.planner_estimate())
        return info

    def planner_estimate(self) -> dict[str, Any]:
        """run_start's planner fields for an ExecuTorch run on this host: the planner's host figure
        (`memory.fit.program_peak`: largest arena + LoRA state + the selected layers' checkpoints +
        activations + runtime overhead), the memory the program adds above the loaded runtime; {} where the
        planner has no figure (other runtimes, checkpoint groups, no ExecuTorch memory plan)."""
        from toolchain.errors import ToolchainError
        from toolchain.memory.estimate import BYTES_PER_MB
        from toolchain.memory.fit import program_peak

        run = self.run_options
        if self.backend != "executorch" or run.layers_per_checkpoint != 1:
            return {}
        k = run.plan.max_layers if run.plan is not None else self.layers  # a warm-up step checkpoints every layer
        try:
            peak = program_peak(self.pdir.path, lcsb_k=k)
        except ToolchainError:
            return {}
        return {"planner_estimate_bytes": round(peak.host_peak_mb * BYTES_PER_MB),
                "planner_basis": f"plan fit --program host figure (one shared arena, checkpoints of {peak.lcsb_k} "
                                 f"layers, runtime overhead)"}


def run_program(pdir: ProgramDir, runtime, examples: Sequence[DataRow], run: TrainRun, *,
                on_step: OnStep | None = None, run_info: dict | None = None) -> RunOutcome:
    """Drive `runtime` (any object with `execute(method, inputs) -> outputs` and `backend`) for a run."""
    return ProgramTrainer(pdir, runtime, examples, run, run_info=run_info).run(on_step=on_step)


def runtime_baseline(pdir, target: str | None) -> dict | None:
    """The loaded-runtime baseline (linux_proc_status fields), taken as `toolchain bench memory` takes it:
    the ExecuTorch runtime and its int4 kernel library loaded, malloc trimmed, before the program's methods,
    arenas and state exist. None off Linux or for another runtime (the report then makes no comparison)."""
    from toolchain.errors import BadInput
    from toolchain.memory.measure import read_status, release_free_memory
    from toolchain.runtime.program_runtime import HOST_RUNNABLE

    if (target or next((t for t in pdir.targets if t in HOST_RUNNABLE), None)) != "executorch":
        return None
    try:
        from executorch.runtime import Runtime

        from toolchain.runtime.executorch_runtime import load_quantized_kernels

        Runtime.get()
        load_quantized_kernels()
        release_free_memory()
        status = read_status()
    except (ImportError, OSError, BadInput):
        return None
    return {"probe": "linux_proc_status", "anon_bytes": status.rss_anon, "rss_bytes": status.vm_rss}
