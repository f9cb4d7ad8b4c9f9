"""Held-out loss on an exported program's own methods, forward only: `embed`, `block_forward` per layer,
`head_loss` (whose dx is discarded), with the LoRA state the caller passes (the trainer's live array,
a checkpoint's, or an adapter's, see `state_from_adapter`).

The loss is the **mean next-token cross-entropy over all target tokens of the set** (every row's
targets pooled: a row with more targets weighs more), i.e. sum over rows of (row mean x row targets) /
total targets; a row's targets are its labels shifted by one (HF's convention), -100 ignored. Rows
without a target are skipped (`skipped_rows`). `row_mean_loss` is the unweighted mean of the rows'
losses, for comparison.

Why `head_loss` and no loss-only method: the loss-only head would save the second LM-head matmul
(`p @ E_j`, half the head's FLOPs; measured in docs/benchmarks.md) at the price of one more method to
export, whose XNNPACK lowering (one delegate per vocabulary chunk, ~150 at Qwen2.5's vocabulary) costs
about as much as head_loss's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from toolchain.dataset import Example, pad_example
from toolchain.errors import BadInput
from toolchain.program.spec import flat_state
from toolchain.runtime.loop import LayerLoop
from toolchain.program.directory import ProgramDir

__all__ = ["evaluate_program", "program_state", "state_from_adapter", "state_from_checkpoint"]


def evaluate_program(pdir: ProgramDir, runner, state: Tensor, examples: Sequence[Example], *,
                     loop: LayerLoop | None = None) -> dict:
    """{"loss": mean over all target tokens, "rows": rows evaluated, "tokens": target tokens,
    "row_mean_loss": mean of the rows' losses, "skipped_rows": rows without a target}.

    `runner` needs embed, block_forward and head_loss (`open_runner(pdir, use="eval")`); `state` (the
    flat float32 state) is read, never written."""
    loop = loop or LayerLoop(pdir, runner)
    views = pdir.state_views(state)
    pad_id = pdir.pad_token_id
    total, tokens, rows, row_losses, skipped = 0.0, 0, 0, [], 0
    with torch.no_grad():
        for i, ex in enumerate(examples):
            ids, labels = pad_example(ex, pdir.seq_len, pad_id, f"eval row {i + 1}")
            n = int((labels[1:] != -100).sum())
            if n == 0:
                skipped += 1
                continue
            x, _ = loop.forward(ids, (), views)
            loss = float(loop.call_method("head_loss", None, {"x": x, "labels": labels}, views)["loss"].reshape(-1)[0])
            total += loss * n
            tokens += n
            rows += 1
            row_losses.append(loss)
    if rows == 0:
        raise BadInput("no eval row has a target token (every label is -100 after the shift)")
    return {"loss": total / tokens, "rows": rows, "tokens": tokens,
            "row_mean_loss": sum(row_losses) / rows, "skipped_rows": skipped}


def state_from_adapter(pdir: ProgramDir, adapter_dir) -> Tensor:
    """A PEFT adapter directory as the program's flat state (its LoRA slices; optimizer moments zero).
    The adapter's config must match the program's (rank, alpha, targets, layers)."""
    from toolchain.program.spec import state_layout
    from toolchain.lora.peft_io import load_adapter

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


def state_from_checkpoint(pdir: ProgramDir, path) -> Tensor:
    """The flat state of a `toolchain train --program` checkpoint (safetensors; tensor `state`)."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input
        raise BadInput(f"{path} is not a training checkpoint ({e})") from None
    if "state" not in tensors:
        raise BadInput(f"{path} holds no `state` tensor ({', '.join(sorted(tensors)) or 'nothing'}); "
                       f"pass the checkpoint of a `toolchain train --program` run")
    state = tensors["state"].reshape(-1).to(torch.float32).clone()
    if not bool(torch.isfinite(state).all()):
        raise BadInput(f"{path} holds NaN or infinite state values (the run diverged, or the file was damaged); "
                       f"use an earlier checkpoint or adapter")
    if state.numel() != pdir.state_numel:
        raise BadInput(f"{path} has {state.numel()} state values, the program {pdir.state_numel}")
    return state


def program_state(pdir: ProgramDir, *, adapter=None, resume_from=None) -> Tensor:
    """The flat state to run with: an adapter's (`--adapter`), a training checkpoint's (`--resume-from`),
    or the program's initial one.

    Raises:
        BadInput: both given, or either does not fit the program.
    """
    if adapter is not None and resume_from is not None:
        raise BadInput("give either --adapter or --resume-from, not both")
    if adapter is not None:
        return state_from_adapter(pdir, adapter)
    if resume_from is not None:
        return state_from_checkpoint(pdir, resume_from)
    return pdir.state_init()
