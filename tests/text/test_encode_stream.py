"""Large inputs as streams (toolchain/text/encode_stream.py, text_data.write_text_rows): the ids of a text cut at
safe boundaries equal the ids of the whole text, on the shared tokenizer corpus and on adversarial inputs
(no newlines, runs of spaces, digits, CJK, emoji, marks, added-token text), with cuts forced every few
characters; the work is linear (characters examined counted); the files written equal the whole-file
path's byte for byte; empty and oversized inputs are refused the same way for every tokenizer."""

from __future__ import annotations

import functools
import hashlib
import json
import random
import unicodedata
from pathlib import Path

import pytest

from toolchain.text import encode_stream as stream_module
from toolchain.errors import BadInput
from toolchain.schemas import dumps
from toolchain.text.text_data import (ProgramText, make_rows, split_held_out, stream_windows, windows, write_rows,
                                 write_text_rows)
from toolchain.text.encode_stream import encode_stream, ids_json, segments, text_blocks
from toolchain.text.qwen_vocab import qwen_tokenizer
from toolchain.text.tokenizer import QWEN_TOKENIZER_JSON_SHA256, ByteTokenizer
from toolchain.validate import read_text

ROOT = Path(__file__).resolve().parents[2]
CORPUS = [json.loads(line) for line in (ROOT / "shared_schemas" / "tokenizer_corpus" / "cases.jsonl")
          .read_text(encoding="utf-8").splitlines()]

# Fragments that meet at every cut: each adversarial text is a seeded concatenation of them.
FRAGMENTS = ["the", " ", "  ", "   \t", "\n", "\r\n", "\n\n  ", "Don't", "'s", "'LL", "12345", "٣٤", "①",
             "你好", "，", "。", "世界", "日本語", "한국어", "\u1100\u1161", "\u1161", "e\u0301", "\u0301",
             "\u0323\u0301", "Å", "\u212b", "🙂", "👨‍👩‍👧", "🇫🇷", "!", "...", "<|im_end|>", "<|im_start|>",
             "<tool_call>", "</tool_call>", "<|endoftext", "|>", "_", "/", ">", "≮", "<\u0338", "\u00a0", "\u3000",
             "αβγ", "Ωμέγα", "\u0915\u093f", "\u0dd9\u0dcf", "\ufeff", "\x00", "\u200d", "$", "+", "a1", "x" * 40,
             " " * 60, "9" * 30]


def adversarial(seed: int, n: int = 400) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(FRAGMENTS) for _ in range(n))


SHAPES = {   # name -> text: the classes of the issue, small enough to encode whole many times
    "no-newlines": " ".join(CORPUS[i] for i in range(0, 40)).replace("\n", " "),
    "space-runs": ("word" + " " * 3000 + "next " + "\t " * 500 + "\n") * 3,
    "digits": "1234567890" * 500 + " 42 " + "٣" * 300,
    "cjk": "你好，世界！" * 300 + "日本語のテキスト" * 200 + "中文没有标点" * 100,
    "emoji": "🙂" * 2000 + " 👨‍👩‍👧 " * 300 + "🇫🇷🇩🇪" * 300,
    "mixed-scripts": "Hello мир 世界 مرحبا नमस्ते 안녕 γειά 123 🙂, " * 200,
    "marks": "e\u0301\u0323" * 500 + "\u1100\u1161\u11a8" * 300 + "a" + "\u0301" * 500,
    "added-tokens": "<|im_start|>user\nhi<|im_end|>\n<tool_call>x</tool_call><|endoftext|>" * 200,
}


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer()


def _stream(tok, text: str, tmp_path: Path, *, allow_special: bool, block_bytes: int, segment_chars: int) -> list[int]:
    path = tmp_path / "in.txt"
    path.write_bytes(text.encode("utf-8"))
    blocks = text_blocks(path, block_bytes=block_bytes)
    return [i for ids in encode_stream(tok, blocks, allow_special=allow_special, segment_chars=segment_chars)
            for i in ids]


def _whole(tok, text: str, allow_special: bool) -> list[int]:
    return tok.encode(text[1:] if text.startswith("\ufeff") else text, allow_special=allow_special)


@pytest.mark.parametrize("fast", [True, False], ids=["tiktoken", "tokenizers"])
@pytest.mark.parametrize("allow_special", [False, True], ids=["ordinary", "special"])
def test_streamed_ids_equal_whole_file_ids_on_the_corpus(qwen, tmp_path, monkeypatch, fast, allow_special):
    if not fast:
        monkeypatch.setattr(qwen, "_is_qwen", False)     # the tokenizers path with the same cuts
    text = "".join(CORPUS)
    for segment_chars, block_bytes in ((50, 97), (1000, 4096), (2**16, 2**20)):
        got = _stream(qwen, text, tmp_path, allow_special=allow_special, block_bytes=block_bytes,
                      segment_chars=segment_chars)
        assert got == _whole(qwen, text, allow_special), (segment_chars, block_bytes)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("allow_special", [False, True], ids=["ordinary", "special"])
def test_streamed_ids_equal_whole_file_ids_on_adversarial_shapes(qwen, tmp_path, name, allow_special):
    text = SHAPES[name]
    for segment_chars in (7, 301):
        got = _stream(qwen, text, tmp_path, allow_special=allow_special, block_bytes=113, segment_chars=segment_chars)
        assert got == _whole(qwen, text, allow_special), segment_chars


@pytest.mark.parametrize("seed", range(12))
def test_streamed_ids_equal_whole_file_ids_on_seeded_fragment_mixes(qwen, tmp_path, monkeypatch, seed):
    text = adversarial(seed)
    if seed % 2:
        monkeypatch.setattr(qwen, "_is_qwen", False)
    for allow_special in (False, True):
        got = _stream(qwen, text, tmp_path, allow_special=allow_special, block_bytes=61, segment_chars=5)
        assert got == _whole(qwen, text, allow_special), allow_special


def test_byte_tokenizer_streams_the_utf8_bytes(tmp_path):
    text = adversarial(99) + SHAPES["emoji"]
    got = _stream(ByteTokenizer(), text, tmp_path, allow_special=False, block_bytes=7, segment_chars=3)
    assert got == _whole(ByteTokenizer(), text, False)


def test_segments_rejoin_and_cut_only_where_safe():
    text = "".join(CORPUS[:200])
    parts = list(segments([text[i:i + 777] for i in range(0, len(text), 777)], frozenset("|_>/"), target=40))
    assert "".join(parts) == text and len(parts) > 100
    for a in parts[:-1]:
        assert stream_module._safe(a + "x", len(a), frozenset("|_>/")) or unicodedata.category(a[-1])[0] in "LN"


def test_no_cut_before_a_character_that_composes_with_what_precedes_it():
    """NFC(a + b) = NFC(a) + NFC(b) when b starts with a `_nfc_stable_start` character: none of them is the
    second half of a canonical composition, a mark, or a Hangul vowel or final."""
    seconds = set()
    for cp in range(0x110000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<") and len(d.split()) == 2:
            seconds.add(chr(int(d.split()[1], 16)))
    seconds |= {chr(c) for c in range(0x1161, 0x1176)} | {chr(c) for c in range(0x11A8, 0x11C3)}
    stable = [c for c in map(chr, range(0x110000)) if stream_module._nfc_stable_start(c)]
    assert len(stable) > 7000
    assert not [c for c in stable if c in seconds or unicodedata.combining(c)]
    for c in stable[::50]:
        for a in ("e", "e\u0301", "\u1100", "<", "\u0915", "A\u030a"):
            nfc = functools.partial(unicodedata.normalize, "NFC")
            assert nfc(a + c) == nfc(a) + nfc(c), (a, c)


def test_cut_search_is_linear_in_the_text(monkeypatch):
    """Each character is examined once: the characters the cut search looks at are at most the text's
    length plus one window per cut, on prose and on texts whose cuts are far apart."""
    examined = []
    real = stream_module.last_safe_cut

    def counting(text, lo, hi, interior=frozenset()):
        examined.append(max(0, min(hi, len(text) - 1) - max(lo, 1) + 1))
        return real(text, lo, hi, interior)
    monkeypatch.setattr(stream_module, "last_safe_cut", counting)
    for text in (" ".join(CORPUS) * 3, ("🙂" * 5000 + "a ") * 20, " " * 50_000 + "end", "1" * 30_000):
        examined.clear()
        blocks = [text[i:i + 1000] for i in range(0, len(text), 1000)]
        parts = list(segments(blocks, frozenset(), target=256, max_run=60_000))
        assert "".join(parts) == text
        assert sum(examined) <= len(text) + 256 * len(parts), (sum(examined), len(text))


def test_a_run_without_any_cut_longer_than_the_limit_is_refused(qwen, tmp_path):
    with pytest.raises(BadInput, match="characters in a row without a word boundary"):
        _ = [x for x in encode_stream(qwen, ["🙂" * 3000], allow_special=False, segment_chars=100, max_run=2000)]
    ids = [i for x in encode_stream(qwen, ["🙂" * 1999 + "a"], allow_special=False, segment_chars=100, max_run=2000)
           for i in x]
    assert ids == qwen.encode("🙂" * 1999 + "a", allow_special=False)


@pytest.mark.parametrize("at", [0, 5, 96, 97, 98, 1000])
@pytest.mark.parametrize("bad", [b"\xff", b"\xe4\xbd", b"\xed\xa0\x80"])
def test_utf8_errors_are_named_as_in_the_whole_file_reader(tmp_path, at, bad):
    good = ("line\n" + "你好🙂") * 200
    data = good.encode()[:at] + bad + good.encode()[at:]
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    try:
        read_text(path)
    except BadInput as e:
        want = str(e)
    else:       # the cut landed so that the bytes decode: then both must agree on the text
        assert "".join(text_blocks(path, block_bytes=97)) == data.decode()
        return
    with pytest.raises(BadInput) as got:
        list(text_blocks(path, block_bytes=97))
    assert str(got.value) == want


def test_oversized_input_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.txt"
    with open(path, "wb") as f:
        f.truncate(stream_module.MAX_TEXT_BYTES + 1)      # sparse: no disk used
    with pytest.raises(BadInput, match="more than the 268,435,456 bytes"):
        next(text_blocks(path))


def test_bom_is_dropped_only_at_the_start(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfab\xef\xbb\xbfc" * 50)
    assert "".join(text_blocks(path, block_bytes=5)) == ("\ufeffab\ufeffc" * 50)[1:]


@pytest.mark.parametrize("seq_len", [2, 3, 5, 9])
def test_stream_windows_equal_windows(seq_len):
    rng = random.Random(seq_len)
    for n in list(range(0, 30)) + [97, 200]:
        ids = list(range(n))
        cuts = sorted(rng.sample(range(n + 1), min(n + 1, rng.randrange(1, 6))))
        chunks = [ids[a:b] for a, b in zip([0] + cuts, cuts + [n])]
        assert list(stream_windows(chunks, seq_len)) == windows(ids, seq_len), (n, cuts)


def test_ids_json_is_schemas_dumps():
    for chunks, vocab in (([], 0), ([[]], 10), ([[5]], 6), ([[1, 2], [], [3, 151645]], 151665)):
        count: list[int] = []
        ids = [i for c in chunks for i in c]
        assert "".join(ids_json(chunks, count, vocab)) == dumps({"ids": ids, "tokens": len(ids)})
        assert count == [len(ids)]


def test_qwen_tokenizer_json_pin(qwen):
    assert hashlib.sha256(qwen.to_json().encode()).hexdigest() == QWEN_TOKENIZER_JSON_SHA256, \
        "tokenizers serializes the Qwen tokenizer differently: update QWEN_TOKENIZER_JSON_SHA256"
    assert qwen.is_qwen()


@pytest.mark.parametrize("held_out", [None, 0.25])
@pytest.mark.parametrize("kind", ["byte", "qwen2.5"])
def test_written_rows_equal_the_whole_file_path(qwen, tmp_path, kind, held_out):
    tok = ByteTokenizer() if kind == "byte" else qwen
    program = ProgramText(tok, 17, tok.vocab_size)
    src = tmp_path / "in.txt"
    src.write_text("\ufeff" + " ".join(CORPUS[:300]), encoding="utf-8")
    held_path = tmp_path / "held.jsonl" if held_out else None
    got = write_text_rows(program, src, tmp_path / "rows.jsonl", held_out=held_out, held_out_out=held_path, seed=3)
    rows = make_rows(program, text=src)
    train, held = split_held_out(rows, held_out, 3) if held_out else (rows, [])
    write_rows(tmp_path / "want.jsonl", train)
    assert (tmp_path / "rows.jsonl").read_bytes() == (tmp_path / "want.jsonl").read_bytes()
    if held_out:
        write_rows(tmp_path / "want-held.jsonl", held)
        assert held_path.read_bytes() == (tmp_path / "want-held.jsonl").read_bytes()
    assert (got.rows, got.tokens, got.train, got.held) == (len(rows), sum(len(r["input_ids"]) for r in rows),
                                                             len(train), len(held))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.txt", "rows.jsonl", "want.jsonl"] + (
        ["held.jsonl", "want-held.jsonl"] if held_out else []))      # no spool left


@pytest.mark.parametrize("content", [b"", b"\xef\xbb\xbf"], ids=["empty", "bom-only"])
@pytest.mark.parametrize("kind", ["byte", "qwen2.5"])
def test_a_text_without_a_token_is_refused_by_every_tokenizer(qwen, tmp_path, kind, content):
    tok = ByteTokenizer() if kind == "byte" else qwen
    src = tmp_path / "in.txt"
    src.write_bytes(content)
    with pytest.raises(BadInput, match="no token to train on"):
        write_text_rows(ProgramText(tok, 16, tok.vocab_size), src, tmp_path / "rows.jsonl")
    with pytest.raises(BadInput, match="no token to train on"):
        make_rows(ProgramText(tok, 16, tok.vocab_size), text=src)
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize("vocab, row", [(200, 1), (257, 3)], ids=["first-row", "last-row"])
def test_an_id_outside_the_vocabulary_is_refused_naming_its_row(tmp_path, vocab, row):
    src = tmp_path / "in.txt"
    src.write_text("x" * 40, encoding="utf-8")         # [BOS] + 40 bytes + [EOS]: 3 rows of 17
    with pytest.raises(BadInput, match=f"row {row}: token id 25[67] is outside the model's vocabulary of {vocab}"):
        write_text_rows(ProgramText(ByteTokenizer(), 17, vocab), src, tmp_path / "rows.jsonl")
    assert not (tmp_path / "rows.jsonl").exists()
