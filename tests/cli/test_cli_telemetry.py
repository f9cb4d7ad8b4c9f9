"""`toolchain telemetry import|runs|report`: round trip through the CLI, and every bad input -> one
`Error:` line, exit 2, nothing written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from toolchain.cli import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "telemetry"))
from telemetry_samples import FIXTURE_RUN, FIXTURE_RUN_ID, baseline_run, step_event  # noqa: E402

from toolchain.schemas import SCHEMA_DIR  # noqa: E402

EXAMPLES = SCHEMA_DIR / "examples"


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


def test_import_accepts_a_json_array(tmp_path):
    db = tmp_path / "t.sqlite3"
    r = run("telemetry", "import", EXAMPLES / "telemetry_run_android.json", EXAMPLES / "telemetry_run_ios.json",
            "--db", db)
    assert r.exit_code == 0, r.output
    assert "12 new, 0 already stored; run 3f2c9a7e1b5d4c08a6e2f1d7c9b0a415" in r.output
    bad = tmp_path / "pretty.json"
    bad.write_text(json.dumps(step_event(0), indent=2))             # one event over several lines: accepted
    assert run("telemetry", "import", bad, "--db", db).exit_code == 0
    bad.write_text(json.dumps(step_event(0), indent=2) * 2)         # two of them: neither form
    r = run("telemetry", "import", bad, "--db", db)
    assert r.exit_code == 2 and "expected JSONL (one event object per line) or one JSON array of events" in r.output


def test_fleet_lists_every_stored_run_and_filters(tmp_path):
    db = tmp_path / "t.sqlite3"
    host = tmp_path / "host.jsonl"
    host.write_text("".join(json.dumps(e) + "\n" for e in baseline_run()))
    r = run("telemetry", "import", FIXTURE_RUN, EXAMPLES / "telemetry_run_android.json",
            EXAMPLES / "telemetry_run_ios.json", host, "--db", db)
    assert r.exit_code == 0, r.output
    out = tmp_path / "fleet"
    r = run("telemetry", "fleet", "--db", db, "--out", out)
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "fleet.json").read_text())
    ids = {FIXTURE_RUN_ID, "3f2c9a7e1b5d4c08a6e2f1d7c9b0a415", "ios-2026-01-01T00-00-00Z-7c1e", "host-baseline-run"}
    assert {row["run_id"] for row in doc["runs"]} == ids and len(doc["groups"]) == 4
    page = (out / "index.html").read_text()
    for run_id in ids:
        assert f"runs/{run_id}/index.html" in page and (out / "runs" / run_id / "index.html").is_file()
    host_row = next(row for row in doc["runs"] if row["run_id"] == "host-baseline-run")
    assert host_row["planner_error"] is not None and -0.3 < host_row["planner_error"] < 0
    android = next(g for g in doc["groups"] if g["device_model"] == "Pixel 8")
    assert android["runs"] == 1 and android["failed"] == 1 and android["low_memory_signals"] == 1
    assert (out / "scatter.png").read_bytes()[:4] == b"\x89PNG"

    again = run("telemetry", "fleet", "--db", db, "--out", out)
    assert again.exit_code == 2 and "not empty" in again.output
    only = run("telemetry", "fleet", "--db", db, "--out", tmp_path / "f2", "--device", "Pixel 8", "--no-run-reports")
    assert only.exit_code == 0, only.output
    assert [row["run_id"] for row in json.loads((tmp_path / "f2" / "fleet.json").read_text())["runs"]] == [
        "3f2c9a7e1b5d4c08a6e2f1d7c9b0a415"]
    assert not (tmp_path / "f2" / "runs").exists()
    none = run("telemetry", "fleet", "--db", db, "--out", tmp_path / "f3", "--since", "2099-01-01")
    assert none.exit_code == 2 and "no stored run" in none.output and not (tmp_path / "f3").exists()
    baddate = run("telemetry", "fleet", "--db", db, "--out", tmp_path / "f3", "--until", "yesterday")
    assert baddate.exit_code == 2 and "YYYY-MM-DD" in baddate.output
