"""The tokenizers behind one `Tokenizer` protocol: the byte tokenizer of the `tiny` and `demo` presets and a
Hugging Face `tokenizers.Tokenizer` (Qwen2.5's, built in `qwen_vocab`, or a model's own tokenizer.json).
Which tokenizer a name, a program or a model gives: `tokenizer_source`; the chat template: `chat_template`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import unicodedata
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from toolchain.contract import ENDOFTEXT
from toolchain.errors import BadInput
from toolchain.validate import read_text as _read_utf8

__all__ = ["Tokenizer", "TokenizerKind", "ByteTokenizer", "HFTokenizer", "sanitize", "byte_symbols", "spell_bytes",
           "QWEN_TOKENIZER_JSON_SHA256"]


# sha256 of `qwen_tokenizer().to_json()` with tokenizers==0.23.3 (tests/text/test_encode_stream.py recomputes it): a
# tokenizer.json with these bytes may be encoded by tiktoken over its ranks (`encode_stream.stream_encoder`).
QWEN_TOKENIZER_JSON_SHA256 = "ace00a17cf233aa5fa133117c7382d1f29b38300d13a56d4b7263ae30426a2c6"


TokenizerKind = Literal["byte", "qwen2.5", "huggingface"]


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer offers. `encode` never adds BOS/EOS; `decode(encode(t)) == NFC(t)` for
    Qwen/HF (special-token text included); the byte tokenizer's control ids decode to nothing."""

    kind: TokenizerKind
    vocab_size: int      # ids this tokenizer produces are < vocab_size (a model may embed more)
    pad_id: int
    eos_id: int
    bos_id: int | None   # None: no BOS (Qwen)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def to_json(self) -> str | None: ...


def sanitize(text: str) -> str:
    """`text` with unpaired UTF-16 surrogates replaced by U+FFFD (what tiktoken does; they have no UTF-8)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# -- byte -------------------------------------------------------------------------------------------
class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, plus BOS=256, EOS=257, PAD=258 (vocab 264 with padding).

    BOS/EOS/PAD are control ids without text: no text encodes to them and `decode` drops them.
    """

    BOS, EOS, PAD = 256, 257, 258
    vocab = 264
    kind: TokenizerKind = "byte"
    vocab_size = vocab
    pad_id, eos_id, bos_id = PAD, EOS, BOS

    def encode(self, text: str, *, allow_special: bool = True, bos: bool = False, eos: bool = False) -> list[int]:
        """UTF-8 bytes of `text` (`allow_special` is accepted for the protocol: no text is special)."""
        return ([self.BOS] if bos else []) + list(sanitize(text).encode()) + ([self.EOS] if eos else [])

    def decode(self, ids: list[int]) -> str:
        return bytes(t for t in ids if t < 256).decode(errors="replace")

    def to_json(self) -> str:
        """A Hugging Face tokenizer.json that encodes text to the same ids (a BPE without merges over the
        256 byte symbols; BOS/EOS/PAD are plain vocabulary entries `<|bos|>`, `<|eos|>`, `<|pad|>` that no
        text reaches, so HF's decode spells them while ours drops them)."""
        from tokenizers import Tokenizer as HfTokenizer
        from tokenizers import decoders, pre_tokenizers
        from tokenizers.models import BPE

        vocab = {_byte_symbol(b): b for b in range(256)}
        vocab.update({"<|bos|>": self.BOS, "<|eos|>": self.EOS, "<|pad|>": self.PAD})
        tk = HfTokenizer(BPE(vocab, [], fuse_unk=False, ignore_merges=False))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tk.decoder = decoders.ByteLevel()
        return tk.to_str()


@functools.cache
def byte_symbols() -> tuple[str, ...]:
    # GPT-2's byte -> printable character table (byte-level BPE vocabularies spell bytes with it).
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def _byte_symbol(b: int) -> str:
    return byte_symbols()[b]


def spell_bytes(token: bytes) -> str:
    symbols = byte_symbols()
    return "".join(symbols[b] for b in token)


# -- Hugging Face tokenizers ------------------------------------------------------------------------
class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` (Qwen2.5's, built here, or a model's own tokenizer.json)."""

    def __init__(self, tk, *, kind: TokenizerKind, pad_id: int, eos_id: int, bos_id: int | None = None,
                 source_json: str | None = None, vocab_size: int | None = None) -> None:
        """tk: a `tokenizers.Tokenizer`, or a function building one on first use (then `vocab_size` is
        required): the streamed path of the Qwen tokenizer (`encode_stream`) never needs it."""
        self._built = None if callable(tk) and vocab_size is not None else tk
        self._build = tk if self._built is None else None
        self.kind = kind
        self.vocab_size: int = vocab_size if self._built is None else tk.get_vocab_size(with_added_tokens=True)
        self.pad_id, self.eos_id, self.bos_id = pad_id, eos_id, bos_id
        self._source_json = source_json  # a model's file is written back byte for byte
        self._is_qwen: bool | None = None
        self._tiktoken = None    # built by `stream_encoder` when first needed
        self._ranks: dict[bytes, int] | None = None

    @property
    def _tk(self):
        if self._built is None:
            self._built = self._build()
        return self._built

    @classmethod
    def from_file(cls, path: Path, *, kind: TokenizerKind, pad_id: int | None = None,
                  eos_id: int | None = None) -> HFTokenizer:
        """Read a tokenizer.json; pad/eos default to the directory's tokenizer_config.json (else
        `<|endoftext|>`)."""
        from tokenizers import Tokenizer as HfTokenizer

        path = Path(path)
        text = _read_utf8(path)
        try:
            tk = HfTokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise BadInput(f"{path}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0]})") from None
        config = _tokenizer_config(path.parent)
        eos = eos_id if eos_id is not None else _special_id(tk, config.get("eos_token"), path)
        pad = pad_id if pad_id is not None else (_special_id(tk, config.get("pad_token"), path)
                                                 if config.get("pad_token") else eos)
        return cls(tk, kind=kind, pad_id=pad, eos_id=eos, source_json=text)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        text = sanitize(text)
        if self.kind == "qwen2.5":
            # NFC before the added tokens are matched (as dashscope/tiktoken do): HF matches them in the raw
            # text, so "<tool_call>" + U+0338 would be <tool_call> there and "<tool_call" + "≯" here.
            text = unicodedata.normalize("NFC", text)
        if allow_special:
            return self._tk.encode(text, add_special_tokens=False).ids
        # Every added token's text as ordinary text: normalizer -> pre-tokenizer -> model, skipping the
        # added vocabulary (HF's `encode_special_tokens` would still match non-special added tokens).
        tk = self._tk
        normalized = tk.normalizer.normalize_str(text) if tk.normalizer is not None else text
        pieces = tk.pre_tokenizer.pre_tokenize_str(normalized) if tk.pre_tokenizer is not None else [(normalized, None)]
        return [t.id for piece, _ in pieces for t in tk.model.tokenize(piece)]

    def decode(self, ids: list[int]) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def to_json(self) -> str:
        return self._source_json if self._source_json is not None else self._tk.to_str()

    def is_qwen(self) -> bool:
        """Exactly the tokenizer `qwen_tokenizer()` builds (its tokenizer.json's bytes)."""
        if self._is_qwen is None:
            self._is_qwen = hashlib.sha256(self.to_json().encode()).hexdigest() == QWEN_TOKENIZER_JSON_SHA256
        return self._is_qwen


def _tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        doc = json.loads(_read_utf8(path))
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not valid JSON ({e.msg})") from None
    return doc if isinstance(doc, dict) else {}


def _special_id(tk, token, path: Path) -> int:
    content = token.get("content") if isinstance(token, dict) else token
    for name in ([content] if content else []) + [ENDOFTEXT, "</s>"]:
        tid = tk.token_to_id(name)
        if tid is not None:
            return tid
    raise BadInput(f"{path}: cannot tell the eos token (no eos_token in tokenizer_config.json, no {ENDOFTEXT} "
                   f"or </s>); add a tokenizer_config.json naming it")
