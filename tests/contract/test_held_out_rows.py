"""The held-out pass of a training run reads the same number of rows on the host and in both apps."""

import re
from pathlib import Path

from toolchain.contract import HELD_OUT_EVAL_ROWS

ROOT = Path(__file__).resolve().parents[2]


def _constant(path: Path, pattern: str) -> int:
    found = re.findall(pattern, path.read_text(encoding="utf-8"))
    assert len(found) == 1, f"{path}: {pattern} found {len(found)} times"
    return int(found[0])


def test_the_apps_cap_the_held_out_pass_at_the_hosts_number():
    kotlin = _constant(ROOT / "android/trainer-core/src/main/kotlin/org/onphonellm/trainer/core/Contract.kt",
                       r"const val HELD_OUT_EVAL_ROWS = (\d+)")
    swift = _constant(ROOT / "ios/TrainerCore/Sources/TrainerCore/Contract.swift",
                      r"static let heldOutEvalRows = (\d+)")
    assert kotlin == swift == HELD_OUT_EVAL_ROWS
