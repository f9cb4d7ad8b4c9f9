"""Write the reference cases of on-device data preparation: `shared_schemas/data_corpus/cases.jsonl`.

    .venv/bin/python scripts/record_data_corpus.py [OUT_FILE]   # default shared_schemas/data_corpus/cases.jsonl

The apps' trainer cores turn a user's text (or chat JSONL) into training rows, hold out a seeded
fraction and shuffle rows per pass exactly as the host does (`toolchain/text/text_data.py`,
`toolchain/text/shuffle.py`, `toolchain/training/order.py`). Each line is one case, computed by those
host functions; the Kotlin and Swift tests must reproduce every case. Kinds (fields):

    splitmix  seed, outputs            the first outputs of SplitMix64 (u64 as decimal strings)
    permutation  n, seed, perm         toolchain.text.shuffle.permutation(n, seed)
    order     rows, seed, steps, order the rows of the first `steps` steps of `train --shuffle seed`
    split     rows, fraction, seed, held   indices held out by `toolchain data --held-out fraction --seed seed`
    lcsb_plan layers, k, policy, seed, period, phases, schedule   make_plan (toolchain/lcsb/plan.py), every policy;
              some add warmup (make_plan's `warmup`) and layers_at {step: layers} (StepPlan.layers_at) for
              steps around the warm-up's end (cases without `warmup` have none: 0)
    text      tokenizer, seq_len, text, rows   text_rows: rows as lists of input_ids
    chat      tokenizer, seq_len, messages, input_ids, labels   one conversation's row

`tokenizer` is "byte" (the demo's, `ToolchainByteTokenizer`) or "qwen2.5" (its tokenizer.json is
what `toolchain export` writes; the app tests build it as they do for shared_schemas/tokenizer_corpus).
Deterministic: the same code writes the same file (`tests/scripts/test_data_corpus.py`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolchain.lcsb.plan import make_plan  # noqa: E402
from toolchain.text.shuffle import SplitMix64, permutation  # noqa: E402
from toolchain.text.text_data import split_held_out, text_rows  # noqa: E402
from toolchain.text.chat_template import apply_chat_template
from toolchain.text.tokenizer_source import load_tokenizer
from toolchain.training.order import data_order  # noqa: E402

DEFAULT_OUT = REPO / "shared_schemas" / "data_corpus" / "cases.jsonl"

TEXTS = [
    "The river ran slowly past the old mill.",
    "A lighthouse keeper's log, day 41: fog until noon; the lamp needed new wicks.\n\nDay 42: clear.",
    "  leading spaces, trailing spaces   \n\ttabs\tand\r\nwindows line ends\r\n",
    "Unicode: café, naïve, 東京, 한국어, Ελληνικά, emoji 😀👍🏽, combining e\u0301.",
    "Special-looking text <|endoftext|> and <|im_start|>user must stay text.",
    "x",
    "Numbers 1234567890 and 3.14159, punctuation!?;: (brackets) [and] {braces}.",
]
LONG = " ".join(f"Sentence {i} of a longer note that spans several windows." for i in range(40))
CHATS = [
    [{"role": "user", "content": "What is the lamp fuel?"}, {"role": "assistant", "content": "Paraffin, since 1903."}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": "Fog until noon.\nThen clear."}],
    [{"role": "user", "content": "Ünïcödé 東京?"}, {"role": "assistant", "content": "\nStarts with a newline."}],
]


def cases() -> list[dict]:
    out: list[dict] = []
    for seed in (0, 1234567, 2**64 - 1):
        rng = SplitMix64(seed)
        out.append({"kind": "splitmix", "seed": str(seed), "outputs": [str(rng.next()) for _ in range(8)]})
    for n, seed in [(1, 0), (2, 0), (5, 4), (7, -3), (10, 2**40), (37, 99), (100, 7)]:
        out.append({"kind": "permutation", "n": n, "seed": seed, "perm": permutation(n, seed)})
    for rows, seed in [(1, 5), (3, 7), (5, 9), (11, -1)]:
        out.append({"kind": "order", "rows": rows, "seed": seed, "steps": 3 * rows + 2,
                    "order": data_order(rows, 3 * rows + 2, shuffle_seed=seed)})
    for rows, fraction, seed in [(2, 0.5, 0), (10, 0.1, 0), (10, 0.25, 3), (7, 0.5, 1), (40, 0.2, 12345), (3, 0.5, 2)]:
        train, held = split_held_out(list(range(rows)), fraction, seed)
        out.append({"kind": "split", "rows": rows, "fraction": fraction, "seed": seed, "held": held})
    for layers, k, policy, seed, period in [(8, 2, "random", 7, 6), (24, 6, "random", 0, None), (3, 1, "random", 5, 4),
                                            (10, 4, "cyclic", None, None), (10, 4, "strided", None, None),
                                            (24, 5, "cyclic", None, None), (7, 3, "last", None, None),
                                            (10, 4, "anchored", None, None), (24, 6, "anchored", None, None),
                                            (5, 5, "full", None, None)]:
        plan = make_plan(layers, k, policy, seed=seed, period=period)
        out.append({"kind": "lcsb_plan", "layers": layers, "k": k, "policy": policy, "seed": seed, "period": period,
                    "phases": [list(p) for p in plan.phases], "schedule": list(plan.schedule)})
    for layers, k, policy, seed, period, warmup in [(10, 4, "anchored", None, None, 30), (12, 4, "cyclic", None, None, 5),
                                                    (8, 2, "random", 3, 5, 7), (6, 3, "strided", None, None, 1)]:
        plan = make_plan(layers, k, policy, seed=seed, period=period, warmup=warmup)
        steps = sorted({0, warmup - 2, warmup - 1, warmup, warmup + 1, warmup + plan.period, warmup + 2 * plan.period + 1}
                       - {-1, -2})
        out.append({"kind": "lcsb_plan", "layers": layers, "k": k, "policy": policy, "seed": seed, "period": period,
                    "warmup": warmup, "phases": [list(p) for p in plan.phases], "schedule": list(plan.schedule),
                    "layers_at": {str(s): list(plan.layers_at(s)) for s in steps}})
    for name in ("byte", "qwen2.5"):
        tok = load_tokenizer(name)
        for seq_len in (8, 64):
            for text in TEXTS + [LONG]:
                out.append({"kind": "text", "tokenizer": name, "seq_len": seq_len, "text": text,
                            "rows": [r["input_ids"] for r in text_rows(text, tok, seq_len)]})
    tok = load_tokenizer("qwen2.5")
    for messages in CHATS:
        ids, mask = apply_chat_template(tok, messages)
        out.append({"kind": "chat", "tokenizer": "qwen2.5", "seq_len": 128, "messages": messages,
                    "input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]})
    return out


def render() -> str:
    return "".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) + "\n" for c in cases())


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else DEFAULT_OUT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
