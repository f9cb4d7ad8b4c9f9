"""`toolchain telemetry import|runs|report`: round trip through the CLI, and every bad input -> one
`Error:` line, exit 2, nothing written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from toolchain.cli import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "telemetry"))
from telemetry_samples import FIXTURE_RUN, FIXTURE_RUN_ID, step_event  # noqa: E402


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_import_is_idempotent_then_report(tmp_path):
    db = tmp_path / "t.sqlite3"
    first = run("telemetry", "import", FIXTURE_RUN, "--db", db)
    assert first.exit_code == 0, first.output
    assert f"51 new, 0 already stored; run {FIXTURE_RUN_ID}" in first.output
    again = run("telemetry", "import", FIXTURE_RUN, "--db", db)
    assert "0 new, 51 already stored" in again.output
    listed = run("telemetry", "runs", "--db", db)
    assert listed.exit_code == 0 and f"{FIXTURE_RUN_ID}  51 events  tiny on host" in listed.output
    out = tmp_path / "report"
    rep = run("telemetry", "report", FIXTURE_RUN_ID, "--db", db, "--out", out)
    assert rep.exit_code == 0, rep.output
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "loss.png", "memory.png", "step_time.png",
                                                     "summary.json"]
    assert json.loads((out / "summary.json").read_text())["steps"] == 24


def test_a_bad_file_stores_nothing_even_with_good_files(tmp_path):
    db, bad = tmp_path / "t.sqlite3", tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(step_event(0)) + "\n" + json.dumps(step_event(1, loss="?")) + "\n")
    r = run("telemetry", "import", FIXTURE_RUN, bad, "--db", db)
    assert r.exit_code == 2 and "Error: " in r.output and "bad.jsonl:2" in r.output
    assert not db.exists()                  # validated before storing: the good file was not stored either


def test_report_errors(tmp_path):
    db = tmp_path / "t.sqlite3"
    missing = run("telemetry", "report", "x", "--db", db, "--out", tmp_path / "o")
    assert missing.exit_code == 2 and "does not exist" in missing.output
    run("telemetry", "import", FIXTURE_RUN, "--db", db)
    unknown = run("telemetry", "report", "nope", "--db", db, "--out", tmp_path / "o")
    assert unknown.exit_code == 2 and f"stored runs: {FIXTURE_RUN_ID}" in unknown.output
    assert not (tmp_path / "o").exists()


def test_serve_needs_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLCHAIN_TELEMETRY_TOKEN", raising=False)
    r = run("telemetry", "serve", "--db", tmp_path / "t.sqlite3")
    assert r.exit_code == 2 and "--token" in r.output
