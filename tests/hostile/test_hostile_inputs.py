"""Hostile inputs and faults (tests/hostile/cases.py): each ends with exit code 2, exactly one `Error:`
line, no traceback, nothing left behind and no pre-existing file touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from cases import CASES, Case
from harness import run_case


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, tiny_program: Path, tmp_path: Path, monkeypatch) -> None:
    got = run_case(case, tiny_program, tmp_path, monkeypatch)
    assert not got.traceback, got.stderr
    assert got.code == 2, f"exit {got.code}\n{got.stderr}"
    assert len(got.errors) == 1, got.stderr
    assert case.expect in got.errors[0], got.errors[0]
    assert got.left == [], "output left behind"
    assert got.lost == [], "pre-existing files lost"
    assert got.changed == [], "pre-existing files changed"


def test_every_case_has_a_unique_id() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
