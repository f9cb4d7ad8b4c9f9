"""What a person did with generations (`shared_schemas/feedback.schema.json`) as training data: SFT rows
(`data_row`) and preference pairs (`preference_pair`) for DPO.

A record's context is either
- `prompt`: plain text the model continued (`toolchain generate --prompt` without `--chat`). Its ids are
  `[BOS] + encode(prompt)` (BOS only for tokenizers that have one, as `data --text` rows start), a response's
  ids `encode(response)`, each encoded on its own, so the response's tokens are those the model produced
  and never merge with the prompt's last token;
- `messages`: chat turns ending with a user turn (`generate --chat`): the prompt is the turns through the
  Qwen chat template plus the assistant header `<|im_start|>assistant\\n`, a response's ids are its content
  and the closing `<|im_end|>` (what `data --chat` puts the loss on). A program without a chat template
  refuses such a record.

What each action gives:
- accept: an SFT row, prompt + response, labels -100 on the prompt (loss on the response only);
- edit: an SFT row on prompt + edited, and a pair (chosen = edited, rejected = response);
- reject: a pair (chosen = the other text, rejected = response) with every distinct accepted response
  and edited text of the same context (the same `prompt` string, or the same `messages`) anywhere in the file;
  without one it is counted as a reject without a partner (reported, never silently dropped).

A sequence (prompt + any of its responses) longer than the program's seq_len is an error naming the line
(truncating would drop the very tokens the loss is on), and so is a pair whose chosen ids equal its rejected ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from toolchain import validate
from toolchain.contract import ASSISTANT_HEADER, IM_START
from toolchain.errors import BadInput
from toolchain.schemas import validation_errors
from toolchain.text.chat_template import apply_chat_template
from toolchain.text.text_data import IGNORE, ProgramText, check_rows, read_text
from toolchain.text.tokenizer import Tokenizer

__all__ = ["FeedbackData", "feedback_data", "read_feedback", "write_pairs", "check_pairs", "read_pairs"]


@dataclass
class FeedbackData:
    """Rows and pairs made from a feedback file, and the counts of the summary line."""

    rows: list[dict] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    accepted: int = 0
    edited: int = 0
    rejected: int = 0
    unpaired_rejects: int = 0

    def summary(self) -> str:
        return (f"{self.accepted} accepted, {self.edited} edited, {self.rejected} rejected -> {len(self.rows)} rows, "
                f"{len(self.pairs)} pairs, {self.unpaired_rejects} rejects without a partner")


def read_feedback(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of each non-blank line, checked against the schema and the two rules it cannot
    state (messages end with a user turn; edited != response).

    Raises:
        BadInput: not UTF-8 or not JSON, a record that breaks the schema or a rule (line number named), or no record.
    """
    records = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        doc = validate.loads(line, where)
        errors = validation_errors("feedback", doc)
        if errors:
            raise BadInput(f"{where}: not a feedback record: {_plain(errors[0], doc)}")
        if "messages" in doc and doc["messages"][-1]["role"] != "user":
            raise BadInput(f"{where}: messages must end with a user turn (the response is the assistant's reply to it)")
        if doc["action"] == "edit" and doc["edited"] == doc["response"]:
            raise BadInput(f"{where}: action edit with edited equal to response (that is an accept)")
        records.append((lineno, doc))
    if not records:
        raise BadInput(f"{path} has no feedback record")
    return records


def _plain(error: str, doc) -> str:
    """A schema message that names the problem rather than echoing the whole record."""
    if not isinstance(doc, dict):
        return "expected a JSON object"
    if error.startswith("<root>: ") and " is not valid under any of the given schemas" in error:
        return "give exactly one of prompt and messages"
    if error.startswith("<root>: ") and "should not be valid under {'required': ['edited']}" in error:
        return "edited is only for action edit"
    return error


class _Encoder:
    """Prompt and response ids of records, for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._header: list[int] | None = None

    def prompt_ids(self, doc: dict, where: str) -> list[int]:
        tok = self.tokenizer
        if "prompt" in doc:
            bos = [tok.bos_id] if tok.bos_id is not None else []
            return bos + tok.encode(doc["prompt"], allow_special=False)
        if len(tok.encode(IM_START, allow_special=True)) != 1:
            raise BadInput(f"{where}: a messages record needs a chat template, and the program's {tok.kind} tokenizer "
                           f"has none; write the context as prompt")
        try:
            ids, _ = apply_chat_template(tok, doc["messages"])
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        return ids + tok.encode(ASSISTANT_HEADER, allow_special=True)

    def response_ids(self, doc: dict, text: str, where: str) -> list[int]:
        if "prompt" in doc:
            return self.tokenizer.encode(text, allow_special=False)
        # the assistant turn's tokens the mask of `apply_chat_template` covers: content + <|im_end|>
        ids, mask = apply_chat_template(self.tokenizer, [{"role": "assistant", "content": text}])
        return [t for t, m in zip(ids, mask) if m]

    def row_suffix(self, doc: dict) -> list[int]:
        """What an SFT row adds after the response: the `\\n` closing a chat turn (no target), as `data --chat`."""
        return [] if "prompt" in doc else self.tokenizer.encode("\n", allow_special=False)


def _context_key(doc: dict) -> str:
    return json.dumps(doc.get("prompt", doc.get("messages")), sort_keys=True, ensure_ascii=False)


def feedback_data(program: ProgramText, path: Path) -> FeedbackData:
    """SFT rows and preference pairs of a feedback file for `program` (module docstring), checked (schemas,
    vocabulary, seq_len) before anything is written.

    Raises:
        BadInput: as `read_feedback`, a sequence longer than seq_len, or a pair whose chosen equals its rejected
            (line number named).
    """
    records = read_feedback(path)
    enc = _Encoder(program.tokenizer)
    out = FeedbackData()
    prompts: dict[int, list[int]] = {}
    chosen_by_context: dict[str, list[tuple[int, str]]] = {}   # context -> (line, accepted/edited text)
    for lineno, doc in records:
        where = f"{path}:{lineno}"
        prompt = enc.prompt_ids(doc, where)
        prompts[lineno] = prompt
        fields = ["response"] + (["edited"] if doc["action"] == "edit" else [])
        for name in fields:
            n = len(prompt) + len(enc.response_ids(doc, doc[name], where)) + len(enc.row_suffix(doc))
            if n > program.seq_len:
                raise BadInput(f"{where}: prompt + {name} is {n} "
                               f"tokens, longer than the program's seq_len {program.seq_len}; shorten it, or export "
                               f"with a larger --seq-len")
        if doc["action"] in ("accept", "edit"):
            kept = doc["response"] if doc["action"] == "accept" else doc["edited"]
            chosen_by_context.setdefault(_context_key(doc), []).append((lineno, kept))
    for lineno, doc in records:
        where = f"{path}:{lineno}"
        action, prompt = doc["action"], prompts[lineno]
        if action == "accept":
            out.accepted += 1
            out.rows.append(_row(prompt, enc.response_ids(doc, doc["response"], where), enc.row_suffix(doc)))
        elif action == "edit":
            out.edited += 1
            edited = enc.response_ids(doc, doc["edited"], where)
            out.rows.append(_row(prompt, edited, enc.row_suffix(doc)))
            out.pairs.append(_pair(prompt, edited, enc.response_ids(doc, doc["response"], where), where))
        else:
            out.rejected += 1
            partners = list(dict.fromkeys(text for _, text in chosen_by_context.get(_context_key(doc), [])))
            if not partners:
                out.unpaired_rejects += 1
            rejected = enc.response_ids(doc, doc["response"], where)
            for text in partners:
                if text == doc["response"]:
                    other = next(n for n, t in chosen_by_context[_context_key(doc)] if t == text)
                    raise BadInput(f"{where}: rejects the response that line {other} keeps for the same context "
                                   f"(a pair whose chosen equals its rejected)")
                out.pairs.append(_pair(prompt, enc.response_ids(doc, text, where), rejected, where))
    check_rows(out.rows, program.vocab, str(path))
    check_pairs(out.pairs, program.vocab, program.seq_len, str(path))
    return out


def _row(prompt: list[int], response: list[int], suffix: list[int]) -> dict:
    return {"schema_version": 1, "input_ids": prompt + response + suffix,
            "labels": [IGNORE] * len(prompt) + response + [IGNORE] * len(suffix)}


def _pair(prompt: list[int], chosen: list[int], rejected: list[int], where: str) -> dict:
    if chosen == rejected:
        raise BadInput(f"{where}: the chosen and rejected responses tokenize to the same ids")
    return {"schema_version": 1, "prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}


def check_pairs(pairs: list[dict], vocab: int, max_len: int, where: str) -> None:
    """Each pair against the preference_pair schema, the vocabulary, `max_len` positions and chosen != rejected.

    Raises:
        BadInput: naming the pair (1-based) and `where`.
    """
    for i, pair in enumerate(pairs, 1):
        errors = validation_errors("preference_pair", pair)
        if errors:
            raise BadInput(f"{where}: pair {i}: {errors[0]}")
        ids = pair["prompt_ids"] + pair["chosen_ids"] + pair["rejected_ids"]
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise BadInput(f"{where}: pair {i}: token id {bad} is outside the model's vocabulary of {vocab}")
        if pair["chosen_ids"] == pair["rejected_ids"]:
            raise BadInput(f"{where}: pair {i}: chosen_ids equal rejected_ids (nothing to prefer)")
        n = len(pair["prompt_ids"]) + max(len(pair["chosen_ids"]), len(pair["rejected_ids"]))
        if n > max_len:
            raise BadInput(f"{where}: pair {i}: prompt + response is {n} tokens, more than the {max_len} positions "
                           f"the model takes")


def read_pairs(path: Path, vocab: int, max_len: int, *, limit: int | None = None) -> list[dict]:
    """Preference pairs of a JSONL file, checked (`check_pairs`; the line number named on a bad one).

    Raises:
        BadInput: missing file, bad JSON, a bad pair, or no pair.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"pairs file {str(path)!r} does not exist")
    pairs = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        doc = validate.loads(line, f"{path}:{lineno}")
        check_pairs([doc], vocab, max_len, f"{path}:{lineno}")
        pairs.append(doc)
        if limit is not None and len(pairs) >= limit:
            break
    if not pairs:
        raise BadInput(f"pairs file {str(path)!r} has no pair")
    return pairs


def write_pairs(path: Path, pairs: list[dict]) -> None:
    """JSONL, one compact pair per line, written atomically."""
    from toolchain.atomic import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(p, sort_keys=True, separators=(",", ":")) + "\n" for p in pairs))
