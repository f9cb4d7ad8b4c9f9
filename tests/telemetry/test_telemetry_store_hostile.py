"""The event store against hostile databases and clients: non-UTF-8 PostgreSQL databases, schemas holding objects of
any kind, numbers re-sent in another spelling, a database that stops answering (SIGSTOP)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pg_cluster
import pytest
from telemetry_samples import run_start_event, step_event
from test_telemetry_server import TOKEN, Client

from toolchain.errors import BadInput
from toolchain.telemetry import server as server_module
from toolchain.telemetry.server import create_app, start_in_thread
from toolchain.telemetry.store import ConflictingEvents, open_store, same_body

EMOJI = "Pixel \U0001F642 \u00e9"


def _database(postgres, name: str, encoding: str) -> str:
    with postgres.connect() as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            admin.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' TEMPLATE template0 LC_COLLATE 'C' "
                          f"LC_CTYPE 'C'")
    return postgres.base_url().replace("/postgres?", f"/{name}?")


def test_a_sql_ascii_database_stores_utf8_and_answers_retries_as_duplicates(postgres):
    """initdb's default under LANG=C: every event used to be a 409 (bytes read back compared unequal to text)."""
    url = _database(postgres, "h_sql_ascii", "SQL_ASCII")
    events = [run_start_event("r-ascii", device_model=EMOJI), step_event(1, "r-ascii")]
    with open_store(url) as store:
        first = store.add(events)
        again = store.add(events)
        stored = store.events("r-ascii")
        runs = {r.run_id: r for r in store.runs()}
    assert (first.stored, again.stored, again.duplicates) == (2, 0, 2)
    assert stored[0]["device_model"] == EMOJI and runs["r-ascii"].device_model == EMOJI


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252"])
def test_a_database_that_cannot_hold_utf8_is_refused_at_start(postgres, encoding):
    url = _database(postgres, f"h_{encoding.lower()}", encoding)
    with pytest.raises(BadInput, match=f"has encoding {encoding}.*UTF8"):
        open_store(url)


@pytest.mark.parametrize("objects, shown", [
    (["CREATE FOREIGN DATA WRAPPER {s}_w", "CREATE SERVER {s}_srv FOREIGN DATA WRAPPER {s}_w",
      "CREATE FOREIGN TABLE {s}.ft (a int) SERVER {s}_srv"], "foreign table ft"),
    (["CREATE FUNCTION {s}.veq(varchar, varchar) RETURNS bool LANGUAGE sql AS 'SELECT $1::text = $2::text'",
      "CREATE OPERATOR {s}.= (leftarg = varchar, rightarg = varchar, function = {s}.veq)"], "operator ="),
    (["CREATE FUNCTION {s}.nteq(name, text) RETURNS bool LANGUAGE sql AS 'SELECT $1::text = $2'",
      "CREATE OPERATOR {s}.= (leftarg = name, rightarg = text, function = {s}.nteq)"], "function nteq"),
    (["CREATE TYPE {s}.mood AS ENUM ('calm')"], "type mood"),
    (["CREATE DOMAIN {s}.positive AS int CHECK (VALUE > 0)"], "type positive"),
    (["CREATE TYPE {s}.pair AS (a int, b int)"], "type pair"),
    (["CREATE SEQUENCE {s}.counter"], "sequence counter"),
    (["CREATE COLLATION {s}.mine FROM \"C\""], "collation mine"),
], ids=["foreign-table", "operator-varchar", "operator-name-text", "enum", "domain", "composite", "sequence",
        "collation"])
def test_a_schema_holding_any_kind_of_object_is_refused_untouched(postgres, objects, shown):
    schema, url = postgres.new_schema()
    with postgres.connect() as admin:
        for statement in objects:
            admin.execute(statement.format(s=schema))
    with pytest.raises(BadInput, match=f"holds .*{shown}.*left untouched"):
        open_store(url)
    with postgres.connect() as admin:
        tables = admin.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                               "WHERE nspname = %s AND relkind = 'r'", (schema,)).fetchall()
    assert tables == []


def test_a_store_reopens_its_own_schema(postgres):
    _, url = postgres.new_schema()
    with open_store(url) as store:
        store.add([step_event(0)])
    with open_store(url) as store:
        assert store.count() == 1


@pytest.mark.parametrize(("a", "b", "same"), [
    ('{"t":1767225600.0}', '{"t":1767225600}', True), ('{"t":1e3}', '{"t":1000}', True),
    ('{"t":[1,2.0]}', '{"t":[1.0,2]}', True), ('{"t":true}', '{"t":1}', False), ('{"t":0}', '{"t":false}', False),
    ('{"t":1}', '{"t":1.5}', False), ('{"t":"1"}', '{"t":1}', False), ('{"a":1}', '{"a":1,"b":null}', False),
])
def test_same_body_compares_parsed_json_values(a, b, same):
    assert same_body(a, b) is same and same_body(b, a) is same


def test_a_number_resent_in_another_spelling_is_a_duplicate_not_a_conflict(db_target):
    with open_store(db_target) as store:
        assert store.add([step_event(0, timestamp=1767225600.0, loss=2.0)]).stored == 1
        again = store.add([step_event(0, timestamp=1767225600, loss=2)])
        assert (again.stored, again.duplicates) == (0, 1)
        with pytest.raises(ConflictingEvents):           # a real difference still conflicts
            store.add([step_event(0, timestamp=1767225601)])
        assert store.count() == 1


# ------------------------------------------------------------------------------------ a frozen database

def _cluster_pids(cluster) -> list[int]:
    """The postmaster of `cluster` and its children (the backends, the checkpointer, ...)."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(entry.name))
    return pids


def test_a_frozen_database_is_reported_by_health_and_writes_fail_fast(monkeypatch):
    """SIGSTOP on every process of the cluster: /v1/health answers 503 within HEALTH_TIMEOUT_S, a write 503 within
    STORE_TIMEOUT_S (both lowered here), and both recover once the database runs again; the write that timed out
    lands when it wakes, so the client's retry is a duplicate."""
    if pg_cluster.why_not():
        pytest.skip(pg_cluster.why_not())
    assert (server_module.STORE_TIMEOUT_S, server_module.HEALTH_TIMEOUT_S) == (5.0, 2.0)   # docs/telemetry.md
    monkeypatch.setattr(server_module, "STORE_TIMEOUT_S", 1.5)
    monkeypatch.setattr(server_module, "HEALTH_TIMEOUT_S", 0.5)
    cluster = pg_cluster.Cluster()
    store = running = c = None
    try:
        _, url = cluster.new_schema()
        store = open_store(url)
        running = start_in_thread(create_app(store, TOKEN))
        c = Client(running.port)
        assert c.request("GET", "/v1/health") == (200, {"ok": True, "database": "ok"})
        assert c.post(step_event(0))[0] == 200
        pids = _cluster_pids(cluster)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            status, body = c.request("GET", "/v1/health")
            health_s = time.monotonic() - t0
            assert (status, body["ok"]) == (503, False) and "no answer within 0.5 s" in body["database"]
            t0 = time.monotonic()
            status, body = c.post(step_event(1))
            write_s = time.monotonic() - t0
            assert status == 503 and "did not answer within 1.5 s" in body["error"], body
            t0 = time.monotonic()
            assert c.request("GET", "/v1/runs")[0] == 503
            read_s = time.monotonic() - t0
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert health_s < 1.5 and write_s < 3.0 and read_s < 3.0, (health_s, write_s, read_s)
        deadline = time.monotonic() + 30
        while c.request("GET", "/v1/health")[0] != 200:
            assert time.monotonic() < deadline, "the server did not recover"
            time.sleep(0.1)
        retry = c.post(step_event(1))
        assert retry[0] == 200 and retry[1]["stored"] + retry[1]["duplicates"] == 1, retry
        assert c.request("GET", "/v1/runs")[1]["runs"][0]["events"] == 2
    finally:
        if c is not None:
            c.close()
        if running is not None:
            running.stop()
        if store is not None:
            store.close()
        cluster.stop()


def test_health_on_sqlite_names_the_database(tmp_path):
    with open_store(tmp_path / "t.sqlite3") as store:
        running = start_in_thread(create_app(store, TOKEN))
        c = Client(running.port, token=None)
        try:
            assert c.request("GET", "/v1/health") == (200, {"ok": True, "database": "ok"})
        finally:
            c.close()
            running.stop()


def test_the_cli_refuses_a_latin1_database_with_one_line(postgres, tmp_path):
    import subprocess
    import sys

    url = _database(postgres, "h_latin1", "LATIN1")
    proc = subprocess.run([sys.executable, "-m", "toolchain", "telemetry", "serve", "--port", "0", "--token", "t",
                           "--db", url], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "LATIN1" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
