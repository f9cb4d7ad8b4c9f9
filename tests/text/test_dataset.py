"""Training data: JSONL rows checked against the schema and the model; the byte tokenizer; the
bundled corpus."""

from __future__ import annotations

import json

import pytest
import torch

from toolchain.text.dataset import bundled_corpus, bundled_examples, demo_corpus, load_examples, read_rows, text_examples
from toolchain.text.tokenizer import ByteTokenizer
from toolchain.errors import BadInput
from toolchain.models import get_preset
from toolchain.schemas import SCHEMA_DIR, validation_errors

TINY = get_preset("tiny")


def _write(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_rows_become_examples(tmp_path):
    path = _write(tmp_path, [{"input_ids": [1, 2, 3]}, "", {"input_ids": [4, 5], "labels": [-100, 5], "text": "x"}])
    ex = load_examples(path, TINY)
    assert len(ex) == 2
    assert ex[0].input_ids.tolist() == [1, 2, 3] and ex[0].labels.tolist() == [1, 2, 3]
    assert ex[1].labels.tolist() == [-100, 5]
    assert ex[0].input_ids.dtype == ex[0].labels.dtype == torch.int64
    assert len(load_examples(path, TINY, limit=1)) == 1


def test_limit_stops_before_later_bad_lines(tmp_path):
    path = _write(tmp_path, [{"input_ids": [1, 2]}, "{broken"])
    assert len(read_rows(path, limit=1)) == 1
    with pytest.raises(BadInput):
        read_rows(path)


@pytest.mark.parametrize(("rows", "match"), [
    (["{not json"], r"data.jsonl:1: not valid JSON"),
    ([{"input_ids": [1, 2]}, "[1, 2"], r"data.jsonl:2: not valid JSON"),
    ([{"input_ids": [1]}], r":1: input_ids"),
    ([{"input_ids": [1, -2]}], r":1: input_ids/1"),
    ([{"input_ids": [1, 2], "extra": 1}], r"extra"),
    ([{"ids": [1, 2]}], r"input_ids"),
    ([{"input_ids": [1, 2.5]}], r"input_ids/1"),
    ([], r"has no rows"),
    ([{"input_ids": list(range(5)) * 103}], r"515 tokens.*at most 512 positions"),
    ([{"input_ids": [1, 264]}], r"token id 264 is out of range.*264"),
    ([{"input_ids": [1, 2], "labels": [1, 2, 3]}], r"labels has 3 entries"),
    ([{"input_ids": [1, 2], "labels": [1, 300]}], r"label 300"),
    ([{"input_ids": [1, 2], "labels": [1, -5]}], r"-5"),
    ([{"input_ids": [1, 2, 3], "labels": [1, -100, -100]}], r"no token to predict"),
], ids=["json", "json-line2", "short", "negative", "extra-key", "no-ids", "float", "empty", "too-long",
        "id-range", "label-len", "label-range", "label-negative", "no-target"])
def test_bad_rows(tmp_path, rows, match):
    path = _write(tmp_path, rows)
    with pytest.raises(BadInput, match=match) as err:
        load_examples(path, TINY)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        read_rows(tmp_path / "none.jsonl")


def test_schema_examples():
    example = json.loads((SCHEMA_DIR / "examples" / "data_row.json").read_text())
    assert validation_errors("data_row", example) == []
    invalid = sorted((SCHEMA_DIR / "examples" / "invalid").glob("data_row*.json"))
    assert invalid
    for path in invalid:
        assert validation_errors("data_row", json.loads(path.read_text())), path.name


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.encode("héllo", bos=True, eos=True)
    assert ids[0] == tok.BOS and ids[-1] == tok.EOS and max(ids) < tok.vocab == TINY.vocab
    assert tok.decode(ids) == "héllo"


def test_bundled_examples_are_consecutive_windows():
    tok = ByteTokenizer()
    examples = bundled_examples(tok, seq_len=64)
    corpus = tok.encode(bundled_corpus(), bos=False)
    assert len(examples) >= 3
    body = []
    for ex in examples:
        assert ex.input_ids.shape == (64,) and ex.input_ids[0] == tok.BOS
        assert torch.equal(ex.labels, ex.input_ids)
        body += ex.input_ids[1:].tolist()
    assert body == corpus[:len(body)]
    assert len(corpus) - len(body) < 63  # at most one partial window left out


def test_text_examples_are_the_bundled_windows_of_any_text():
    tok = ByteTokenizer()
    assert all(torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels) for a, b in
               zip(text_examples(bundled_corpus(), tok, seq_len=64), bundled_examples(tok, seq_len=64), strict=True))
    text = demo_corpus()[:1000]
    examples = text_examples(text, tok, seq_len=100)
    assert len(examples) == (1000 - 1) // 99 and all(ex.input_ids[0] == tok.BOS for ex in examples)
    assert bytes(examples[1].input_ids[1:].tolist()) == text.encode()[99:198]
