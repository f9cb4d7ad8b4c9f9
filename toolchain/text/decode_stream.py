"""Generated ids to text as they arrive (the glossary's "text decoding stream"; the apps' Kotlin and Swift
`IncrementalTextDecoder`): each id gives the text it completed, never half a UTF-8 character.

A byte-level BPE (Qwen) or the byte tokenizer may end a token inside a character (an emoji's first bytes); its
decode then ends in U+FFFD. The decoder decodes every id so far with the program's tokenizer and shows the part
not shown yet, holding back trailing U+FFFD until the next id completes the character or `finish` ends the
stream (a character that never completes is shown then, as U+FFFD, as the whole decode shows it). For a tokenizer
whose decode of a prefix of the ids is a prefix of the decode of all of them (the byte tokenizer and byte-level
BPEs: every tokenizer `toolchain export` ships for the built-in presets), the pieces of `push` followed by
`finish` concatenate to the whole decode exactly. A tokenizer that rewrites earlier text when later ids arrive
(e.g. a cleanup of spaces) gets no piece until its decode extends what was shown again, and `finish` adds
what remains if it does; nothing shown is ever repeated.

Each `push` decodes the ids so far (quadratic in the generation's length: a few ms for hundreds of tokens).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from toolchain.text.tokenizer import Tokenizer

__all__ = ["GeneratedToken", "IncrementalTextDecoder"]

REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class GeneratedToken:
    """One streamed token of a generation: its index (0 for the first new token), its id, and the text it
    completed ("" when it only starts a character, or is a hidden id such as a stop id)."""

    index: int
    id: int
    text: str


class IncrementalTextDecoder:
    """Text of generated ids as they come (see the module docstring). `hidden`: ids that add no text (the stop
    ids: EOS, `<|im_end|>`), as the whole decode of a generation drops its stop id."""

    def __init__(self, tokenizer: Tokenizer, hidden: Iterable[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.hidden = frozenset(hidden)
        self._ids: list[int] = []
        self._shown = ""
        self._count = 0
        self._finished = False

    @property
    def text(self) -> str:
        """Every piece returned so far, concatenated."""
        return self._shown

    def push(self, token_id: int) -> GeneratedToken:
        """Add the next generated id; returns it with the text it completed."""
        if self._finished:
            raise RuntimeError("the decoder is finished")
        index = self._count
        self._count += 1
        if token_id in self.hidden:
            return GeneratedToken(index, token_id, "")
        self._ids.append(token_id)
        complete = self.tokenizer.decode(self._ids).rstrip(REPLACEMENT)
        return GeneratedToken(index, token_id, self._show(complete))

    def finish(self) -> str:
        """The end of the stream: what is left of the whole decode (an incomplete last character as U+FFFD)."""
        if self._finished:
            return ""
        self._finished = True
        return self._show(self.tokenizer.decode(self._ids)) if self._ids else ""

    def _show(self, text: str) -> str:
        if not text.startswith(self._shown):
            return ""      # the decode rewrote text already shown: wait until it extends it again
        piece = text[len(self._shown):]
        self._shown = text
        return piece
