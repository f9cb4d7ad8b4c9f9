"""Large text files in bounded memory and linear time: read in blocks, cut at safe boundaries, encoded
segment by segment, with ids equal to encoding the whole file at once.

Why it is needed (issue 27): `data --text` on 50 MB ran at 0.15 MB/s in 1.4 GB. The time went into
checking every token id of every row with jsonschema (99% of the byte tokenizer's run) and, for Qwen,
into Hugging Face's whole-string encode (0.4-3 MB/s, slower the longer the string: 1.6 M digits 0.36 MB/s,
1.6 M emoji 0.64 MB/s); the memory into holding the text, every id and every row at once.

A cut at position p of the text is safe for the Qwen pre-tokenizer (`QWEN_PATTERN`, NFC, added tokens)
when:

- `text[p-1]` is a letter (\\p{L}) and `text[p]` is not, or `text[p-1]` is a number (\\p{N}): no
  alternative of the pattern matches a letter followed by a non-letter (letters only end a match) or
  continues after a \\p{N} (a number is always a one-character piece); the one lookahead, `\\s+(?!\\S)`,
  looks at the character after a run of white space, never after a letter or number. So the pieces of
  `text[:p]` and `text[p:]` are the pieces of `text`, and BPE works within a piece.
- `text[p]` starts an NFC-stable boundary (NFC(a + b) = NFC(a) + NFC(b)): ASCII, or punctuation, a
  symbol or a separator without a canonical decomposition (a starter that composes with nothing before
  it). Marks, Hangul vowels and the like compose backwards, so no cut is made before them.
- with added tokens read as tokens, `text[p]` is not a character inside any added token (for Qwen:
  letters and `|`, `_`, `>`, `/`), so no occurrence of one is cut.

The byte tokenizer is safe at every character. A tokenizer whose pipeline is not Qwen's (an arbitrary
`tokenizer.json`) is encoded whole, since nothing is known about its boundaries. Text with no safe cut in
`MAX_RUN_CHARS` characters (a megabyte of spaces, emoji or letters without a break: one BPE "word") is
refused rather than held and encoded whole. `tests/text/test_encode_stream.py` checks the ids against the
whole-file encode on the tokenizer corpus and on such inputs.

Segments of the exact Qwen2.5 tokenizer are encoded by tiktoken over the same ranks (`stream_encoder`),
about 12 MB/s against `tokenizers`' 1-3 MB/s; the two are held equal by `tests/text/test_tokenizer.py`.
"""

from __future__ import annotations

import functools
import json
import os
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from toolchain.errors import BadInput
from toolchain.text.qwen_vocab import QWEN_ADDED_TOKENS, QWEN_PATTERN, QWEN_SPECIAL_START, read_qwen_ranks
from toolchain.text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, byte_symbols

__all__ = ["MAX_TEXT_BYTES", "MAX_RUN_CHARS", "BLOCK_BYTES", "SEGMENT_CHARS", "text_blocks", "segments",
           "last_safe_cut", "stream_encoder", "encode_stream", "ids_json", "spelling"]

MAX_TEXT_BYTES = 256 * 2**20   # 256 MiB: about a minute at 5 MB/s; more text than a phone trains on
MAX_RUN_CHARS = 2**20          # characters without a safe cut (one pre-token) held at most
BLOCK_BYTES = 2**20            # read size
SEGMENT_CHARS = 2**16          # target segment length handed to the tokenizer


def text_blocks(path: Path, *, on_bytes: Callable[[int], None] | None = None,
                block_bytes: int = BLOCK_BYTES) -> Iterator[str]:
    """The text of a UTF-8 file in blocks of about `block_bytes`, a leading BOM dropped.

    Raises:
        BadInput: larger than `MAX_TEXT_BYTES`, or not UTF-8 (line and offset of the first bad byte,
            as `toolchain.validate.read_text` says it).
    """
    from toolchain.inputs import open_input

    path = Path(path)
    f = open_input(path)
    size = os.fstat(f.fileno()).st_size
    if size > MAX_TEXT_BYTES:
        f.close()
        raise _too_large(path, size)
    offset, lines, carry, first = 0, 0, b"", True
    with f:
        while True:
            block = f.read(block_bytes)
            data = carry + block
            end = len(data) if not block else _complete(data)
            text = _decode(data[:end], path, offset, lines)
            if first and text:
                text, first = (text[1:] if text.startswith("\ufeff") else text), False
            lines += data.count(b"\n", 0, end)
            offset += end
            if offset > MAX_TEXT_BYTES:          # a file that grew, or a pipe
                raise _too_large(path, offset)
            carry = data[end:]
            if on_bytes is not None and end:
                on_bytes(end)
            if text:
                yield text
            if not block:
                return


def _too_large(path: Path, size: int) -> BadInput:
    mib = f" ({MAX_TEXT_BYTES // 2**20} MiB)" if MAX_TEXT_BYTES % 2**20 == 0 else ""
    return BadInput(f"{path} is {size:,} bytes, more than the {MAX_TEXT_BYTES:,} bytes{mib} of text read at "
                    f"once; split it and convert the parts separately (their rows files can be concatenated)")


def _complete(data: bytes) -> int:
    """The length of `data` without a UTF-8 sequence cut off at its end."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:            # a continuation byte: look further back for the lead
            continue
        need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        return len(data) - back if need > back else len(data)
    return len(data)


def _decode(data: bytes, path: Path, offset: int, lines: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines + data.count(b"\n", 0, e.start) + 1
        raise BadInput(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, offset "
                       f"{offset + e.start}); save it as UTF-8") from None


# -- safe cuts -----------------------------------------------------------------------------------------
@functools.cache
def _candidates():
    import regex  # tiktoken's dependency

    return regex.compile(r"(?<=\p{L})(?=\P{L})|(?<=\p{N})(?=.)", regex.REVERSE | regex.DOTALL)


def _nfc_stable_start(c: str) -> bool:
    if c < "\x80":
        return True
    category = unicodedata.category(c)
    decomposition = unicodedata.decomposition(c)
    return category[0] in "PSZ" and (not decomposition or decomposition.startswith("<"))


def _safe(text: str, p: int, interior: frozenset[str]) -> bool:
    before, after = unicodedata.category(text[p - 1]), text[p]
    if before[0] == "L":
        ok = unicodedata.category(after)[0] != "L"
    else:
        ok = before[0] == "N"
    return ok and _nfc_stable_start(after) and after not in interior


def last_safe_cut(text: str, lo: int, hi: int, interior: frozenset[str] = frozenset()) -> int | None:
    """The largest safe cut p with lo <= p <= hi (0 < p < len(text)), or None (see the module docstring).
    Candidates come from a reverse regex search; Python's `unicodedata` has the last word on each."""
    lo, hi = max(lo, 1), min(hi, len(text) - 1)
    search = _candidates().search
    while hi >= lo:
        m = search(text, lo, hi + 1)
        if m is None:
            return None
        p = m.start()
        if _safe(text, p, interior):
            return p
        hi = p - 1
    return None


def segments(blocks: Iterable[str], interior: frozenset[str] | None, *, target: int = SEGMENT_CHARS,
             max_run: int = MAX_RUN_CHARS) -> Iterator[str]:
    """`blocks` re-cut into segments of about `target` characters at safe cuts (every segment but the
    last ends at one). `interior=None`: every position is safe (the byte tokenizer).

    Raises:
        BadInput: `max_run` characters without a safe cut.
    """
    buf, checked = "", 1           # positions 0 < p < checked of buf are no safe cut (each is looked at once)
    for block in blocks:
        buf += block
        while len(buf) > target:
            if interior is None:
                yield buf[:target]
                buf = buf[target:]
                continue
            hi = min(len(buf) - 1, max(target, checked + target))
            p = last_safe_cut(buf, checked, hi, interior)
            if p is None:
                checked = hi + 1
                if hi < len(buf) - 1:
                    continue
                if len(buf) > max_run:
                    raise BadInput(f"the text has {len(buf):,} characters in a row without a word boundary (a run "
                                   f"of spaces, symbols or letters longer than {max_run:,}, which the tokenizer "
                                   f"would take as one word); break it up")
                break
            yield buf[:p]
            buf, checked = buf[p:], max(1, hi + 1 - p)
    if buf:
        yield buf


# -- encoders -----------------------------------------------------------------------------------------------
def stream_encoder(tokenizer: Tokenizer, *, allow_special: bool):
    """How `encode_stream` encodes a text with `tokenizer`, segment by segment: (encode, interior).

    `interior` is None when every position is a safe cut (byte), the characters no cut may precede
    (those inside an added token, when added-token text is read as tokens) when the pipeline is Qwen's
    (NFC + `QWEN_PATTERN` + byte level), and False when boundaries are unknown (encode the whole text).
    `encode` is tiktoken over the same ranks for the exact Qwen2.5 tokenizer (12-14 MB/s against 1-3 MB/s
    for `tokenizers` on this machine; `tests/text/test_tokenizer.py` holds them equal), else `tokenizer.encode`.
    """
    if isinstance(tokenizer, ByteTokenizer):
        return (lambda text: list(text.encode())), None
    if not isinstance(tokenizer, HFTokenizer) or not _qwen_pipeline(tokenizer):
        return (lambda text: tokenizer.encode(text, allow_special=allow_special)), False
    if tokenizer.is_qwen():     # its added tokens are QWEN_ADDED_TOKENS, none lstrip / rstrip / single_word
        added = [content for content, _ in QWEN_ADDED_TOKENS]
    else:
        decoded = list(tokenizer._tk.get_added_tokens_decoder().values())
        if allow_special and any(t.lstrip or t.rstrip or t.single_word for t in decoded):
            return (lambda text: tokenizer.encode(text, allow_special=allow_special)), False
        added = [t.content for t in decoded]
    interior = frozenset(c for content in added for c in content[1:]) if allow_special else frozenset()
    slow = functools.partial(tokenizer.encode, allow_special=allow_special)
    if not tokenizer.is_qwen() or (allow_special and tokenizer.kind != "qwen2.5"):
        return slow, interior       # (kind huggingface matches added tokens before NFC, tiktoken here after)
    if tokenizer._tiktoken is None:
        tokenizer._tiktoken = _tiktoken_qwen(tokenizer)
    enc = tokenizer._tiktoken

    def encode(text: str) -> list[int]:
        if len(text) > 2**17:     # a long run without a cut: tiktoken's merge loop is quadratic in a piece's length
            return slow(text)
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        return enc.encode(text, allowed_special="all") if allow_special else enc.encode_ordinary(text)
    return encode, interior


def _qwen_pipeline(tokenizer: HFTokenizer) -> bool:
    """NFC + Qwen's split + byte level, read from the tokenizer.json (whatever the manifest's kind says)."""
    if tokenizer.is_qwen():
        return True
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import Regex, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    ref = HfTokenizer(BPE())
    ref.normalizer = normalizers.NFC()
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    want, got = json.loads(ref.to_str()), json.loads(tokenizer.to_json())
    return all(got.get(k) == want[k] for k in ("normalizer", "pre_tokenizer"))


def _tiktoken_qwen(tokenizer: HFTokenizer):
    """tiktoken over the tokenizer's own vocabulary (ranks = ids), pattern and added tokens."""
    import tiktoken

    try:    # the ranks its tokenizer.json was built from (`is_qwen`), 0.4 s; spelled back from the vocabulary: 4 s
        ranks = tokenizer._ranks or read_qwen_ranks()
    except BadInput:
        table = {ord(s): b for b, s in enumerate(byte_symbols())}
        ranks = {token.translate(table).encode("latin-1"): rank
                 for token, rank in tokenizer._tk.get_vocab(with_added_tokens=False).items()}
    if tokenizer.is_qwen():
        specials = {content: QWEN_SPECIAL_START + i for i, (content, _) in enumerate(QWEN_ADDED_TOKENS)}
    else:
        specials = {t.content: i for i, t in tokenizer._tk.get_added_tokens_decoder().items()}
    return tiktoken.Encoding("qwen2.5", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def encode_stream(tokenizer, blocks: Iterable[str], *, allow_special: bool, segment_chars: int = SEGMENT_CHARS,
                  max_run: int | None = None) -> Iterator[list[int]]:
    """The ids of the text in `blocks`, segment by segment; their concatenation is
    `tokenizer.encode(whole text, allow_special=allow_special)`.

    Raises:
        BadInput: `max_run` characters without a safe cut (`segments`).
    """
    encode, interior = stream_encoder(tokenizer, allow_special=allow_special)
    if interior is False:                       # boundaries unknown: the whole text at once
        yield encode("".join(blocks))
        return
    for segment in segments(blocks, interior, target=segment_chars, max_run=max_run or MAX_RUN_CHARS):
        yield encode(segment)


def spelling(vocab: int) -> Callable[[int], str]:
    """`str` of a token id, from a table when the vocabulary is small enough (2x faster on real Qwen ids,
    whose frequent ones stay in cache; 8 MB for Qwen's 151,665)."""
    return [str(i) for i in range(vocab)].__getitem__ if vocab <= 2**18 else str


def ids_json(chunks: Iterable[list[int]], count: list[int], vocab: int = 0) -> Iterator[str]:
    """`toolchain.schemas.dumps({"ids": ids, "tokens": n})` of the concatenated `chunks`, piece by piece
    (`count` gets n appended at the end; every id < `vocab`, when given, spelled from a table)."""
    spell = spelling(vocab) if vocab else str
    yield '{\n  "ids": ['
    n = 0
    for ids in chunks:
        if ids:
            yield ("," if n else "") + "\n    " + ",\n    ".join(map(spell, ids))
            n += len(ids)
    yield ("\n  ]" if n else "]") + f',\n  "tokens": {n}\n}}\n'
    count.append(n)
