"""Reference ids of the shared tokenizer corpus: `shared_schemas/tokenizer_corpus/qwen2.5_ids.json`.

Reads `shared_schemas/tokenizer_corpus/cases.jsonl` (one JSON string per line) and encodes every
case with `tiktoken` (the reference rank-BPE; not the product tokenizer), built from dashscope's
`qwen.tiktoken` ranks, the Qwen2.5 pre-tokenizer pattern and its 22 added tokens, after NFC:

- `ids`: special-token text read as those tokens (`allowed_special="all"`);
- `ids_ordinary`: every case as plain text (`encode_ordinary`).

The Python product tokenizer (tests/text/test_tokenizer.py) and the Kotlin and Swift BPEs are compared
against this file. `tests/text/test_tokenizer.py` checks that running this script reproduces it byte for byte.

    .venv/bin/python scripts/make_tokenizer_corpus_ids.py [--check]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "shared_schemas" / "tokenizer_corpus"
CASES = CORPUS / "cases.jsonl"
IDS = CORPUS / "qwen2.5_ids.json"


def read_cases(path: Path = CASES) -> list[str]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def reference_encoding():
    """tiktoken's Encoding over the Qwen ranks (parsed here, independently of toolchain.text.tokenizer)."""
    import tiktoken

    from toolchain.text.qwen_vocab import QWEN_ADDED_TOKENS, QWEN_PATTERN, QWEN_SPECIAL_START, qwen_vocab_path

    ranks = {}
    for line in qwen_vocab_path().read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    specials = {content: QWEN_SPECIAL_START + i for i, (content, _) in enumerate(QWEN_ADDED_TOKENS)}
    return tiktoken.Encoding("qwen2.5", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def render() -> str:
    """The ids file, deterministic: a header, then one case's ids per line."""
    import tiktoken

    from toolchain.text.qwen_vocab import QWEN_PATTERN, QWEN_VOCAB_SHA256

    enc = reference_encoding()
    cases = [unicodedata.normalize("NFC", c) for c in read_cases()]
    header = {
        "tokenizer": "qwen2.5",
        "reference": f"tiktoken {tiktoken.__version__} (scripts/make_tokenizer_corpus_ids.py)",
        "vocab": "PyPI dashscope 2.0.2, dashscope/resources/qwen.tiktoken",
        "vocab_sha256": QWEN_VOCAB_SHA256,
        "pattern": QWEN_PATTERN,
        "normalization": "NFC",
        "special_tokens": dict(sorted(enc._special_tokens.items(), key=lambda kv: kv[1])),
        "cases_file": CASES.name,
        "cases_sha256": hashlib.sha256(CASES.read_bytes()).hexdigest(),
        "cases": len(cases),
    }
    lists = {
        "ids": [enc.encode(c, allowed_special="all", disallowed_special=()) for c in cases],
        "ids_ordinary": [enc.encode_ordinary(c) for c in cases],
    }
    head = json.dumps(header, indent=2, ensure_ascii=False)[:-2]  # drop the closing "\n}"
    body = "".join(f',\n  "{name}": [\n' + ",\n".join("    " + json.dumps(ids) for ids in rows) + "\n  ]"
                   for name, rows in lists.items())
    return head + body + "\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        same = IDS.is_file() and IDS.read_text(encoding="utf-8") == text
        print(f"{IDS.relative_to(ROOT)}: {'up to date' if same else 'differs: regenerate it'}")
        return 0 if same else 1
    IDS.write_text(text, encoding="utf-8")
    print(f"wrote {IDS.relative_to(ROOT)} ({len(read_cases())} cases)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
