"""Train with an exported program the way the phone apps do (host plays the phone).

The run owns the flat state (from the program's state_init.bin). Per step: pick the layers to
backpropagate (the run's LCSB plan, by default the one recorded at export; none: all), pad the row to
seq_len (ids with pad_token_id, labels with -100), run the v3 layer loop (runtime/loop.py) on the
state, record the loss. Every `checkpoint_every` steps the state and the position in the run are written
atomically, so a killed run resumes with the same result as an uninterrupted one.
Telemetry events (shared_schemas/telemetry_event.schema.json) go to a JSONL file, numbered per run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from toolchain.atomic import atomic_write_bytes
from toolchain.dataset import Example
from toolchain.errors import BadInput
from toolchain.lcsb.plan import StepPlan
from toolchain.memory.measure import read_status
from toolchain.runtime.loop import LayerLoop
from toolchain.runtime.program_dir import ProgramDir

__all__ = ["TrainRun", "TrainResult", "run_program", "pad_example", "data_order", "host_run_info"]


@dataclass(frozen=True)
class TrainRun:
    steps: int
    lr: float
    shuffle_seed: int | None = None
    checkpoint: Path | None = None        # file; None: no checkpoints
    checkpoint_every: int = 1
    resume: bool = False
    telemetry: Path | None = None
    plan: StepPlan | None = None          # LCSB layers per step, chosen at run time; None: full backprop


@dataclass
class TrainResult:
    losses: list[float]
    state: torch.Tensor
    run_id: str
    peak_anon_bytes: int | None
    step_s: list[float]


def pad_example(ex: Example, seq_len: int, pad_id: int, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    t = ex.input_ids.shape[0]
    if t > seq_len:
        raise BadInput(f"{where} has {t} tokens; this program was exported for --seq-len {seq_len} "
                       f"(re-export with a longer --seq-len or shorten the rows)")
    ids = torch.full((seq_len,), pad_id, dtype=torch.int64)
    labels = torch.full((seq_len,), -100, dtype=torch.int64)
    ids[:t], labels[:t] = ex.input_ids, ex.labels
    return ids, labels


def data_order(n_rows: int, steps: int, shuffle_seed: int | None) -> list[int]:
    """Row index of each step: file order, cycling; with a seed, a fresh permutation per epoch."""
    order: list[int] = []
    epoch = 0
    while len(order) < steps:
        if shuffle_seed is None:
            order.extend(range(n_rows))
        else:
            g = torch.Generator().manual_seed(shuffle_seed + epoch)
            order.extend(torch.randperm(n_rows, generator=g).tolist())
        epoch += 1
    return order[:steps]


def _save_checkpoint(path: Path, state: torch.Tensor, meta: dict) -> None:
    from safetensors.torch import save

    atomic_write_bytes(path, save({"state": state.contiguous()}, metadata={"meta": json.dumps(meta)}))


def _load_checkpoint(path: Path) -> tuple[torch.Tensor, dict]:
    from safetensors.torch import load

    try:
        raw = path.read_bytes()
        tensors = load(raw)
        header_len = int.from_bytes(raw[:8], "little")
        meta = json.loads(json.loads(raw[8:8 + header_len])["__metadata__"]["meta"])
    except (OSError, ValueError, KeyError) as e:
        raise BadInput(f"checkpoint {path} is unreadable ({e}); delete it to start over") from None
    return tensors["state"], meta


def _last_seq(path: Path, run_id: str) -> int:
    last = -1
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            if event.get("run_id") == run_id:
                last = max(last, int(event.get("seq", -1)))
    return last


def _anon_bytes() -> int | None:
    try:
        return read_status().rss_anon
    except (OSError, BadInput):
        return None


def host_run_info(pdir: ProgramDir, backend: str, lr: float) -> dict:
    """The run_start fields for a run on this host (platform linux, budget = physical RAM)."""
    import os
    import platform

    m = pdir.manifest
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    info = {"model": m["model"]["source"], "method": "mesp", "backend": backend, "seq_len": pdir.seq_len,
            "rank": m["lora"]["rank"], "targets": m["lora"]["targets"], "optimizer": m["optimizer"]["kind"],
            "quant": m["quant"]["kind"], "platform": "linux", "device_model": platform.machine() or "host",
            "os": platform.platform(), "total_ram_bytes": total, "budget_bytes": total, "program": pdir.path.name}
    return info


def run_program(pdir: ProgramDir, runner, examples: list[Example], run: TrainRun, *,
                on_step: Callable[[int, float], None] | None = None, run_info: dict | None = None) -> TrainResult:
    """Drive `runner` (any object with `execute(method, inputs) -> outputs` and `backend`) for a run."""
    from toolchain.telemetry.events import TelemetryWriter

    pad_id = pdir.info.pad_token_id
    rows = [pad_example(ex, pdir.seq_len, pad_id, f"data row {i + 1}") for i, ex in enumerate(examples)]
    order = data_order(len(rows), run.steps, run.shuffle_seed)
    start, run_id, seq, losses, step_s = 0, None, 0, [], []
    state = pdir.state_init()
    if run.resume and run.checkpoint is not None and run.checkpoint.exists():
        state, meta = _load_checkpoint(run.checkpoint)
        if state.numel() != pdir.state_numel:
            raise BadInput(f"checkpoint {run.checkpoint} has {state.numel()} state values, the program {pdir.state_numel}")
        state = state.clone()
        start, run_id, seq, losses = meta["step"], meta["run_id"], meta["seq"], meta["losses"]
    if run.telemetry and run_id is not None:
        # Events written after the checkpoint (before the kill) keep their numbers: continue after the
        # highest seq already in the log, so no (run_id, seq) is reused with different content.
        seq = max(seq, _last_seq(run.telemetry, run_id) + 1)
    writer = TelemetryWriter(run.telemetry, run_id, start_seq=seq) if run.telemetry else None
    run_id = writer.run_id if writer else (run_id or "local")
    if run.plan is not None:
        run.plan.check_layers(pdir.arch.layers, where="LCSB plan")
    if writer and start == 0:
        info = run_info or host_run_info(pdir, getattr(runner, "backend", "executorch"), run.lr)
        if run.plan is not None:
            info["lcsb_k"] = run.plan.k
        writer.emit("run_start", **info, steps_planned=run.steps, lr=run.lr)
    loop = LayerLoop(pdir, runner)
    t_run = time.perf_counter()
    for step in range(start, run.steps):
        phase = None if run.plan is None else run.plan.schedule[step % len(run.plan.schedule)]
        selected = None if run.plan is None else run.plan.phases[phase]
        ids, labels = rows[order[step]]
        t0 = time.perf_counter()
        loss = loop.train_step(ids, labels, run.lr, state, selected)
        dt = time.perf_counter() - t0
        losses.append(loss)
        step_s.append(dt)
        if writer:
            tokens = int((labels != -100).sum())
            writer.emit("step", step=step, loss=loss if loss == loss else None, step_time_s=round(dt, 6),
                        tokens=tokens, tokens_per_s=round(tokens / dt, 3) if dt > 0 else 0.0, lr=run.lr,
                        **({"lcsb_phase": phase} if phase is not None else {}))
            anon = _anon_bytes()
            if anon is not None:
                writer.emit("memory", probe="linux_proc_status", step=step, anon_bytes=anon)
        if on_step:
            on_step(step, loss)
        if run.checkpoint is not None and ((step + 1) % run.checkpoint_every == 0 or step + 1 == run.steps):
            _save_checkpoint(run.checkpoint, state,
                             {"step": step + 1, "run_id": run_id, "seq": writer.seq if writer else 0, "losses": losses})
    if writer:
        writer.emit("run_end", status="completed", steps_completed=run.steps,
                    duration_s=round(time.perf_counter() - t_run, 6), final_loss=losses[-1] if losses else None)
    return TrainResult(losses, state, run_id, None, step_s)
