"""`toolchain telemetry import|runs|report|fleet` on both backends (`--db` a SQLite path or a postgresql:// URL):
the same answers from the same events; on PostgreSQL, refusals are one `Error:` line naming no password."""

from __future__ import annotations

import json

from click.testing import CliRunner
from telemetry_samples import FIXTURE_RUN, FIXTURE_RUN_ID

from toolchain.cli import cli
from toolchain.schemas import SCHEMA_DIR

ANDROID_RUN = SCHEMA_DIR / "examples" / "telemetry_run_android.json"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_import_runs_report_fleet(db_target, tmp_path):
    first = run("telemetry", "import", FIXTURE_RUN, ANDROID_RUN, "--db", db_target)
    assert first.exit_code == 0, first.output
    assert f"51 new, 0 already stored; run {FIXTURE_RUN_ID}" in first.output
    again = run("telemetry", "import", FIXTURE_RUN, "--db", db_target)
    assert "0 new, 51 already stored" in again.output
    listed = run("telemetry", "runs", "--db", db_target)
    assert listed.exit_code == 0 and f"{FIXTURE_RUN_ID}  51 events  tiny on host" in listed.output
    assert len(listed.output.splitlines()) == 2
    rep = run("telemetry", "report", FIXTURE_RUN_ID, "--db", db_target, "--out", tmp_path / "report")
    assert rep.exit_code == 0, rep.output
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["steps"] == 24
    fleet = run("telemetry", "fleet", "--db", db_target, "--out", tmp_path / "fleet")
    assert fleet.exit_code == 0, fleet.output
    doc = json.loads((tmp_path / "fleet" / "fleet.json").read_text())
    assert sorted(r["run_id"] for r in doc["runs"]) == sorted([FIXTURE_RUN_ID, json.loads(
        ANDROID_RUN.read_text())[0]["run_id"]])
    assert (tmp_path / "fleet" / "runs" / FIXTURE_RUN_ID / "index.html").is_file()
    missing = run("telemetry", "report", "nope", "--db", db_target, "--out", tmp_path / "r2")
    assert missing.exit_code == 2 and "no events for run 'nope'" in missing.output
    assert not (tmp_path / "r2").exists()


def test_postgresql_refusals_name_no_password(postgres, tmp_path):
    r = run("telemetry", "runs", "--db", "postgresql://me:hunter2@127.0.0.1:1/db?connect_timeout=2")
    assert r.exit_code == 2 and r.output.startswith("Error: cannot connect to PostgreSQL at postgresql://me:***@")
    assert "hunter2" not in r.output and r.output.count("\n") == 1
    r = run("telemetry", "import", FIXTURE_RUN, "--db", postgres.url("missing_schema"))
    assert r.exit_code == 2 and "no schema of the search_path exists" in r.output
