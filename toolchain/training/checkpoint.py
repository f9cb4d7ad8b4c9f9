"""Resumable checkpoints of a training run, and the check that a checkpoint belongs to this run.

File format (the apps' trainer cores read and write the same, android/trainer-core, ios/TrainerCore):
safetensors with the trainer's tensors (a program: one flat float32 `state`; eager: the adapter and the
optimizer slots by name) and a `meta` JSON string in the header's `__metadata__`:
  {"step": steps taken, "run_id": telemetry run id, "seq": next telemetry sequence number,
   "losses": loss per step so far (null: not finite), "settings": what fixes the run (below)}.
`settings` records everything a resumed run must share with the interrupted one: the program (its
manifest's sha256) or the model and starting adapter, the training rows' sha256, the optimizer with its
lr, the row order's shuffle seed and the LCSB plan. `--steps` may differ (the row order and the plan
are functions of the step, so a longer run continues the same sequence).
Written atomically (toolchain/atomic.py), so a kill leaves the previous checkpoint intact.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from toolchain.atomic import atomic_write_bytes
from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput

__all__ = ["CHECKPOINT_SUFFIX", "Checkpoint", "checkpoint_path", "save_checkpoint", "read_checkpoint",
           "load_checkpoint", "load_program_state", "program_state_of", "check_settings", "non_finite", "rows_sha256",
           "tensors_sha256", "finite_or_none"]

CHECKPOINT_SUFFIX = ".train-checkpoint.safetensors"
_WAY_OUT = "delete it to start over"


def checkpoint_path(base: Path) -> Path:
    """Where the checkpoint of a run writing `base` (its adapter directory or program) goes."""
    return Path(str(base).rstrip("/") + CHECKPOINT_SUFFIX)


@dataclass(frozen=True)
class Checkpoint:
    tensors: dict[str, Tensor]
    step: int
    run_id: str
    seq: int
    losses: list[float | None]
    settings: dict[str, Any] | None  # None: written by something else (an app), cannot be verified


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def save_checkpoint(path: Path, tensors: dict[str, Tensor], *, step: int, run_id: str, seq: int,
                    losses: Iterable[float | None], settings: dict[str, Any]) -> None:
    from safetensors.torch import save

    meta = {"step": step, "run_id": run_id, "seq": seq, "settings": settings,
            "losses": [None if x is None else finite_or_none(x) for x in losses]}
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata={"meta": json.dumps(meta, sort_keys=True)})
    atomic_write_bytes(path, data)


def read_checkpoint(path: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors and the raw meta of a checkpoint file; BadInput ("delete it to start over") when it
    is not one (unreadable, truncated, not safetensors, no meta)."""
    from safetensors.torch import load

    from toolchain.inputs import read_input

    raw = read_input(Path(path), what=f"checkpoint {path}")
    try:
        tensors = load(raw)
        header_len = int.from_bytes(raw[:8], "little")
        meta = json.loads(json.loads(raw[8:8 + header_len])["__metadata__"]["meta"])
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type; every failure means the same
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise BadInput(f"checkpoint {path} is not a readable checkpoint ({reason}); {_WAY_OUT}") from None
    if not isinstance(meta, dict):
        raise BadInput(f"checkpoint {path} has no run record; {_WAY_OUT}")
    return tensors, meta


def load_checkpoint(path: Path) -> Checkpoint:
    """`read_checkpoint`, with the meta checked field by field."""
    tensors, meta = read_checkpoint(path)
    step, run_id, seq, losses = (meta.get(k) for k in ("step", "run_id", "seq", "losses"))
    ok = (isinstance(step, int) and not isinstance(step, bool) and step >= 0 and isinstance(run_id, str) and run_id
          and isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 and isinstance(losses, list)
          and len(losses) == step and all(x is None or isinstance(x, (int, float)) for x in losses))
    if not ok:
        raise BadInput(f"checkpoint {path} has a malformed run record (step/run_id/seq/losses); {_WAY_OUT}")
    settings = meta.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise BadInput(f"checkpoint {path} has malformed run settings; {_WAY_OUT}")
    bad = non_finite(tensors)
    if bad is not None:
        raise BadInput(f"checkpoint {path}: tensor {bad!r} holds NaN or infinite values (the run diverged, or the file "
                       f"was damaged); {_WAY_OUT}, with a lower --lr")
    return Checkpoint(tensors, step, run_id, seq, [None if x is None else float(x) for x in losses], settings)


def load_program_state(path: Path, state_numel: int) -> Tensor:
    """The flat state of a `toolchain train --program` checkpoint (or an app's: the same file), read by
    `load_checkpoint` (its run record checked field by field, every tensor finite) and checked by
    `program_state_of`: what `eval` / `generate --resume-from` run with."""
    return program_state_of(load_checkpoint(path).tensors, state_numel, path)


def program_state_of(tensors: dict[str, Tensor], state_numel: int, where: Path | str) -> Tensor:
    """A program checkpoint's tensors as the flat state (a copy): exactly one float32 vector `state` of the
    program's `state_numel` values (`train --program --resume` and `load_program_state` both check it here)."""
    state = tensors.get("state")
    if state is None or state.dtype != torch.float32 or state.dim() != 1 or set(tensors) != {"state"}:
        raise BadInput(f"checkpoint {where} holds no flat float32 `state`; {_WAY_OUT}")
    if state.numel() != state_numel:
        raise BadInput(f"checkpoint {where} has {state.numel()} state values, the program {state_numel}; {_WAY_OUT}")
    return state.clone()


def non_finite(tensors: dict[str, Tensor]) -> str | None:
    """The first key whose floating-point tensor holds a NaN or an infinity (None: all finite)."""
    for key, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return key
    return None


# What each settings key means, for the message naming a difference.
_LABELS = {"trainer": "trainer", "program": "program (manifest sha256)", "model": "model", "arch": "model architecture",
           "weights": "frozen weights (sha256 of a sample)", "lora": "LoRA config",
           "start_adapter": "starting adapter (sha256)", "data": "training rows (sha256)", "optimizer": "optimizer",
           "shuffle_seed": "--shuffle seed", "plan": "LCSB plan", "options": "step options"}


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_difference(saved: Any, current: Any, where: str) -> str | None:
    if isinstance(saved, dict) and isinstance(current, dict) and where in ("optimizer", "lora", "arch", "options"):
        diffs = [f"`{key}` was {_short(saved.get(key))}, now {_short(current.get(key))}"
                 for key in sorted(saved.keys() | current.keys()) if saved.get(key) != current.get(key)]
        return f"{_LABELS[where]} {' and '.join(diffs)}" if diffs else None
    if saved != current:
        return f"{_LABELS.get(where, where)} was {_short(saved)}, now {_short(current)}"
    return None


def check_settings(path: Path, saved: dict[str, Any] | None, current: dict[str, Any]) -> None:
    """Raise BadInput naming the first setting in which the checkpoint's run differs from this one."""
    if saved is None:
        raise BadInput(f"checkpoint {path} records no run settings (not written by `toolchain train`), so it cannot "
                       f"be checked against this run; {_WAY_OUT}")
    current = json.loads(json.dumps(current))  # tuples -> lists, as stored
    for key in list(current) + sorted(saved.keys() - current.keys()):
        diff = _first_difference(saved.get(key), current.get(key), key)
        if diff is not None:
            raise BadInput(f"checkpoint {path} belongs to another run: {diff}; rerun with the same settings, or "
                           f"{_WAY_OUT}")


def rows_sha256(examples: Iterable[DataRow]) -> str:
    """sha256 of the training rows' token ids and labels (what a run trains on, wherever it came from)."""
    h = hashlib.sha256()
    for ex in examples:
        for t in (ex.input_ids, ex.labels):
            t = t.detach().to(torch.int64).contiguous()
            h.update(t.numel().to_bytes(8, "little"))
            h.update(t.numpy().tobytes())
    return h.hexdigest()


def tensors_sha256(tensors: Iterable[Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous()
        h.update(f"{t.dtype}{list(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
