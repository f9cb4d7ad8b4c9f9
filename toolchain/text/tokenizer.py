"""Tokenizers, in one place: the byte tokenizer of the `tiny` preset, the Qwen2.5 tokenizer and any
Hugging Face `tokenizer.json`, behind one `Tokenizer` protocol; and the Qwen (ChatML) chat template
with its assistant mask.

The Qwen2.5 tokenizer is built from the vocabulary PyPI `dashscope` (Apache-2.0) ships,
`dashscope/resources/qwen.tiktoken`: 151,643 lines `base64(token bytes) rank`, rank = token id, the
byte-level BPE ranks Qwen2 and Qwen2.5 share. The file is read from the installed distribution's
files (dashscope's modules, which pull in an HTTP client stack, are never imported) and checked
against its sha256. Qwen2.5 adds (`transformers/models/qwen2/tokenization_qwen2.py`, the model's
`tokenizer_config.json`, torchtune's `QWEN2_5_SPECIAL_TOKENS`): NFC normalization, the
pre-tokenizer regex `QWEN_PATTERN` and 22 added tokens, ids 151643-151664 (`QWEN_ADDED_TOKENS`);
pad and eos are `<|endoftext|>`, a chat turn ends with `<|im_end|>`, there is no BOS.

The product tokenizer is Hugging Face `tokenizers` (Rust), a byte-level BPE whose merges are
derived from the ranks: the merge of token t (rank r) is the pair that tiktoken's rank-BPE reaches
on t's bytes using only ranks < r (exactly two parts for every multi-byte token: 151,387 merges,
the count of Qwen2's `merges.txt`). `tests/text/test_tokenizer.py` checks it against `tiktoken` (same
ranks, pattern and specials, NFC applied first) on `shared_schemas/tokenizer_corpus/`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import unicodedata
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from toolchain.contract import (CHAT_ROLES, ENDOFTEXT, IM_END, IM_START, MANIFEST_NAME, QWEN_ENDOFTEXT_ID,
                                TOKENIZER_NAME, TokenizerSection, read_text_fields, sha256_file)
from toolchain.errors import BadInput
from toolchain.validate import read_text as _read_utf8

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "load_tokenizer", "program_tokenizer", "qwen_tokenizer",
           "tokenizer_for_export", "qwen3_tokenizer", "QWEN3_ADDED_TOKENS", "QWEN3_MIN_VOCAB",
           "apply_chat_template", "qwen_vocab_path", "read_qwen_ranks", "qwen_merges", "sanitize",
           "QWEN_PATTERN", "QWEN_ADDED_TOKENS", "QWEN_SPECIAL_START", "QWEN_VOCAB_SHA256", "QWEN_MIN_VOCAB",
           "QWEN_TOKENIZER_JSON_SHA256"]


QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_SPECIAL_START = QWEN_ENDOFTEXT_ID  # the first id after the 151,643 BPE ranks
# (content, special) in id order from 151643. `special` is the flag of Qwen2.5's tokenizer.json: the
# last eight are added tokens that are not "special" (kept by decode(skip_special_tokens=True)).
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True), (IM_START, True), (IM_END, True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
)
QWEN_MIN_VOCAB = QWEN_SPECIAL_START + len(QWEN_ADDED_TOKENS)  # 151665: a model must embed every id
# Qwen3's tokenizer: Qwen2.5's ranks and added tokens, and four more added tokens (not "special"), ids
# 151665-151668 (Qwen/Qwen3-0.6B tokenizer_config.json `added_tokens_decoder`); its eos is <|im_end|>.
QWEN3_EXTRA_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
QWEN3_ADDED_TOKENS = QWEN_ADDED_TOKENS + QWEN3_EXTRA_ADDED_TOKENS
QWEN3_MIN_VOCAB = QWEN_SPECIAL_START + len(QWEN3_ADDED_TOKENS)  # 151669
QWEN_VOCAB_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"  # dashscope==2.0.2
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
def _byte_symbols() -> tuple[str, ...]:
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
    return _byte_symbols()[b]


def _spell(token: bytes) -> str:
    symbols = _byte_symbols()
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


# -- Qwen2.5 -----------------------------------------------------------------------------------------
def qwen_vocab_path() -> Path:
    """dashscope's qwen.tiktoken, located through the installed distribution (no dashscope import)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution("dashscope").locate_file("dashscope/resources/qwen.tiktoken"))
    except PackageNotFoundError:
        raise BadInput("the Qwen2.5 vocabulary comes with the PyPI package dashscope, which is not installed; "
                       "run `make test` or pip install -c requirements.lock -e .") from None
    if not path.is_file():
        raise BadInput(f"dashscope is installed but {path} is missing; reinstall dashscope")
    return path


def read_qwen_ranks(path: Path | None = None) -> dict[bytes, int]:
    """token bytes -> rank (= id), 151,643 entries, checked against `QWEN_VOCAB_SHA256`."""
    from toolchain.inputs import read_input

    path = qwen_vocab_path() if path is None else Path(path)
    data = read_input(path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != QWEN_VOCAB_SHA256:
        raise BadInput(f"{path} has sha256 {digest}, not the pinned Qwen vocabulary's; install dashscope as locked "
                       f"in requirements.lock")
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def qwen_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in rank order, that reproduce rank-BPE (see the module docstring)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1], rank)
                if r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2:
            raise BadInput(f"the Qwen vocabulary is not a BPE vocabulary: token {token!r} (rank {rank}) cannot be "
                           f"reached by merges of lower rank")
        merges.append((parts[0], parts[1]))
    return merges


def qwen_tokenizer() -> HFTokenizer:
    """The Qwen2.5 tokenizer from dashscope's ranks (0.4 s); its Hugging Face `tokenizers` object is built
    when first needed (about 3 s more: `encode`, `decode`, `to_json`), not by the streamed encoding of
    `data` / `tokenize` (tiktoken over the same ranks, `encode_stream.stream_encoder`)."""
    ranks = read_qwen_ranks()
    eos = QWEN_SPECIAL_START  # <|endoftext|>
    qwen = HFTokenizer(lambda: _qwen_hf(ranks), kind="qwen2.5", pad_id=eos, eos_id=eos, vocab_size=QWEN_MIN_VOCAB)
    qwen._is_qwen, qwen._ranks = True, ranks   # built here (the pin is tested); the ranks serve tiktoken
    return qwen


def qwen3_tokenizer() -> HFTokenizer:
    """The Qwen3 tokenizer: Qwen2.5's (`qwen_tokenizer`) with Qwen3's four extra added tokens; exported as a
    tokenizer.json (kind "huggingface"), pad <|endoftext|>, eos <|im_end|> (Qwen3's config.json)."""
    ranks = read_qwen_ranks()
    return HFTokenizer(lambda: _qwen_hf(ranks, QWEN3_ADDED_TOKENS), kind="huggingface", pad_id=QWEN_SPECIAL_START,
                       eos_id=QWEN_SPECIAL_START + 2, vocab_size=QWEN3_MIN_VOCAB)


def _qwen_hf(ranks: dict[bytes, int], added: tuple[tuple[str, bool], ...] = QWEN_ADDED_TOKENS):
    """The Hugging Face `tokenizers.Tokenizer` of the Qwen2.5 tokenizer (or, with Qwen3's `added` tokens, of
    Qwen3's), from its ranks."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers.models import BPE

    vocab = {_spell(token): rank for token, rank in ranks.items()}
    merges = [(_spell(a), _spell(b)) for a, b in qwen_merges(ranks)]
    # ignore_merges: a pre-token that is itself in the vocabulary is one token, as in tiktoken.
    tk = HfTokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    for content, special in added:
        token = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        (tk.add_special_tokens if special else tk.add_tokens)([token])
    ids = [tk.token_to_id(c) for c, _ in added]
    end = QWEN_SPECIAL_START + len(added)
    if ids != list(range(QWEN_SPECIAL_START, end)) or tk.get_vocab_size(with_added_tokens=True) != end:
        raise RuntimeError(f"Qwen added tokens got ids {ids}, expected {QWEN_SPECIAL_START}..{end - 1}")
    return tk


# -- resolving a tokenizer ---------------------------------------------------------------------------
def load_tokenizer(source: str | Path) -> Tokenizer:
    """`"qwen2.5"`, `"byte"`, a program directory (its manifest's tokenizer, from its tokenizer.json),
    a Hugging Face model directory (its tokenizer.json) or a tokenizer.json file.

    Raises:
        BadInput: unknown name, a directory without a tokenizer, a program exported without one, or a
            tokenizer.json that does not match the manifest's checksum.
    """
    if str(source) == "qwen2.5":
        return qwen_tokenizer()
    if str(source) == "byte":
        return ByteTokenizer()
    path = Path(source)
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        return _program_tokenizer(path)
    if path.is_dir() and (path / TOKENIZER_NAME).is_file():
        return HFTokenizer.from_file(path / TOKENIZER_NAME, kind="huggingface")
    if path.is_file() and path.suffix == ".json":
        return HFTokenizer.from_file(path, kind="huggingface")
    if path.is_dir():
        raise BadInput(f"{path} has neither a manifest.json (program) nor a {TOKENIZER_NAME} (model); "
                       f"pass --tokenizer qwen2.5 or byte")
    raise BadInput(f"unknown tokenizer {str(source)!r}; choose qwen2.5, byte, a program directory or a model "
                   f"directory with a {TOKENIZER_NAME}")


def _program_tokenizer(folder: Path) -> Tokenizer:
    fields = read_text_fields(folder)
    return program_tokenizer(folder, fields.tokenizer, fields.files)


def program_tokenizer(folder: Path, entry: TokenizerSection, files: dict[str, str]) -> Tokenizer:
    """The tokenizer of the program directory `folder`, from its manifest's (already read) `tokenizer` entry
    and `files` checksums.

    Raises:
        BadInput: exported without a tokenizer, or its file missing or not the one checksummed.
    """
    kind = entry.kind
    if kind == "byte":
        return ByteTokenizer()
    file = entry.file
    if kind == "none" or not file:
        if entry.vocab < QWEN_MIN_VOCAB:     # no registry package ships this model's vocabulary (e.g. Llama)
            raise BadInput(f"{folder} was exported without a tokenizer (kind {kind!r}): no vocabulary of this "
                           f"model ships in a registry package; pass token ids (--prompt-ids), or export from a "
                           f"checkpoint directory with its {TOKENIZER_NAME}")
        raise BadInput(f"{folder} was exported without a tokenizer (kind {kind!r}); re-export it, or pass "
                       f"--tokenizer qwen2.5")
    path = folder / file
    if not path.is_file():
        raise BadInput(f"{path} is missing from the program directory; re-export the program")
    expected = files.get(file)
    if expected is not None and sha256_file(path) != expected:
        raise BadInput(f"{path} does not match the checksum in the manifest; re-export the program")
    return HFTokenizer.from_file(path, kind=kind, pad_id=entry.pad_token_id, eos_id=entry.eos_token_id)


def tokenizer_for_export(model: str, vocab: int, vocabulary: str | None = "qwen2.5") -> Tokenizer | None:
    """The tokenizer an export of `model` ships: `tiny`, `demo` -> byte; a checkpoint directory with its own
    tokenizer.json -> that file (kind huggingface); else the model family's `vocabulary` when a registry
    package ships it and the model embeds every one of its ids: "qwen2.5" (vocab >= 151665) -> Qwen2.5,
    "qwen3" (vocab >= 151669) -> Qwen3's; else (e.g. Llama, None) None.

    Raises:
        BadInput: the tokenizer produces ids the model does not embed.
    """
    if model in ("tiny", "demo"):  # the byte-vocabulary presets
        tok: Tokenizer | None = ByteTokenizer()
    elif Path(model).is_dir() and (Path(model) / TOKENIZER_NAME).is_file():
        tok = HFTokenizer.from_file(Path(model) / TOKENIZER_NAME, kind="huggingface")
    elif vocabulary == "qwen2.5" and vocab >= QWEN_MIN_VOCAB:
        tok = qwen_tokenizer()
    elif vocabulary == "qwen3" and vocab >= QWEN3_MIN_VOCAB:
        tok = qwen3_tokenizer()
    else:
        tok = None
    if tok is not None and tok.vocab_size > vocab:
        raise BadInput(f"the {tok.kind} tokenizer has {tok.vocab_size} tokens but the model embeds only {vocab}")
    return tok


# -- chat template -----------------------------------------------------------------------------------
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
