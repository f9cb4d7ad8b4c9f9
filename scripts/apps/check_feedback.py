"""Validate feedback files an app's host tests wrote (android/test.sh, ios/test.sh) against
shared_schemas/feedback.schema.json with the host's own validator (jsonschema, Draft 2020-12, formats checked),
plus the two rules the schema states in words (messages end with a user turn; edited differs from response).

Usage: python scripts/apps/check_feedback.py NAME FILE.jsonl [MIN_RECORDS]
Prints one line: "feedback (NAME): N records valid (accept a, edit e, reject r)"; exit 1 naming the first bad line.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from toolchain.schemas import validation_errors


def check(path: Path, min_records: int) -> Counter:
    actions: Counter = Counter()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name} line {n}"
        doc = json.loads(line)
        errors = validation_errors("feedback", doc)
        if errors:
            raise SystemExit(f"Error: {where}: {errors[0]}")
        if "messages" in doc and doc["messages"][-1]["role"] != "user":
            raise SystemExit(f"Error: {where}: messages must end with a user turn")
        if doc["action"] == "edit" and doc["edited"] == doc["response"]:
            raise SystemExit(f"Error: {where}: edited equals response")
        actions[doc["action"]] += 1
    if sum(actions.values()) < min_records:
        raise SystemExit(f"Error: {path}: {sum(actions.values())} records, expected at least {min_records}")
    return actions


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("Error: usage: check_feedback.py NAME FILE.jsonl [MIN_RECORDS]")
    a = check(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) == 4 else 1)
    print(f"feedback ({sys.argv[1]}): {sum(a.values())} records valid "
          f"(accept {a['accept']}, edit {a['edit']}, reject {a['reject']})")
