"""Which tokenizer a name, a program directory or a model gives (`load_tokenizer`, `program_tokenizer`,
`tokenizer_for_export`)."""

from __future__ import annotations

from pathlib import Path

from toolchain.contract import MANIFEST_NAME, TOKENIZER_NAME, TokenizerSection, read_text_fields, sha256_file
from toolchain.errors import BadInput
from toolchain.text.qwen_vocab import QWEN3_MIN_VOCAB, QWEN_MIN_VOCAB, qwen3_tokenizer, qwen_tokenizer
from toolchain.text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = ["load_tokenizer", "program_tokenizer", "tokenizer_for_export"]


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
