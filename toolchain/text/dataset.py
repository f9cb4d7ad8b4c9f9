"""Training data: JSONL rows (`shared_schemas/data_row.schema.json`) checked against a model, and the
bundled corpus as windows of byte tokens (tokenizers live in `toolchain.text.tokenizer`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.errors import BadInput
from toolchain.models.presets import ModelArch
from toolchain.schemas import validation_errors
from toolchain.text.tokenizer import ByteTokenizer
from toolchain.validate import decode_utf8, loads

__all__ = ["DataRow", "PaddedRow", "read_rows", "load_examples", "bundled_corpus", "bundled_examples", "text_examples",
           "demo_corpus", "pad_row"]


class DataRow(NamedTuple):
    """One training or evaluation example (a line of rows.jsonl as tensors)."""

    input_ids: Tensor  # [T] int64
    labels: Tensor     # [T] int64, -100 where ignored


class PaddedRow(NamedTuple):
    """A `DataRow` padded to a program's static length."""

    input_ids: Tensor  # [seq_len] int64, pad_id after the row
    labels: Tensor     # [seq_len] int64, -100 after the row


def pad_row(ex: DataRow, seq_len: int, pad_id: int, where: str) -> PaddedRow:
    """ids padded with pad_id, labels with -100, to seq_len (an exported program's static length).

    Raises:
        BadInput: the row is longer than seq_len (`where` names it).
    """
    t = ex.input_ids.shape[0]
    if t > seq_len:
        raise BadInput(f"{where} has {t} tokens; this program was exported for --seq-len {seq_len} "
                       f"(re-export with a longer --seq-len or shorten the rows)")
    ids = torch.full((seq_len,), pad_id, dtype=torch.int64)
    labels = torch.full((seq_len,), -100, dtype=torch.int64)
    ids[:t], labels[:t] = ex.input_ids, ex.labels
    return PaddedRow(ids, labels)


def read_rows(path: Path, *, limit: int | None = None) -> list[dict]:
    """Read and schema-check JSONL rows (blank lines skipped). `limit` stops after that many rows.

    Raises:
        BadInput: missing file, invalid JSON, or a row that breaks the schema (line number named).
    """
    from toolchain.inputs import open_input

    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise BadInput(f"data file {str(path)!r} does not exist")
    rows = []
    with open_input(path, what=f"data file {str(path)!r}") as f:
        for lineno, raw in enumerate(f, 1):
            line = decode_utf8(raw, f"{path}:{lineno}")   # UTF-8 or one error naming the line
            if not line.strip():
                continue
            row = loads(line, f"{path}:{lineno}")     # strict JSON: finite, int64, nesting limit
            errors = validation_errors("data_row", row)
            if errors:
                raise BadInput(f"{path}:{lineno}: {errors[0]}")
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise BadInput(f"data file {str(path)!r} has no rows")
    return rows


def _check_row(row: dict, arch: ModelArch, where: str) -> DataRow:
    ids = row["input_ids"]
    labels = row.get("labels", ids)
    if len(ids) > arch.max_positions:
        raise BadInput(f"{where}: row has {len(ids)} tokens, the model takes at most {arch.max_positions} positions")
    bad = next((t for t in ids if t >= arch.vocab), None)
    if bad is not None:
        raise BadInput(f"{where}: token id {bad} is out of range for a vocabulary of {arch.vocab}")
    if len(labels) != len(ids):
        raise BadInput(f"{where}: labels has {len(labels)} entries, input_ids has {len(ids)}")
    bad = next((t for t in labels if t >= arch.vocab or (t < 0 and t != -100)), None)
    if bad is not None:
        raise BadInput(f"{where}: label {bad} is neither a token id < {arch.vocab} nor -100")
    if all(t == -100 for t in labels[1:]):
        raise BadInput(f"{where}: row has no token to predict (every label after the first is -100)")
    return DataRow(torch.tensor(ids, dtype=torch.int64), torch.tensor(labels, dtype=torch.int64))


def load_examples(path: Path, arch: ModelArch, *, limit: int | None = None) -> list[DataRow]:
    """Rows of `path` as tensors, each checked against the model (ids, length, labels)."""
    rows = read_rows(path, limit=limit)
    return [_check_row(r, arch, f"{path}: row {i + 1}") for i, r in enumerate(rows)]


def bundled_corpus() -> str:
    """The small English corpus shipped with the package (toolchain/assets/corpus.txt)."""
    return (Path(__file__).resolve().parents[1] / "assets" / "corpus.txt").read_text()


def demo_corpus() -> str:
    """The demo model's 723 KB public-domain pretraining text (toolchain/assets/demo_corpus.txt)."""
    return (Path(__file__).resolve().parents[1] / "assets" / "demo_corpus.txt").read_text()


def bundled_examples(tokenizer: ByteTokenizer, *, seq_len: int) -> list[DataRow]:
    """The bundled corpus cut into consecutive windows of `seq_len` byte tokens (BOS first)."""
    return text_examples(bundled_corpus(), tokenizer, seq_len=seq_len)


def text_examples(text: str, tokenizer: ByteTokenizer, *, seq_len: int) -> list[DataRow]:
    """`text` cut into consecutive windows of `seq_len` byte tokens, each BOS + seq_len - 1 bytes, stride
    seq_len - 1 (a partial window at the end is left out)."""
    ids = tokenizer.encode(text, bos=False)
    examples = []
    for start in range(0, len(ids) - seq_len + 2, seq_len - 1):
        window = torch.tensor([tokenizer.BOS] + ids[start:start + seq_len - 1], dtype=torch.int64)
        examples.append(DataRow(window, window.clone()))
    return examples
