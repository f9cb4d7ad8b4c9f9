"""The chat template programs are trained and prompted with (Qwen's ChatML), and the special token ids the
Qwen2.5 vocabulary gives its text markers. One place for the strings the tokenizer, the data builder and the
generation prompt write.

A turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`; a generation prompt ends with the assistant header
`<|im_start|>assistant\\n` and generation stops at `<|im_end|>` (or eos).
"""

from __future__ import annotations

__all__ = ["ENDOFTEXT", "IM_START", "IM_END", "CHAT_ROLES", "ASSISTANT_HEADER", "QWEN_ENDOFTEXT_ID"]

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_ROLES = ("system", "user", "assistant")
ASSISTANT_HEADER = f"{IM_START}assistant\n"  # the generation prompt after the last turn
QWEN_ENDOFTEXT_ID = 151643  # <|endoftext|>: the first id after Qwen2.5's 151,643 BPE ranks; its pad and eos
