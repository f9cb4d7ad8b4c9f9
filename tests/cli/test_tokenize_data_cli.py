"""`toolchain tokenize` and `toolchain data`: ids of a file; plain text as seq-len windows; chat rows
whose labels mask exactly the non-assistant tokens; the seeded held-out split; errors (one `Error:`
line, exit 2, nothing written). Qwen programs are a manifest + tokenizer.json (all `data` reads); the
byte path runs on a real `tiny` export."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.contract import IM_END, IM_START
from toolchain.text.dataset import read_rows
from toolchain.text.chat_template import apply_chat_template
from toolchain.text.qwen_vocab import qwen_tokenizer
from toolchain.text.tokenizer_source import load_tokenizer

SEQ_LEN = 48
TEXT = ("The river ran slowly past the old mill. 你好，世界！ Don't stop: 12345 🙂\n\n"
        "def f(x):\n    return x  # <|im_end|> stays text\n") * 6
CHATS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6 🙂"}],
    [{"role": "user", "content": "中文?"}, {"role": "assistant", "content": "是的"}],
]


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer()


@pytest.fixture(scope="module")
def qwen_program(tmp_path_factory, qwen) -> Path:
    folder = tmp_path_factory.mktemp("qwen") / "prog"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(qwen.to_json(), encoding="utf-8")
    sha = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps({
        "schema_version": 3, "seq_len": SEQ_LEN, "model": {"arch": {"vocab": 151936, "max_positions": 32768}},
        "tokenizer": {"kind": "qwen2.5", "vocab": 151936, "pad_token_id": 151643, "eos_token_id": 151643,
                      "file": "tokenizer.json"},
        "files": {"tokenizer.json": sha}}))
    return folder


@pytest.fixture(scope="module")
def tiny_program(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "prog"
    result = CliRunner().invoke(cli, ["export", "--model", "tiny", "--init", "random", "--seq-len", "16", "--rank", "2",
                                      "--target", "onnx", "--quant", "none", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _error(result, message):
    assert result.exit_code == 2, result.output
    assert result.output.count("Error:") == 1 and message in result.output, result.output
    assert "Traceback" not in result.output


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- tokenize ----------------------------------------------------------------------------------------
def test_tokenize_prints_ids_and_writes_json(tmp_path, qwen, qwen_program):
    src = tmp_path / "in.txt"
    src.write_text("Hello world!<|im_end|>", encoding="utf-8")
    result = _run("tokenize", "--tokenizer", "qwen2.5", src)
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["9707", "1879", "0", "151645"]
    result = _run("tokenize", "--tokenizer", qwen_program, "--no-special", "--json", tmp_path / "ids.json", src)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "ids.json").read_text())
    assert doc == {"ids": qwen.encode("Hello world!<|im_end|>", allow_special=False), "tokens": len(doc["ids"])}
    assert 151645 not in doc["ids"]
    assert _run("tokenize", "--tokenizer", "byte", src).output.split()[:3] == ["72", "101", "108"]


@pytest.mark.parametrize("tokenizer, content, message", [
    ("qwen2.5", b"caf\xe9\n", "not UTF-8"),
    ("qwen3", b"hi", "unknown tokenizer"),
])
def test_tokenize_errors(tmp_path, tokenizer, content, message):
    src = tmp_path / "in.txt"
    src.write_bytes(content)
    _error(_run("tokenize", "--tokenizer", tokenizer, "--json", tmp_path / "o.json", src), message)
    assert not (tmp_path / "o.json").exists()


# -- data --text ---------------------------------------------------------------------------------------
def test_text_windows_cover_the_stream_once(tmp_path, qwen, qwen_program):
    src, out = tmp_path / "t.txt", tmp_path / "rows.jsonl"
    src.write_text(TEXT, encoding="utf-8")
    result = _run("data", "--program", qwen_program, "--text", src, "--out", out)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert read_rows(out) == rows                      # the data_row schema
    stream = qwen.encode(TEXT, allow_special=False) + [151643]   # no BOS; <|endoftext|> closes the document
    windows = [r["input_ids"] for r in rows]
    assert all(len(w) == SEQ_LEN for w in windows[:-1]) and 2 <= len(windows[-1]) <= SEQ_LEN
    assert all(a[-1] == b[0] for a, b in zip(windows, windows[1:]))   # consecutive windows share one token
    assert windows[0] + [t for w in windows[1:] for t in w[1:]] == stream   # every target exactly once
    assert all("labels" not in r for r in rows)


def test_text_windows_of_a_tiny_export_start_with_bos(tmp_path, tiny_program):
    manifest = json.loads((tiny_program / "manifest.json").read_text())
    tok = manifest["tokenizer"]
    assert (tok["kind"], tok["file"], tok["pad_token_id"], tok["eos_token_id"]) == ("byte", "tokenizer.json", 258, 257)
    assert manifest["files"]["tokenizer.json"] == hashlib.sha256((tiny_program / "tokenizer.json").read_bytes()).hexdigest()
    src, out = tmp_path / "t.txt", tmp_path / "rows.jsonl"
    src.write_text("héllo world, " * 5, encoding="utf-8")
    assert _run("data", "--program", tiny_program, "--text", src, "--out", out).exit_code == 0
    windows = [r["input_ids"] for r in _rows(out)]
    assert windows[0][0] == 256 and windows[-1][-1] == 257 and all(len(w) <= 16 for w in windows)
    assert windows[0] + [t for w in windows[1:] for t in w[1:]] == [256] + list(("héllo world, " * 5).encode()) + [257]
    _error(_run("data", "--program", tiny_program, "--chat", _chat_file(tmp_path, CHATS), "--out", tmp_path / "c.jsonl"),
           "no <|im_start|> token")


# -- data --chat -------------------------------------------------------------------------------------
def _chat_file(tmp_path: Path, chats, extra_lines=()) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in chats)
                    + "".join(extra_lines), encoding="utf-8")
    return path


def test_chat_rows_mask_exactly_the_non_assistant_tokens(tmp_path, qwen, qwen_program):
    out = tmp_path / "rows.jsonl"
    result = _run("data", "--program", qwen_program, "--chat", _chat_file(tmp_path, CHATS, ["\n"]), "--out", out)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert read_rows(out) == rows and len(rows) == len(CHATS)
    for row, messages in zip(rows, CHATS):
        ids, labels = row["input_ids"], row["labels"]
        expected_ids, mask = apply_chat_template(qwen, messages)
        assert ids == expected_ids
        assert [t == -100 for t in labels] == [not m for m in mask]
        assert [t for t in labels if t != -100] == [i for i, m in zip(ids, mask) if m]
        # the learned tokens are the assistant contents, each closed by <|im_end|>
        learned = [t for t in labels if t != -100]
        assert learned == [t for m in messages if m["role"] == "assistant" for t in qwen.encode(m["content"]) + [151645]]
        rendered = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
        assert qwen.decode(ids) == rendered


@pytest.mark.parametrize("lines, message", [
    (['{"messages": [{"role": "user", "content": "' + "word " * 80 + '"}, {"role": "assistant", "content": "ok"}]}\n'],
     "chat.jsonl:2: the conversation is"),
    (["{not json\n"], "chat.jsonl:2: not valid JSON"),
    (['{"messages": [{"role": "user", "content": "only a question"}]}\n'], "chat.jsonl:2: the conversation has no assistant"),
    (['{"text": "x"}\n'], 'chat.jsonl:2: expected {"messages"'),
    (['{"messages": [{"role": "robot", "content": "x"}]}\n'], "chat.jsonl:2: message 1: role must be"),
])
def test_chat_errors_name_the_line_and_write_nothing(tmp_path, qwen_program, lines, message):
    out = tmp_path / "rows.jsonl"
    _error(_run("data", "--program", qwen_program, "--chat", _chat_file(tmp_path, CHATS[:1], lines), "--out", out), message)
    assert not out.exists()


# -- held-out split ----------------------------------------------------------------------------------
def _split(tmp_path, program, seed, name):
    src = tmp_path / "t.txt"
    src.write_text(TEXT * 3, encoding="utf-8")
    out, held = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.held.jsonl"
    result = _run("data", "--program", program, "--text", src, "--out", out, "--held-out", "0.25",
                  "--held-out-out", held, "--seed", seed)
    assert result.exit_code == 0, result.output
    return _rows(out), _rows(held)


def test_held_out_split_is_deterministic_by_seed(tmp_path, qwen_program):
    train, held = _split(tmp_path, qwen_program, 1, "a")
    again = _split(tmp_path, qwen_program, 1, "b")
    other = _split(tmp_path, qwen_program, 2, "c")
    assert (train, held) == again and held != other[1]
    everything = _split(tmp_path, qwen_program, 1, "d")
    n = len(train) + len(held)
    assert len(held) == round(0.25 * n) and all(r not in train for r in held)
    assert sorted(map(json.dumps, train + held)) == sorted(map(json.dumps, everything[0] + everything[1]))


# -- errors --------------------------------------------------------------------------------------------
def test_data_errors_and_overwrite(tmp_path, qwen_program):
    src, out = tmp_path / "t.txt", tmp_path / "rows.jsonl"
    src.write_text(TEXT, encoding="utf-8")
    base = ["data", "--program", qwen_program, "--out", out]
    _error(_run(*base), "exactly one of --text")
    _error(_run(*base, "--text", src, "--held-out", "0.5"), "--held-out and --held-out-out go together")
    _error(_run(*base, "--text", src, "--held-out", "0.001", "--held-out-out", tmp_path / "h.jsonl"), "holds out 0")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe bad\n")
    _error(_run(*base, "--text", bad), "not UTF-8 text (byte 0xff at line 2")
    (tmp_path / "not-a-program").mkdir()
    _error(_run("data", "--program", tmp_path / "not-a-program", "--text", src, "--out", out), "not a program directory")
    assert not out.exists()
    assert _run(*base, "--text", src).exit_code == 0
    before = out.read_text()
    _error(_run(*base, "--text", src), "already exists; pass --force")
    src.write_text("short text", encoding="utf-8")
    assert _run(*base, "--text", src, "--force").exit_code == 0 and out.read_text() != before
    assert load_tokenizer(qwen_program).kind == "qwen2.5"
