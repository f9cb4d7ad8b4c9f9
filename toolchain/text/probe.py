"""The evaluation gate's forgetting probe: a fixed 2.2 KB of general English (toolchain/assets/probe.txt, public
domain: the end of *Alice's Adventures in Wonderland* and of *Paradise Lost*, from the demo corpus's held-out part;
sources in toolchain/assets/README.md), tokenized with a program's tokenizer into at most PROBE_MAX_ROWS rows of
its seq_len. `toolchain export` writes them into the program directory as `probe.jsonl` (contract.PROBE_NAME); the
gate (training/gate.py) measures their loss at the start and on the kept adapter and flags forgetting."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from toolchain.text.dataset import DataRow

__all__ = ["PROBE_MAX_ROWS", "probe_text", "probe_rows", "probe_jsonl"]

# Each probe row costs a forward at the start and at the end of a run: 4 rows of seq 256 on Qwen2.5-0.5B hold the
# whole text (~520 Qwen tokens); the byte tokenizer's 2.2 K tokens fill more rows than that at short seq_len.
PROBE_MAX_ROWS = 4


def probe_text() -> str:
    return (Path(__file__).resolve().parents[1] / "assets" / "probe.txt").read_text(encoding="utf-8")


def probe_rows(tokenizer, seq_len: int, *, max_rows: int = PROBE_MAX_ROWS) -> list[DataRow]:
    """The probe as consecutive windows of `seq_len` tokens (BOS first when the tokenizer has one), every token a
    target; the last window may be shorter (at least 2 tokens)."""
    ids = tokenizer.encode(probe_text())
    bos = [tokenizer.bos_id] if getattr(tokenizer, "bos_id", None) is not None else []
    width = seq_len - len(bos)
    rows = []
    for start in range(0, len(ids), width):
        window = torch.tensor(bos + ids[start:start + width], dtype=torch.int64)
        if window.numel() >= 2:
            rows.append(DataRow(window, window.clone()))
        if len(rows) == max_rows:
            break
    return rows


def probe_jsonl(rows: list[DataRow]) -> str:
    """The rows as data_row.schema.json lines."""
    return "".join(json.dumps({"input_ids": r.input_ids.tolist(), "labels": r.labels.tolist()}) + "\n" for r in rows)
