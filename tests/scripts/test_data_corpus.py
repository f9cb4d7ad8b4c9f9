"""shared_schemas/data_corpus/cases.jsonl is what scripts/record_data_corpus.py writes from the host's
own data functions today (so the apps' tests, which replay it, test against the current host rules)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("record_data_corpus", REPO / "scripts" / "record_data_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_corpus_equals_a_fresh_recording():
    committed = (REPO / "shared_schemas" / "data_corpus" / "cases.jsonl").read_text(encoding="utf-8")
    assert committed == _script().render(), "re-run scripts/record_data_corpus.py and commit the result"


def test_corpus_covers_every_kind_and_both_tokenizers():
    cases = [json.loads(line) for line in (REPO / "shared_schemas" / "data_corpus" / "cases.jsonl").open()]
    kinds = {c["kind"] for c in cases}
    assert kinds == {"splitmix", "permutation", "order", "split", "lcsb_plan", "text", "chat"}
    assert {c["tokenizer"] for c in cases if c["kind"] == "text"} == {"byte", "qwen2.5"}
    assert any(len(c["rows"]) > 3 for c in cases if c["kind"] == "text")  # windows with the 1-token overlap
    assert all(set(c["held"]) <= set(range(c["rows"])) and c["held"] == sorted(c["held"])
               for c in cases if c["kind"] == "split")


def test_corpus_has_warmup_plans_with_layers_around_the_boundary():
    cases = [json.loads(line) for line in (REPO / "shared_schemas" / "data_corpus" / "cases.jsonl").open()]
    warm = [c for c in cases if c["kind"] == "lcsb_plan" and c.get("warmup", 0) > 0]
    assert len(warm) >= 3
    for c in warm:
        steps = {int(s): layers for s, layers in c["layers_at"].items()}
        w = c["warmup"]
        assert steps[w - 1] == list(range(c["layers"])) and w in steps  # the last warm-up step and the first plan step
        assert steps[w] == c["phases"][c["schedule"][w % len(c["schedule"])]]
