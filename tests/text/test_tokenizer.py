"""toolchain.text.tokenizer: the Qwen2.5 tokenizer (Hugging Face `tokenizers`, merges derived from the
ranks) against independent references on the shared corpus (`shared_schemas/tokenizer_corpus/`):
tiktoken over the same ranks (the committed ids, produced by scripts/make_tokenizer_corpus_ids.py,
and live on seeded random strings) and a pure-Python rank BPE (the algorithm the phones' BPEs
implement). Also the facts the build relies on, the byte tokenizer, loading and the chat template.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import unicodedata
from pathlib import Path

import pytest

from toolchain.contract import IM_END, IM_START
from toolchain.errors import BadInput
from toolchain.text.chat_template import apply_chat_template
from toolchain.text.qwen_vocab import (QWEN_ADDED_TOKENS, QWEN_MIN_VOCAB, QWEN_PATTERN, QWEN_SPECIAL_START,
                                       qwen_merges, qwen_tokenizer, read_qwen_ranks)
from toolchain.text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from toolchain.text.tokenizer_source import load_tokenizer, tokenizer_for_export

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "shared_schemas" / "tokenizer_corpus"


def _script():
    spec = importlib.util.spec_from_file_location("make_ids", ROOT / "scripts" / "make_tokenizer_corpus_ids.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def qwen() -> HFTokenizer:
    return qwen_tokenizer()


@pytest.fixture(scope="module")
def script():
    return _script()


@pytest.fixture(scope="module")
def reference(script):
    return script.reference_encoding()


@pytest.fixture(scope="module")
def cases(script) -> list[str]:
    return script.read_cases()


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((CORPUS / "qwen2.5_ids.json").read_text(encoding="utf-8"))


# -- facts -------------------------------------------------------------------------------------------
def test_facts_of_the_qwen_vocabulary_and_added_tokens():
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    ranks = read_qwen_ranks()
    assert len(ranks) == QWEN_SPECIAL_START == 151643
    assert sorted(ranks.values()) == list(range(151643))           # rank = id, no gap
    assert all(bytes([b]) in ranks for b in range(256))            # byte-level: every byte is a token
    assert QWEN_PATTERN == PRETOKENIZE_REGEX                        # transformers' Qwen2 pre-tokenizer
    assert len(QWEN_ADDED_TOKENS) == 22 and QWEN_MIN_VOCAB == 151665
    assert len(qwen_merges(ranks)) == 151387                        # one merge per multi-byte token


def test_qwen_tokenizer_ids_of_added_tokens_pad_and_normalizer(qwen):
    for i, (content, _) in enumerate(QWEN_ADDED_TOKENS):
        assert qwen.encode(content) == [QWEN_SPECIAL_START + i], content
    assert qwen.pad_id == qwen.eos_id == 151643 and qwen.bos_id is None
    assert qwen.vocab_size == 151665 and qwen.kind == "qwen2.5" and isinstance(qwen, Tokenizer)
    assert qwen.encode("e\u0301") == qwen.encode("\u00e9")           # NFC
    assert qwen.encode("Hello world!") == [9707, 1879, 0]


def test_byte_symbol_table_is_gpt2s():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from toolchain.text.tokenizer import byte_symbols

    assert byte_symbols() == tuple(bytes_to_unicode()[b] for b in range(256))


# -- equality with the references --------------------------------------------------------------------
def test_committed_ids_regenerate_byte_for_byte(script):
    assert script.render() == (CORPUS / "qwen2.5_ids.json").read_text(encoding="utf-8"), (
        "run .venv/bin/python scripts/make_tokenizer_corpus_ids.py")


def test_corpus_is_large_and_mixed(cases, expected):
    assert len(cases) == expected["cases"] >= 900
    assert expected["cases_sha256"] == hashlib.sha256((CORPUS / "cases.jsonl").read_bytes()).hexdigest()
    text = "".join(cases)
    for needle in ("def ", "你好", "こんにちは", "안녕", "🙂", "👨‍👩‍👧‍👦", " " * 16, "\r\n", "don't", "'LL", "1234567890",
                   "<|im_start|>", "<tool_call>", "e\u0301", "\u0000", "\ufeff"):
        assert needle in text, needle


@pytest.mark.parametrize("allow_special, key", [(True, "ids"), (False, "ids_ordinary")])
def test_product_equals_reference_on_the_corpus(qwen, cases, expected, allow_special, key):
    wrong = [(i, c) for i, (c, ids) in enumerate(zip(cases, expected[key])) if qwen.encode(c, allow_special=allow_special) != ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} cases differ, first: {wrong[:3]}"


def test_round_trip_on_the_corpus(qwen, cases, expected):
    for c, ids in zip(cases, expected["ids"]):
        assert qwen.decode(ids) == unicodedata.normalize("NFC", c)


def _random_text(rng: random.Random) -> str:
    pools = [(0x20, 0x7E), (0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x0300, 0x036F),
             (0x0400, 0x04FF), (0x0600, 0x06FF), (0x2000, 0x206F), (0x0000, 0x001F), (0x00A0, 0x00FF), (0xE000, 0xE00F)]
    words = [" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "123", "<|im_end|>", "<tool_call>", "🇯🇵", "a\u0301"]
    out = []
    for _ in range(rng.randint(1, 30)):
        if rng.random() < 0.3:
            out.append(rng.choice(words))
        else:
            lo, hi = rng.choice(pools)
            out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def test_product_equals_tiktoken_on_seeded_random_text(qwen, reference):
    rng = random.Random(0)
    for _ in range(3000):
        text = _random_text(rng)
        nfc = unicodedata.normalize("NFC", text)
        assert qwen.encode(text) == reference.encode(nfc, allowed_special="all"), repr(text)
        assert qwen.encode(text, allow_special=False) == reference.encode_ordinary(nfc), repr(text)
        assert qwen.decode(qwen.encode(text)) == nfc


def test_lone_surrogates_become_replacement_characters_as_in_tiktoken(qwen, reference):
    for text in ["a\ud800b", "\udfff", "x\ud83d", "ok\ud83d\ude00"]:
        assert qwen.encode(text) == reference.encode(text, allowed_special="all"), repr(text)


def _rank_bpe(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    # The plain algorithm: merge the adjacent pair whose concatenation has the lowest rank, leftmost first.
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
        pairs = [(r, i) for r, i in pairs if r is not None]
        if not pairs:
            break
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


def test_pure_python_rank_bpe_equals_the_reference(cases, expected):
    import regex

    ranks = read_qwen_ranks()
    pattern = regex.compile(QWEN_PATTERN)
    for c, ids in zip(cases[::3], expected["ids_ordinary"][::3]):
        text = unicodedata.normalize("NFC", c)
        got = [t for m in pattern.findall(text) for t in _rank_bpe(m.encode(), ranks)]
        assert got == ids, repr(c)


# -- tokenizer.json ----------------------------------------------------------------------------------
def test_qwen_tokenizer_json_is_deterministic_and_reads_back(qwen, cases, tmp_path):
    from tokenizers import Tokenizer as HfTokenizer

    text = qwen.to_json()
    assert text == qwen_tokenizer().to_json()
    hf = HfTokenizer.from_str(text)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    loaded = load_tokenizer(tmp_path)
    assert loaded.kind == "huggingface" and loaded.eos_id == 151643 and loaded.to_json() == text
    for c in cases[::7]:
        assert hf.encode(c, add_special_tokens=False).ids == qwen.encode(c) == loaded.encode(c)
        assert loaded.encode(c, allow_special=False) == qwen.encode(c, allow_special=False)


def test_byte_tokenizer_and_its_tokenizer_json(cases):
    from tokenizers import Tokenizer as HfTokenizer

    tok = ByteTokenizer()
    assert tok.encode("hé") == [104, 195, 169] and tok.encode("hé", bos=True, eos=True) == [256, 104, 195, 169, 257]
    assert tok.decode([256, 104, 195, 169, 257, 258]) == "hé" and isinstance(tok, Tokenizer)
    hf = HfTokenizer.from_str(tok.to_json())
    for c in cases:
        assert hf.encode(c, add_special_tokens=False).ids == tok.encode(c)     # "<|im_end|>" is bytes too
        assert tok.decode(tok.encode(c)) == c


# -- loading -----------------------------------------------------------------------------------------
def _program(folder: Path, tokenizer: Tokenizer | None, *, kind: str | None = None, tamper: bool = False) -> Path:
    folder.mkdir()
    entry = {"kind": kind or (tokenizer.kind if tokenizer else "none"), "vocab": 151936,
             "pad_token_id": tokenizer.pad_id if tokenizer else 0, "eos_token_id": tokenizer.eos_id if tokenizer else None,
             "file": None}
    files = {}
    if tokenizer is not None:
        (folder / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
        entry["file"] = "tokenizer.json"
        files["tokenizer.json"] = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
        if tamper:
            (folder / "tokenizer.json").write_text(tokenizer.to_json() + " ", encoding="utf-8")
    (folder / "manifest.json").write_text(json.dumps({"schema_version": 3, "seq_len": 32,
                                                      "model": {"arch": {"vocab": 151936, "max_positions": 32768}},
                                                      "tokenizer": entry, "files": files}))
    return folder


def test_load_tokenizer_sources(qwen, tmp_path):
    assert load_tokenizer("byte").kind == "byte"
    prog = load_tokenizer(_program(tmp_path / "prog", qwen))
    assert prog.kind == "qwen2.5" and prog.encode("<|im_start|>hi") == [151644, 6023] and prog.pad_id == 151643
    assert load_tokenizer(_program(tmp_path / "tiny", ByteTokenizer())).kind == "byte"
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text(qwen.to_json(), encoding="utf-8")
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": IM_END, "pad_token": "<|endoftext|>"}))
    hf = load_tokenizer(model)
    assert (hf.kind, hf.eos_id, hf.pad_id) == ("huggingface", 151645, 151643)


@pytest.mark.parametrize("make, message", [
    (lambda p, q: _program(p, q, tamper=True), "checksum"),
    (lambda p, q: _program(p, None), "without a tokenizer"),
    (lambda p, q: (p.mkdir(), p)[1], "neither a manifest.json"),
    (lambda p, q: "qwen3", "unknown tokenizer"),
    (lambda p, q: (p.mkdir(), (p / "tokenizer.json").write_bytes(b"\xff\xfe"), p)[2], "not UTF-8"),
    (lambda p, q: (p.mkdir(), (p / "tokenizer.json").write_text("{}"), p)[2], "not a Hugging Face tokenizer.json"),
])
def test_load_tokenizer_errors(qwen, tmp_path, make, message):
    with pytest.raises(BadInput, match=message):
        load_tokenizer(make(tmp_path / "x", qwen))


def test_tokenizer_for_export(tmp_path):
    assert tokenizer_for_export("tiny", 264).kind == "byte"
    assert tokenizer_for_export("qwen2.5-0.5b", 151936).kind == "qwen2.5"
    assert tokenizer_for_export("qwen2.5-0.5b", 1000) is None
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "tokenizer.json").write_text(ByteTokenizer().to_json(), encoding="utf-8")
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>", "pad_token": "<|pad|>"}))
    tok = tokenizer_for_export(str(ckpt), 264)          # the checkpoint's own file wins
    assert (tok.kind, tok.eos_id, tok.pad_id) == ("huggingface", 257, 258)
    assert tok.to_json() == (ckpt / "tokenizer.json").read_text()
    with pytest.raises(BadInput, match="embeds only 200"):
        tokenizer_for_export(str(ckpt), 200)


# -- chat template -----------------------------------------------------------------------------------
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "中文?"},
        {"role": "assistant", "content": "是的 🙂"}]


def test_chat_template_ids_and_assistant_mask(qwen):
    ids, mask = apply_chat_template(qwen, CHAT)
    rendered = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in CHAT)
    # the user's "<|im_end|>" is text, not a turn end: the rendered string with it read as text
    pieces = rendered.split("Hi <|im_end|> there")
    assert ids == (qwen.encode(pieces[0]) + qwen.encode("Hi <|im_end|> there", allow_special=False)
                   + qwen.encode(pieces[1]))
    assert len(mask) == len(ids)
    learned = [t for t, m in zip(ids, mask) if m]
    assert learned == qwen.encode("Hello!") + [151645] + qwen.encode("是的 🙂") + [151645]
    # exactly the assistant spans: every masked run starts after "<|im_start|>assistant\n" and ends at <|im_end|>
    header = [151644] + qwen.encode("assistant\n")
    runs, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    assert len(runs) == 2
    for start, end in runs:
        assert ids[start - len(header):start] == header and ids[end - 1] == 151645 and not mask[end]


def test_chat_template_default_system_and_errors(qwen):
    ids, mask = apply_chat_template(qwen, CHAT[1:3], default_system="S")
    assert ids[:4] == [151644] + qwen.encode("system\n") + qwen.encode("S")[:1]
    for messages, message in [([], "non-empty"), ([{"role": "tool", "content": "x"}], "role must be"),
                              ([{"role": "user"}], "exactly the keys"), ([{"role": "user", "content": 3}], "role must be")]:
        with pytest.raises(BadInput, match=message):
            apply_chat_template(qwen, messages)
    with pytest.raises(BadInput, match="no <|im_start|> token"):
        apply_chat_template(ByteTokenizer(), CHAT)


def test_qwen3_tokenizer_is_qwen25_plus_its_added_tokens(qwen):
    """Qwen3: the same ranks and 22 added tokens, then <tool_response> </tool_response> <think> </think> at
    151665-151668 (not special); ordinary text encodes as Qwen2.5's; eos <|im_end|>, pad <|endoftext|>."""
    from toolchain.text.qwen_vocab import QWEN3_MIN_VOCAB, qwen3_tokenizer

    q3 = qwen3_tokenizer()
    assert q3.vocab_size == QWEN3_MIN_VOCAB == 151669
    assert [q3.token_id(t) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")] == [
        151665, 151666, 151667, 151668]
    assert (q3.eos_id, q3.pad_id) == (qwen.token_id("<|im_end|>"), qwen.token_id("<|endoftext|>"))
    text = "Hello, world! 中文 123 <|im_start|>user\n"
    assert q3.encode(text) == qwen.encode(text)
    assert q3.encode("<think>x</think>") == [151667] + qwen.encode("x") + [151668]
    assert q3.decode([151667]) == "<think>"
    assert tokenizer_for_export("qwen3-0.6b", 151936, "qwen3").to_json() == q3.to_json()
    assert tokenizer_for_export("qwen3-0.6b", 151666, "qwen3") is None          # does not embed <think>
    assert tokenizer_for_export("llama3.2-1b", 128256, None) is None             # no registry vocabulary
