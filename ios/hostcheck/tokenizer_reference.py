"""Writes what the Swift tokenizer test compares against (run by ios/test.sh, not committed: 4.6 MB).

OUT/tokenizer.json: the Qwen2.5 tokenizer as `toolchain export` ships it (toolchain/text/);
OUT/decode.json: the Python decode of every corpus case's reference ids and of 400 random id
sequences (split multi-byte characters, added tokens in the middle), as UTF-8 bytes in hex; the
`toolchain data` rows of a text and of a chat (text_data.text_rows, tokenizer.apply_chat_template);
OUT/byte_tokenizer.json: the demo model's byte tokenizer as a tokenizer.json (`ByteTokenizer.to_json`).

    .venv/bin/python ios/hostcheck/tokenizer_reference.py OUT_DIR
"""

import json
import random
import sys
from pathlib import Path

from toolchain.text.chat_template import apply_chat_template
from toolchain.text.text_data import text_rows
from toolchain.text.tokenizer import ByteTokenizer
from toolchain.text.tokenizer_source import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tk = load_tokenizer("qwen2.5")
    (out / "tokenizer.json").write_text(tk.to_json(), encoding="utf-8")
    ref = json.loads((ROOT / "shared_schemas/tokenizer_corpus/qwen2.5_ids.json").read_text())
    rng = random.Random(0)
    randoms = []
    for _ in range(400):
        ids = [rng.randrange(151665) if rng.random() < 0.3 else rng.randrange(256) for _ in range(rng.randint(1, 8))]
        randoms.append(ids)
    doc = {
        "corpus": [tk.decode(ids).encode("utf-8", "surrogatepass").hex() for ids in ref["ids"]],
        "random": [{"ids": ids, "text": tk.decode(ids).encode("utf-8", "surrogatepass").hex()} for ids in randoms],
    }
    cases = [json.loads(line) for line in (ROOT / "shared_schemas/tokenizer_corpus/cases.jsonl").read_text().splitlines()]
    text = "\n\n".join(cases[:40]) + " <|im_end|> stays text"
    doc["text_rows"] = {"text": text, "seq_len": 64, "rows": [r["input_ids"] for r in text_rows(text, tk, 64)]}
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Was ist 2+2? <|im_end|>"},
            {"role": "assistant", "content": "Vier.\n\nFour: 2 + 2 = 4 🙂"}, {"role": "user", "content": "\nDanke"},
            {"role": "assistant", "content": "Gern geschehen!"}]
    ids, mask = apply_chat_template(tk, chat)
    doc["chat"] = {"messages": chat, "input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]}
    (out / "decode.json").write_text(json.dumps(doc), encoding="utf-8")
    (out / "byte_tokenizer.json").write_text(ByteTokenizer().to_json(), encoding="utf-8")


if __name__ == "__main__":
    main()
