"""The Qwen2.5 (and Qwen3) tokenizer from the ranks of a registry package.

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
import hashlib
from pathlib import Path

from toolchain.contract import ENDOFTEXT, IM_END, IM_START, QWEN_ENDOFTEXT_ID
from toolchain.errors import BadInput
from toolchain.text.tokenizer import HFTokenizer, spell_bytes

__all__ = ["qwen_tokenizer", "qwen3_tokenizer", "qwen_vocab_path", "read_qwen_ranks", "qwen_merges",
           "QWEN_PATTERN", "QWEN_ADDED_TOKENS", "QWEN_SPECIAL_START", "QWEN_VOCAB_SHA256", "QWEN_MIN_VOCAB",
           "QWEN3_ADDED_TOKENS", "QWEN3_MIN_VOCAB"]


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

    vocab = {spell_bytes(token): rank for token, rank in ranks.items()}
    merges = [(spell_bytes(a), spell_bytes(b)) for a, b in qwen_merges(ranks)]
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
