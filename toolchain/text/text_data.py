"""The user's own text as training rows (`shared_schemas/data_row.schema.json`), for a program.

Plain text (`text_rows`): the file is one document, tokenized as `[BOS] + ids + [EOS]` (BOS only
for tokenizers that have one: byte yes, Qwen no; EOS `<|endoftext|>` for Qwen, as between
pre-training documents). The stream is cut into windows of `seq_len` tokens with a stride of
`seq_len - 1`: consecutive windows share one token, the last of one being the first of the next,
so every token after the first is a target exactly once (a window's first token is never a target).
The last window is shorter when the stream runs out (the apps pad it); a remainder of a single
token is already a target of the previous window and is dropped.

A file is read, tokenized, cut and written as a stream (`write_text_rows`, `toolchain.text.encode_stream`):
memory does not grow with its size and the ids are those of the whole file at once. A file whose text
has no token (empty, or only a byte-order mark) is refused, whatever the tokenizer.

Chat (`chat_rows`): one conversation `{"messages": [{"role", "content"}, ...]}` per JSONL line
through the Qwen chat template (`toolchain.text.chat_template.apply_chat_template`); labels are the ids on
the assistant's tokens (each assistant content and its `<|im_end|>`) and -100 elsewhere. A
conversation longer than `seq_len` is an error naming its line (truncating would silently drop the
targets at its end).

Held-out split (`split_held_out`): n_held = floor(fraction * rows + 0.5) rows, the first n_held
entries of `toolchain.text.shuffle.permutation(rows, seed)`, both parts kept in file order; the same
rows, seed and fraction always give the same split, on the host and in the apps (which implement
the same permutation; `shared_schemas/data_corpus/`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from toolchain import validate
from toolchain.atomic import atomic_write_chunks, atomic_write_text, discarded_on_stop
from toolchain.contract import read_text_fields
from toolchain.errors import BadInput
from toolchain.schemas import validation_errors
from toolchain.text.shuffle import permutation
from toolchain.text.chat_template import apply_chat_template
from toolchain.text.tokenizer import Tokenizer
from toolchain.text.tokenizer_source import load_tokenizer

__all__ = ["ProgramText", "read_text", "text_rows", "chat_rows", "split_held_out", "write_rows", "program_text",
           "make_rows", "windows", "stream_windows", "write_text_rows", "TextRows", "row_line"]

IGNORE = -100


@dataclass(frozen=True)
class ProgramText:
    """What `data` needs from a program: its tokenizer, T and the model's vocabulary."""

    tokenizer: Tokenizer
    seq_len: int
    vocab: int


def read_text(path: Path) -> str:
    """A UTF-8 text file, a leading BOM dropped.

    Raises:
        BadInput: missing, or not UTF-8 (line and byte of the first bad byte named).
    """
    text = validate.read_text(path)
    return text[1:] if text.startswith("\ufeff") else text


def program_text(program: Path) -> ProgramText:
    """The tokenizer, seq_len and vocabulary of an exported program directory (no torch import).

    Raises:
        BadInput: not a program directory, or one exported without a tokenizer.
    """
    fields = read_text_fields(Path(program))
    return ProgramText(load_tokenizer(program), fields.seq_len, fields.vocab)


def windows(ids: list[int], seq_len: int) -> list[list[int]]:
    """`ids` cut into windows of at most `seq_len`, stride `seq_len - 1` (see the module docstring)."""
    if seq_len < 2:
        raise BadInput(f"seq_len must be at least 2, got {seq_len}")
    return [ids[start:start + seq_len] for start in range(0, max(len(ids) - 1, 0), seq_len - 1)]


def stream_windows(chunks: Iterable[list[int]], seq_len: int) -> Iterator[list[int]]:
    """`windows` of the concatenation of `chunks`, each yielded as soon as it is complete."""
    if seq_len < 2:
        raise BadInput(f"seq_len must be at least 2, got {seq_len}")
    buf: list[int] = []
    for ids in chunks:
        buf += ids
        start = 0
        while len(buf) - start >= seq_len:   # a full window always starts before the last token
            yield buf[start:start + seq_len]
            start += seq_len - 1
        del buf[:start]
    if len(buf) >= 2:                        # a remainder of one token is the last window's last target
        yield buf


def _document(tokenizer: Tokenizer, ids: Iterable[list[int]], where: str) -> Iterator[list[int]]:
    """[BOS] + ids + [EOS], refusing a text without a token (the same rule for every tokenizer)."""
    if tokenizer.bos_id is not None:
        yield [tokenizer.bos_id]
    n = 0
    for chunk in ids:
        n += len(chunk)
        yield chunk
    if n == 0:
        raise BadInput(f"{where} has no token to train on (it is empty, or only a byte-order mark)")
    yield [tokenizer.eos_id]


def text_rows(text: str, tokenizer: Tokenizer, seq_len: int, *, where: str = "the text") -> list[dict]:
    """Rows of plain `text` (labels = input_ids, so no labels field).

    Raises:
        BadInput: a text without a token (`where` names it).
    """
    ids = _document(tokenizer, [tokenizer.encode(text, allow_special=False)], where)
    return [{"schema_version": 1, "input_ids": w} for w in stream_windows(ids, seq_len)]


def row_line(input_ids: list[int]) -> str:
    """A text row as its JSONL line (what `write_rows` writes for it, without building the dict)."""
    return '{"input_ids":[' + ",".join(map(str, input_ids)) + '],"schema_version":1}\n'


@dataclass(frozen=True)
class TextRows:
    rows: int
    tokens: int
    train: int
    held: int


def _checked_lines(windows_: Iterable[list[int]], vocab: int, where: str, counts: list[int]) -> Iterator[str]:
    """`row_line` of each window (ids < vocab spelled from a table), checked as `check_rows` does: the first row against the schema (the others
    are built the same way), every id against the vocabulary (one `max` per row: jsonschema on every id
    was 99% of the time of `data --text`)."""
    from toolchain.text.encode_stream import spelling

    spell = spelling(vocab)     # 2x faster than str() per id on real Qwen ids, 3.5x for bytes
    for i, w in enumerate(windows_, 1):
        if i == 1:
            check_rows([{"schema_version": 1, "input_ids": w}], vocab, where)
        elif max(w) >= vocab:
            bad = next(t for t in w if t >= vocab)
            raise BadInput(f"{where}: row {i}: token id {bad} is outside the model's vocabulary of {vocab}")
        counts[0] += 1
        counts[1] += len(w)
        yield '{"input_ids":[' + ",".join(map(spell, w)) + '],"schema_version":1}\n'


def write_text_rows(program: ProgramText, text: Path, out: Path, *, held_out: float | None = None,
                    held_out_out: Path | None = None, seed: int = 0,
                    on_bytes: Callable[[int], None] | None = None) -> TextRows:
    """Rows of the text file `text` written to `out` (and a held-out part to `held_out_out`) as a stream:
    the same rows and files as `make_rows` + `split_held_out` + `write_rows`, in memory that does not grow
    with the file (`toolchain.text.encode_stream`). Outputs are written atomically; on any error none is.

    Raises:
        BadInput: as `encode_stream.text_blocks` and `text_rows`, or a row outside the model's vocabulary.
    """
    from toolchain.text.encode_stream import encode_stream, text_blocks

    ids = encode_stream(program.tokenizer, text_blocks(text, on_bytes=on_bytes), allow_special=False)
    counts = [0, 0]
    lines = _checked_lines(stream_windows(_document(program.tokenizer, ids, str(text)), program.seq_len),
                           program.vocab, str(text), counts)
    if held_out is None:
        atomic_write_chunks(out, lines)
        return TextRows(counts[0], counts[1], counts[0], 0)
    out = Path(out)
    fd, spool = tempfile.mkstemp(dir=out.resolve().parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp")
    with discarded_on_stop(Path(spool)):
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.writelines(lines)
            n = counts[0]
            held = set(permutation(n, seed)[:_held_count(n, held_out)])
            for path, keep in ((out, False), (held_out_out, True)):
                with open(spool, encoding="utf-8") as f:
                    atomic_write_chunks(path, (line for i, line in enumerate(f) if (i in held) == keep))
        finally:
            os.unlink(spool)
    return TextRows(n, counts[1], n - len(held), len(held))


def chat_rows(path: Path, tokenizer: Tokenizer, seq_len: int) -> list[dict]:
    """Rows of a JSONL file of conversations, one per non-blank line.

    Raises:
        BadInput: a line that is not JSON, not `{"messages": [...]}`, has no assistant token, or is
            longer than `seq_len` (line number named).
    """
    rows = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        doc = validate.loads(line, where)
        if not isinstance(doc, dict) or set(doc) != {"messages"}:
            raise BadInput(f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}}')
        try:
            ids, mask = apply_chat_template(tokenizer, doc["messages"])
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        if not any(mask):
            raise BadInput(f"{where}: the conversation has no assistant message with a token to learn")
        if len(ids) > seq_len:
            raise BadInput(f"{where}: the conversation is {len(ids)} tokens, longer than the program's seq_len "
                           f"{seq_len}; shorten or split it, or export with a larger --seq-len")
        rows.append({"schema_version": 1, "input_ids": ids,
                     "labels": [t if m else IGNORE for t, m in zip(ids, mask)]})
    if not rows:
        raise BadInput(f"{path} has no conversation")
    return rows


def split_held_out(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out): floor(fraction * len(rows) + 0.5) rows held out, chosen by `seed`, file order kept.

    Raises:
        BadInput: a fraction that holds out no row or every row.
    """
    held = set(permutation(len(rows), seed)[:_held_count(len(rows), fraction)])
    return ([r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held])


def _held_count(n: int, fraction: float) -> int:
    if not 0 < fraction < 1:
        raise BadInput(f"--held-out must be a fraction strictly between 0 and 1, got {fraction}")
    n_held = math.floor(fraction * n + 0.5)
    if n_held < 1 or n_held >= n:
        raise BadInput(f"--held-out {fraction} of {n} rows holds out {n_held}; need at least one row on "
                       f"each side (more text, or another fraction)")
    return n_held


def check_rows(rows: list[dict], vocab: int, where: str) -> None:
    """Each row against the data_row schema and the model's vocabulary (before anything is written)."""
    for i, row in enumerate(rows, 1):
        errors = validation_errors("data_row", row)
        if errors:
            raise BadInput(f"{where}: row {i}: {errors[0]}")
        bad = next((t for t in row["input_ids"] if t >= vocab), None)
        if bad is not None:
            raise BadInput(f"{where}: row {i}: token id {bad} is outside the model's vocabulary of {vocab}")


def write_rows(path: Path, rows: list[dict]) -> None:
    """JSONL, one compact row per line, written atomically."""
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows))


def make_rows(program: ProgramText, *, text: Path | None = None, chat: Path | None = None) -> list[dict]:
    """Rows of a text file or a chat JSONL for `program`, checked (schema, vocabulary)."""
    if (text is None) == (chat is None):
        raise BadInput("give exactly one of --text FILE or --chat FILE.jsonl")
    if text is not None:
        rows = text_rows(read_text(text), program.tokenizer, program.seq_len, where=str(text))
    else:
        rows = chat_rows(chat, program.tokenizer, program.seq_len)
    check_rows(rows, program.vocab, str(text or chat))
    return rows
