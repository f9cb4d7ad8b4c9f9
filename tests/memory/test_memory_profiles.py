"""Device profiles: the seven shipped ones load, their budgets add up, every headroom item cites a
source, and broken profiles are refused."""

from __future__ import annotations

import json

import pytest

from toolchain.errors import BadInput, SchemaError
from toolchain.memory.profiles import PROFILE_DIR, load_profile, profile_names


def test_the_seven_classes_are_shipped():
    assert profile_names() == ["android-12gb", "android-16gb", "android-6gb", "android-8gb", "ios-12gb", "ios-6gb",
                               "ios-8gb"]


@pytest.mark.parametrize("name", ["android-6gb", "android-8gb", "android-12gb", "android-16gb", "ios-6gb", "ios-8gb",
                                  "ios-12gb"])
def test_profile_budget_adds_up(name):
    p = load_profile(name)
    platform, gb = name.split("-")
    assert p.platform == platform and p.total_ram_mb == int(gb[:-2]) * 1024
    rest = p.total_ram_mb - sum(p.headroom_mb.values())
    assert p.budget_mb == (rest if p.per_app_limit_mb is None else min(rest, p.per_app_limit_mb))
    assert 0 < p.budget_mb < p.total_ram_mb / 2          # a background trainer never gets half the phone
    assert p.estimated_items, "every shipped number here is an estimate and must say so"
    ids = {s["id"] for s in p.doc["sources"]}
    assert all(h["sources"] and set(h["sources"]) <= ids for h in p.doc["headroom"])
    assert (p.per_app_limit_mb is None) == (platform == "android")


def test_bigger_phones_get_bigger_budgets():
    for platform in ("android", "ios"):
        budgets = [load_profile(f"{platform}-{gb}gb").budget_mb for gb in (6, 8, 12)]
        assert budgets == sorted(budgets) and len(set(budgets)) == 3


def test_custom_profile_by_path_and_its_checks(tmp_path):
    doc = json.loads((PROFILE_DIR / "android-8gb.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**doc, "name": "mine"}))
    assert load_profile(path).name == "mine"
    path.write_text(json.dumps({**doc, "budget_mb": doc["budget_mb"] + 100}))
    with pytest.raises(SchemaError, match="budget_mb .* != total_ram_mb - headroom"):
        load_profile(path)
    bad = dict(doc, headroom=[dict(doc["headroom"][0], sources=["nowhere"])] + doc["headroom"][1:])
    path.write_text(json.dumps(bad))
    with pytest.raises(SchemaError, match="unknown source ids nowhere"):
        load_profile(path)
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != "sources"}))
    with pytest.raises(SchemaError, match="sources"):
        load_profile(path)


def test_unknown_profile_names_the_choices():
    with pytest.raises(BadInput, match="unknown device profile 'nokia-3310'; choose android-12gb"):
        load_profile("nokia-3310")
    with pytest.raises(BadInput, match="does not exist"):
        load_profile("missing.json")
