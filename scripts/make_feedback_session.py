"""Write the demo's scripted feedback session from the bundled user text (deterministic; run from the repository
root): `toolchain/assets/feedback_session.jsonl` (training records, from user_text.txt) and
`toolchain/assets/feedback_held_out.jsonl` (held-out edits, from user_text_held_out.txt).

What the records play: the keeper asks the model to continue a sentence of her log. The model's suggestion (the
"response") is a fragment of the books the demo model was pretrained on (demo_corpus.txt, the same length in
words), i.e. what the pretrained model tends to write; what she keeps is her own sentence's end. Per sentence of
user_text.txt with at least 6 words, in order, cycling through: an edit (response = the book fragment, edited =
her words), an accept (response = her words), and every third accept gets a reject too (another book fragment
for the same prompt, discarded). Held-out: one edit per sentence of user_text_held_out.txt.

    python scripts/make_feedback_session.py
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "toolchain" / "assets"
TIME = "2026-12-07T09:{:02d}:{:02d}Z"


def sentences(text: str) -> list[str]:
    out = []
    for para in text.split("\n\n"):
        out += [s.strip() for s in re.split(r"(?<=\.)\s+", para.replace("\n", " ")) if len(s.split()) >= 6]
    return out


def book_fragments(rng: random.Random, words: list[str], n: int) -> str:
    start = rng.randrange(0, len(words) - n)
    return " " + " ".join(words[start:start + n])


def split(sentence: str) -> tuple[str, str]:
    words = sentence.split()
    k = max(2, len(words) // 2)
    return " ".join(words[:k]), " " + " ".join(words[k:])


def main() -> None:
    rng = random.Random(0)
    book = re.sub(r"\s+", " ", (ASSETS / "demo_corpus.txt").read_text(encoding="utf-8")).split(" ")
    train = sentences((ASSETS / "user_text.txt").read_text(encoding="utf-8")[len("Log of the Varrow Light, kept by "
                                                                               "Marisol Quenby, keeper.\n\n"):])
    held = sentences((ASSETS / "user_text_held_out.txt").read_text(encoding="utf-8"))
    records, seen = [], set()
    n = 0
    for s in train:
        prompt, mine = split(s)
        if prompt in seen:                      # one record per prompt (the log repeats its phrases)
            continue
        seen.add(prompt)
        theirs = book_fragments(rng, book, len(mine.split()))
        t = TIME.format(n // 60 % 60, n % 60)
        if n % 2 == 0:
            records.append({"prompt": prompt, "response": theirs, "action": "edit", "edited": mine, "time": t})
        else:
            records.append({"prompt": prompt, "response": mine, "action": "accept", "time": t})
            if n % 3 == 1:
                records.append({"prompt": prompt, "response": book_fragments(rng, book, len(mine.split())),
                                "action": "reject", "time": t})
        n += 1
        if n == 36:
            break
    held_records = []
    for s in held:
        prompt, mine = split(s)
        if prompt in seen:
            continue
        seen.add(prompt)
        held_records.append({"prompt": prompt, "response": book_fragments(rng, book, len(mine.split())),
                             "action": "edit", "edited": mine, "time": TIME.format(59, len(held_records))})
    for name, recs in (("feedback_session.jsonl", records), ("feedback_held_out.jsonl", held_records)):
        (ASSETS / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
        print(f"{len(recs)} records -> {ASSETS / name}")


if __name__ == "__main__":
    main()
