"""`toolchain data --feedback`: accept / edit / reject records as SFT rows and preference pairs, through the chat
template (Qwen) or as plain prompt + response (byte); the summary line; bad input (one `Error:` line naming the
line, exit 2, nothing written). Expected ids are built here from the tokenizer and `apply_chat_template`, not from
the module under test."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.contract import ASSISTANT_HEADER
from toolchain.schemas import validation_errors
from toolchain.text.chat_template import apply_chat_template
from toolchain.text.qwen_vocab import qwen_tokenizer
from toolchain.text.tokenizer import ByteTokenizer

T = "2026-12-07T09:30:00Z"


def _manifest(folder: Path, seq_len: int, tokenizer: dict, vocab: int, files: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({
        "schema_version": 3, "seq_len": seq_len, "model": {"arch": {"vocab": vocab, "max_positions": 4096}},
        "tokenizer": tokenizer, "files": files}))
    return folder


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
        "schema_version": 3, "seq_len": 64, "model": {"arch": {"vocab": 151936, "max_positions": 32768}},
        "tokenizer": {"kind": "qwen2.5", "vocab": 151936, "pad_token_id": 151643, "eos_token_id": 151643,
                      "file": "tokenizer.json"},
        "files": {"tokenizer.json": sha}}))
    return folder


@pytest.fixture(scope="module")
def byte_program(tmp_path_factory) -> Path:
    """What `data` reads of a byte-tokenizer program (a `tiny` export's manifest fields)."""
    return _manifest(tmp_path_factory.mktemp("tiny") / "prog", 40,
                     {"kind": "byte", "vocab": 264, "pad_token_id": 0, "eos_token_id": 2}, 264, {})


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def _run(program, feedback, tmp_path):
    rows, pairs = tmp_path / "rows.jsonl", tmp_path / "pairs.jsonl"
    result = CliRunner().invoke(cli, ["data", "--program", str(program), "--feedback", str(feedback),
                                      "--out", str(rows), "--pairs-out", str(pairs)])
    return result, rows, pairs


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_chat_records_through_the_template(qwen, qwen_program, tmp_path):
    ctx = [{"role": "user", "content": "Can we meet on Friday?"}]
    other = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Lunch?"}]
    fb = _write(tmp_path / "fb.jsonl", [
        {"messages": ctx, "response": "I am not sure.", "action": "reject", "time": T},
        {"messages": ctx, "response": "Yes, Friday works.", "action": "edit", "edited": "Friday works, at ten.",
         "time": T},
        {"messages": other, "response": "Sure, noon.", "action": "accept", "time": T},
        {"messages": other, "response": "No.", "action": "reject", "time": T},
        {"messages": [{"role": "user", "content": "Alone?"}], "response": "Hm.", "action": "reject", "time": T},
    ])
    result, rows_path, pairs_path = _run(qwen_program, fb, tmp_path)
    assert result.exit_code == 0, result.output
    assert "1 accepted, 1 edited, 3 rejected -> 2 rows, 3 pairs, 1 rejects without a partner" in result.output

    def prompt(msgs):
        ids, _ = apply_chat_template(qwen, msgs)
        return ids + qwen.encode(ASSISTANT_HEADER, allow_special=True)

    def reply(text):
        return qwen.encode(text, allow_special=False) + qwen.encode("<|im_end|>", allow_special=True)

    rows, pairs = _lines(rows_path), _lines(pairs_path)
    # an SFT row is what `data --chat` makes of the conversation with the (kept) reply, labels on the reply
    full, mask = apply_chat_template(qwen, ctx + [{"role": "assistant", "content": "Friday works, at ten."}])
    assert rows[0] == {"schema_version": 1, "input_ids": full, "labels": [t if m else -100 for t, m in zip(full, mask)]}
    assert rows[0]["input_ids"][:len(prompt(ctx))] == prompt(ctx)
    full, mask = apply_chat_template(qwen, other + [{"role": "assistant", "content": "Sure, noon."}])
    assert rows[1]["input_ids"] == full
    # the reject of line 1 pairs with the edit of line 2 (same context, later in the file)
    assert pairs[0] == {"schema_version": 1, "prompt_ids": prompt(ctx), "chosen_ids": reply("Friday works, at ten."),
                        "rejected_ids": reply("I am not sure.")}
    assert pairs[1] == {"schema_version": 1, "prompt_ids": prompt(ctx), "chosen_ids": reply("Friday works, at ten."),
                        "rejected_ids": reply("Yes, Friday works.")}
    assert pairs[2]["chosen_ids"] == reply("Sure, noon.") and pairs[2]["rejected_ids"] == reply("No.")
    assert all(validation_errors("preference_pair", p) == [] for p in pairs)
    assert all(validation_errors("data_row", r) == [] for r in rows)


def test_plain_prompt_records_on_a_byte_program(byte_program, tmp_path):
    tok = ByteTokenizer()
    fb = _write(tmp_path / "fb.jsonl", [
        {"prompt": "Dear Sam,", "response": " thanks", "action": "accept", "time": T},
        {"prompt": "Dear Sam,", "response": " yo", "action": "reject", "time": "2026-12-07T10:00:00+01:00"},
    ])
    result, rows_path, pairs_path = _run(byte_program, fb, tmp_path)
    assert result.exit_code == 0, result.output
    assert "1 accepted, 0 edited, 1 rejected -> 1 rows, 1 pairs, 0 rejects without a partner" in result.output
    prompt = [tok.BOS] + tok.encode("Dear Sam,")
    assert _lines(rows_path) == [{"schema_version": 1, "input_ids": prompt + tok.encode(" thanks"),
                                  "labels": [-100] * len(prompt) + tok.encode(" thanks")}]
    assert _lines(pairs_path) == [{"schema_version": 1, "prompt_ids": prompt, "chosen_ids": tok.encode(" thanks"),
                                   "rejected_ids": tok.encode(" yo")}]


def test_the_bundled_feedback_example_converts(qwen_program, tmp_path):
    from toolchain.schemas import SCHEMA_DIR

    result, rows, pairs = _run(qwen_program, SCHEMA_DIR / "examples" / "feedback.jsonl", tmp_path)
    assert result.exit_code == 0, result.output
    # the reject of line 3 has no system turn, so its context is not the edit's: no partner
    assert "1 accepted, 1 edited, 2 rejected -> 2 rows, 1 pairs, 2 rejects without a partner" in result.output


GOOD = {"prompt": "Hi", "response": " there", "action": "accept", "time": T}


@pytest.mark.parametrize(("bad", "message"), [
    ({**GOOD, "action": "keep"}, "'keep' is not one of"),
    ({**GOOD, "response": ""}, "response: '' should be non-empty"),
    ({**GOOD, "action": "edit"}, "'edited' is a required property"),
    ({**GOOD, "action": "edit", "edited": " there"}, "edited equal to response"),
    ({**GOOD, "edited": " you"}, "edited is only for action edit"),
    ({**GOOD, "messages": [{"role": "user", "content": "x"}]}, "exactly one of prompt and messages"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "response": "c",
      "action": "accept", "time": T}, "must end with a user turn"),
    ({**GOOD, "time": "yesterday"}, "time: 'yesterday' does not match"),
    ({**GOOD, "prompt": "x" * 60}, "longer than the program's seq_len 40"),
    ({**GOOD, "action": "edit", "edited": " " + "y" * 40}, "prompt + edited is"),
    ("{not json", "not valid JSON"),
    ({**GOOD, "prompt": 5}, "prompt: 5 is not of type 'string'"),
])
def test_bad_records_one_error_naming_the_line_nothing_written(byte_program, tmp_path, bad, message):
    fb = _write(tmp_path / "fb.jsonl", [GOOD, bad])
    result, rows, pairs = _run(byte_program, fb, tmp_path)
    assert result.exit_code == 2, result.output
    assert result.output.count("Error:") == 1 and message in result.output and "fb.jsonl:2" in result.output, \
        result.output
    assert not rows.exists() and not pairs.exists()


def test_rejecting_what_the_same_context_keeps_is_an_error(byte_program, tmp_path):
    fb = _write(tmp_path / "fb.jsonl", [GOOD, {**GOOD, "action": "reject"}])
    result, rows, pairs = _run(byte_program, fb, tmp_path)
    assert result.exit_code == 2 and "fb.jsonl:2" in result.output and "line 1" in result.output, result.output
    assert "chosen equals its rejected" in result.output
    assert not rows.exists() and not pairs.exists()


def test_messages_need_a_chat_template(byte_program, tmp_path):
    fb = _write(tmp_path / "fb.jsonl", [{"messages": [{"role": "user", "content": "x"}], "response": "y",
                                         "action": "accept", "time": T}])
    result, rows, pairs = _run(byte_program, fb, tmp_path)
    assert result.exit_code == 2 and "fb.jsonl:1" in result.output and "chat template" in result.output
    assert not rows.exists()


@pytest.mark.parametrize("extra", [["--text", "FB"], ["--held-out", "0.5", "--held-out-out", "h.jsonl"]])
def test_option_combinations(byte_program, tmp_path, extra):
    fb = _write(tmp_path / "fb.jsonl", [GOOD])
    args = [str(fb) if a == "FB" else (str(tmp_path / a) if a.endswith(".jsonl") else a) for a in extra]
    result = CliRunner().invoke(cli, ["data", "--program", str(byte_program), "--feedback", str(fb),
                                      "--out", str(tmp_path / "r.jsonl"), "--pairs-out", str(tmp_path / "p.jsonl"),
                                      *args])
    assert result.exit_code == 2 and result.output.count("Error:") == 1, result.output
    assert not (tmp_path / "r.jsonl").exists()


def test_feedback_needs_pairs_out(byte_program, tmp_path):
    fb = _write(tmp_path / "fb.jsonl", [GOOD])
    result = CliRunner().invoke(cli, ["data", "--program", str(byte_program), "--feedback", str(fb),
                                      "--out", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "--pairs-out" in result.output, result.output


def test_the_demo_feedback_session_converts(tmp_path):
    """The committed session (scripts/make_feedback_session.py) on the demo program's seq_len 128."""
    assets = Path(__file__).resolve().parents[2] / "toolchain" / "assets"
    program = _manifest(tmp_path / "demo", 128, {"kind": "byte", "vocab": 264, "pad_token_id": 0, "eos_token_id": 2},
                        264, {})
    result, rows, pairs = _run(program, assets / "feedback_session.jsonl", tmp_path)
    assert result.exit_code == 0, result.output
    assert "18 accepted, 18 edited, 6 rejected -> 36 rows, 24 pairs, 0 rejects without a partner" in result.output
    (tmp_path / "held").mkdir()
    held, _, _ = _run(program, assets / "feedback_held_out.jsonl", tmp_path / "held")
    assert held.exit_code == 0 and "0 accepted, 7 edited, 0 rejected -> 7 rows, 7 pairs" in held.output, held.output
