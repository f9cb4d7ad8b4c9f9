"""`IncrementalTextDecoder`: generated ids to text as they arrive. The reference is the tokenizer's decode of all
the ids at once: the pieces must concatenate to it, and no piece may show half a character (a U+FFFD the whole
decode does not have there)."""

from __future__ import annotations

import pytest

from toolchain.text.decode_stream import GeneratedToken, IncrementalTextDecoder
from toolchain.text.qwen_vocab import qwen_tokenizer
from toolchain.text.tokenizer import ByteTokenizer

TEXTS = ["plain ascii", "héllo wörld", "日本語のテキスト", "emoji 🙂 and 👩‍👩‍👧 family", "mixed ∑ é 😀!"]


def _stream(tok, ids, hidden=()):
    dec = IncrementalTextDecoder(tok, hidden=hidden)
    tokens = [dec.push(i) for i in ids]
    return dec, tokens, dec.finish()


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokens_split_every_multibyte_character_and_the_pieces_are_the_whole_decode(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    dec, tokens, rest = _stream(tok, ids)
    assert "".join(t.text for t in tokens) + rest == tok.decode(ids) == text
    assert rest == ""
    assert [t.index for t in tokens] == list(range(len(ids))) and [t.id for t in tokens] == ids
    # a piece appears exactly when a character's last byte arrives: never a U+FFFD, never a character early
    for t in tokens:
        assert "\ufffd" not in t.text
    pos = 0
    for ch in text:
        n = len(ch.encode())
        assert [t.text for t in tokens[pos:pos + n]] == [""] * (n - 1) + [ch]
        pos += n
    assert dec.text == text


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_tokens_that_end_inside_a_character_wait_for_it(qwen, text):
    ids = qwen.encode(text)
    _, tokens, rest = _stream(qwen, ids)
    assert "".join(t.text for t in tokens) + rest == qwen.decode(ids) == text
    assert rest == "" and all("\ufffd" not in t.text for t in tokens)


def test_the_qwen_case_really_splits_a_character(qwen):
    """The precondition of the Qwen case: some of its tokens end inside a character (decoded alone, a U+FFFD),
    so the test above exercises the hold-back; and one of those tokens gets "" as its piece."""
    ids = qwen.encode("👩‍👩‍👧 日本語")
    assert any("\ufffd" in qwen.decode([i]) for i in ids)
    _, tokens, _ = _stream(qwen, ids)
    assert any(t.text == "" for t in tokens)


def test_a_trailing_partial_character_is_held_back_and_flushed_as_the_whole_decode_shows_it():
    tok = ByteTokenizer()
    ids = tok.encode("ok ") + list("🙂".encode())[:2]       # the generation stopped inside the emoji
    dec, tokens, rest = _stream(tok, ids)
    assert "".join(t.text for t in tokens) == "ok "
    assert rest == tok.decode(ids)[len("ok "):] and rest.startswith("\ufffd")
    assert dec.text == tok.decode(ids)
    assert dec.finish() == "", "finish twice adds nothing"
    with pytest.raises(RuntimeError):
        dec.push(65)


def test_an_invalid_byte_is_shown_once_the_next_id_arrives():
    """A byte that can never start a character (0xFF) decodes to U+FFFD; it is held while it is the last, shown
    with the next id: the pieces still equal the whole decode."""
    tok = ByteTokenizer()
    ids = [0xFF, ord("a"), 0xC3, 0xA9]
    _, tokens, rest = _stream(tok, ids)
    assert [t.text for t in tokens] == ["", "\ufffda", "", "é"]
    assert "".join(t.text for t in tokens) + rest == tok.decode(ids)


def test_hidden_ids_add_no_text_but_count():
    tok = ByteTokenizer()
    ids = tok.encode("hi") + [tok.EOS]
    _, tokens, rest = _stream(tok, ids, hidden={tok.EOS})
    assert tokens[-1] == GeneratedToken(2, tok.EOS, "")
    assert "".join(t.text for t in tokens) + rest == "hi"


def test_a_decode_that_rewrites_shown_text_repeats_nothing():
    """A tokenizer whose decode of more ids changes earlier text: no piece until it extends what was shown."""

    class Rewriting:
        def decode(self, ids):
            return {1: "a ", 2: "a,", 3: "a, b"}[len(ids)]

    _, tokens, rest = _stream(Rewriting(), [7, 8, 9])
    assert [t.text for t in tokens] == ["a ", "", ""] and rest == ""
