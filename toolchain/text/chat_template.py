"""The Qwen (ChatML) chat template with its assistant mask."""

from __future__ import annotations

from toolchain.contract import CHAT_ROLES, IM_END, IM_START
from toolchain.errors import BadInput
from toolchain.text.tokenizer import Tokenizer

__all__ = ["apply_chat_template"]


def apply_chat_template(tokenizer: Tokenizer, messages: list[dict], *,
                        default_system: str | None = None) -> tuple[list[int], list[bool]]:
    """Qwen's ChatML: each turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`.

    The pieces (`<|im_start|>`, `{role}\\n`, content, `<|im_end|>`, `\\n`) are encoded one by one with
    special-token text in the content kept as text, so a token never straddles a turn boundary. This
    equals encoding the rendered string except where a content starts with a line break (which the
    rendered string would merge with the header's `\\n`). No system turn is added unless
    `default_system` is given (Qwen2.5-Instruct's template adds "You are Qwen, created by Alibaba
    Cloud. You are a helpful assistant." when the first turn is not a system one); no generation prompt.

    Returns:
        ids, and a mask that is True on the tokens the assistant produces: each assistant content and
        its closing `<|im_end|>` (what HF's assistant masks cover), not the `<|im_start|>assistant\\n`
        header (the prompt at generation time) nor the `\\n` after `<|im_end|>` (never generated).

    Raises:
        BadInput: a tokenizer without `<|im_start|>`/`<|im_end|>`, or a message that is not
            {"role": system|user|assistant, "content": str}.
    """
    im_start, im_end = _single_id(tokenizer, IM_START), _single_id(tokenizer, IM_END)
    if not isinstance(messages, list) or not messages:
        raise BadInput("messages must be a non-empty list of {\"role\", \"content\"} objects")
    turns = list(messages)
    if default_system is not None and not (isinstance(turns[0], dict) and turns[0].get("role") == "system"):
        turns.insert(0, {"role": "system", "content": default_system})
    newline = tokenizer.encode("\n", allow_special=False)
    ids: list[int] = []
    mask: list[bool] = []
    for i, message in enumerate(turns):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise BadInput(f"message {i + 1} must be an object with exactly the keys role and content")
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES or not isinstance(content, str):
            raise BadInput(f"message {i + 1}: role must be one of {', '.join(CHAT_ROLES)} and content a string, "
                           f"got role {role!r}")
        header = [im_start] + tokenizer.encode(f"{role}\n", allow_special=False)
        body = tokenizer.encode(content, allow_special=False) + [im_end]
        ids += header + body + newline
        mask += [False] * len(header) + [role == "assistant"] * len(body) + [False] * len(newline)
    return ids, mask


def _single_id(tokenizer: Tokenizer, token: str) -> int:
    ids = tokenizer.encode(token, allow_special=True)
    if len(ids) != 1:
        raise BadInput(f"the {tokenizer.kind} tokenizer has no {token} token, so no chat template; use plain text")
    return ids[0]
