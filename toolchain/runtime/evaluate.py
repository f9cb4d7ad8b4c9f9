"""Held-out loss on an exported program's own methods, forward only: `embed`, `block_forward` per layer,
`head_loss` (whose dx is discarded), with the LoRA state the caller passes (the trainer's live array,
a checkpoint's, or an adapter's: `training.session.program_state`).

The loss is the **mean next-token cross-entropy over all target tokens of the set** (every row's
targets pooled: a row with more targets weighs more), i.e. sum over rows of (row mean x row targets) /
total targets; a row's targets are its labels shifted by one (HF's convention), -100 ignored. Rows
without a target are skipped (`skipped_rows`). `row_mean_loss` is the unweighted mean of the rows'
losses, for comparison.

Why `head_loss` and no loss-only method: the loss-only head would save the second LM-head matmul
(`p @ E_j`, half the head's FLOPs; measured 2026-12-01, CHANGELOG.md) at the price of one more method to
export, whose XNNPACK lowering (one delegate per vocabulary chunk, ~150 at Qwen2.5's vocabulary) costs
about as much as head_loss's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from toolchain.text.dataset import DataRow, pad_row
from toolchain.errors import BadInput
from toolchain.program.directory import ProgramDir
from toolchain.runtime.loop import LayerLoop

__all__ = ["evaluate_program"]


def evaluate_program(pdir: ProgramDir, runtime, state: Tensor, examples: Sequence[DataRow], *,
                     loop: LayerLoop | None = None) -> dict:
    """{"loss": mean over all target tokens, "rows": rows evaluated, "tokens": target tokens,
    "row_mean_loss": mean of the rows' losses, "skipped_rows": rows without a target}.

    `runtime` needs embed, block_forward and head_loss (`open_runtime(pdir, use="eval")`); `state` (the
    flat float32 state) is read, never written."""
    loop = loop or LayerLoop(pdir, runtime)
    views = pdir.state_views(state)
    pad_id = pdir.pad_token_id
    total, tokens, rows, row_losses, skipped = 0.0, 0, 0, [], 0
    with torch.no_grad(), loop.driver():
        for i, ex in enumerate(examples):
            ids, labels = pad_row(ex, pdir.seq_len, pad_id, f"eval row {i + 1}")
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
