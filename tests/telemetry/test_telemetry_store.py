"""The event store on both backends (a SQLite file; a schema of a real PostgreSQL cluster, see conftest.py):
each (run_id, seq) once, conflicting reuse refused, batches all-or-nothing, versioned migrations applied once,
a database holding what is not the store's refused untouched."""

from __future__ import annotations

import hashlib
import sqlite3
import threading

import pytest
from telemetry_samples import run_start_event, step_event

from toolchain.errors import BadInput
from toolchain.telemetry.store import SCHEMA_VERSION, VERSION_TABLE, ConflictingEvents, EventStore, open_store


@pytest.fixture
def store(db_target):
    with open_store(db_target) as s:
        yield s


def test_retries_are_not_duplicates(store):
    assert store.add([step_event(0), step_event(1)]) == (2, 2, 0)
    assert store.add([step_event(1), step_event(2)]) == (2, 1, 1)
    assert store.add([step_event(2), step_event(2)]) == (2, 0, 2)
    assert [e["seq"] for e in store.events("r1")] == [0, 1, 2]
    assert store.events("r1")[1] == step_event(1)


def test_reused_seq_with_other_content_refuses_the_whole_batch(store):
    store.add([step_event(0)])
    with pytest.raises(ConflictingEvents, match="r1#0") as info:
        store.add([step_event(1), step_event(0, loss=9.0)])
    assert info.value.keys == [("r1", 0)]
    assert store.count() == 1                      # seq 1 was not stored either
    with pytest.raises(ConflictingEvents):
        store.add([step_event(5), step_event(5, loss=1.0)])   # conflict inside one batch
    assert store.count() == 1


def test_runs_and_paging(store, tmp_path):
    start = run_start_event("r2")
    end = {"schema_version": 1, "type": "run_end", "run_id": "r2", "seq": 2, "timestamp": 3.0, "status": "completed",
           "steps_completed": 1}
    store.add([start, step_event(1, run_id="r2"), end])
    store.add([step_event(s) for s in range(5)])
    runs = {r.run_id: r for r in store.runs()}
    assert runs["r2"].events == 3 and runs["r2"].model == "tiny" and runs["r2"].status == "completed"
    assert runs["r1"].events == 5 and runs["r1"].model is None and runs["r1"].status is None
    assert [e["seq"] for e in store.events("r1", after_seq=1, limit=2)] == [2, 3]
    assert store.events("nope") == []


def test_data_survives_reopening(db_target):
    with open_store(db_target) as s:
        s.add([step_event(0)])
    with open_store(db_target) as s:
        assert s.count("r1") == 1


def test_not_a_database_or_no_directory(tmp_path):
    bad = tmp_path / "x.sqlite3"
    bad.write_text("this is not sqlite " * 100)
    with pytest.raises(BadInput, match="not a usable SQLite database"):
        EventStore(bad)
    assert bad.read_text() == "this is not sqlite " * 100
    with pytest.raises(BadInput, match="does not exist"):
        EventStore(tmp_path / "missing" / "t.sqlite3")


def test_concurrent_writers_lose_nothing(store):
    def work(t: int) -> None:
        for s in range(50):
            store.add([step_event(s, run_id=f"w{t}")])
            store.add([step_event(s, run_id=f"w{t}")])     # and a retry

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert store.count() == 200
    assert all(r.events == 50 for r in store.runs())


def test_stores_racing_on_the_same_keys_store_each_once(db_target):
    """Separate stores (connections) writing overlapping batches at once, in opposite orders: each event stored
    once, the answers' stored counts add up to the events, nothing deadlocks."""
    stores = [open_store(db_target) for _ in range(4)]
    answers: list = []
    errors: list = []

    def work(t: int) -> None:
        seqs = list(range(0, 200, 10))
        for start in (seqs if t % 2 else seqs[::-1]):
            try:
                answers.append(stores[t].add([step_event(s) for s in range(start, start + 10)]))
            except Exception as e:  # surfaced below
                errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert sum(a.stored for a in answers) == 200 and sum(a.duplicates for a in answers) == 600
    assert [e["seq"] for e in stores[0].events("r1")] == list(range(200))
    for s in stores:
        s.close()


def _versions(db_target, postgres) -> list[int]:
    if isinstance(db_target, str):
        with postgres.connect() as conn:
            schema = db_target.rsplit("%3D", 1)[1]
            return [v for (v,) in conn.execute(f"SELECT version FROM {schema}.{VERSION_TABLE}").fetchall()]
    with sqlite3.connect(db_target) as db:
        return [v for (v,) in db.execute(f"SELECT version FROM {VERSION_TABLE}")]


def test_migrations_are_applied_once_even_by_concurrent_openers(db_target, request):
    postgres = request.getfixturevalue("postgres") if isinstance(db_target, str) else None
    errors: list = []

    def opener() -> None:
        try:
            open_store(db_target).close()
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert _versions(db_target, postgres) == list(range(1, SCHEMA_VERSION + 1))
    with open_store(db_target) as s:            # and reopening applies nothing again
        s.add([step_event(0)])
    assert _versions(db_target, postgres) == list(range(1, SCHEMA_VERSION + 1))


def test_a_store_of_a_newer_schema_version_is_refused(db_target, request):
    open_store(db_target).close()
    if isinstance(db_target, str):
        with request.getfixturevalue("postgres").connect() as conn:
            conn.execute(f"INSERT INTO {db_target.rsplit('%3D', 1)[1]}.{VERSION_TABLE} VALUES (99, 0)")
    else:
        with sqlite3.connect(db_target) as db:
            db.execute(f"INSERT INTO {VERSION_TABLE} VALUES (99, 0)")
    with pytest.raises(BadInput, match="version 99, newer"):
        open_store(db_target)


def test_a_sqlite_store_of_before_the_version_table_is_adopted(tmp_path):
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:     # what the unversioned store created
        db.execute("CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, "
                   "timestamp REAL NOT NULL, body TEXT NOT NULL, received_at REAL NOT NULL, "
                   "PRIMARY KEY (run_id, seq)) WITHOUT ROWID")
        db.execute("CREATE INDEX events_by_type ON events (run_id, type)")
    with EventStore(path) as s:
        assert s.add([step_event(0)]).stored == 1
    assert _versions(path, None) == [1]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("foreign, reason", [
    ("CREATE TABLE users (id INTEGER)", "holds table users"),
    ("CREATE TABLE events (id INTEGER, name TEXT)", r"table events with columns \(id, name\)"),
    ("CREATE VIEW v AS SELECT 1", "holds view v"),
])
def test_a_sqlite_file_of_another_application_is_refused_untouched(tmp_path, foreign, reason):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute(foreign)
    before = _digest(path)
    with pytest.raises(BadInput, match=reason):
        EventStore(path)
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]          # no -wal, -shm or -journal
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL


@pytest.mark.parametrize("foreign, reason", [
    ("CREATE TABLE users (id INTEGER)", "holds table users"),
    ("CREATE TABLE events (id INTEGER, name TEXT)", r"table events with columns \(id, name\)"),
    ("CREATE SEQUENCE counter", "holds sequence counter"),
    ("CREATE VIEW v AS SELECT 1 AS one", "holds view v"),
])
def test_a_postgresql_schema_of_another_application_is_refused_untouched(postgres, foreign, reason):
    schema, url = postgres.new_schema()
    with postgres.connect() as conn:
        conn.execute(f"SET search_path = {schema}")
        conn.execute(foreign)
    with pytest.raises(BadInput, match=reason):
        open_store(url)
    with postgres.connect() as conn:
        tables = conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                              "WHERE n.nspname = %s ORDER BY relname", (schema,)).fetchall()
    assert VERSION_TABLE not in {t for (t,) in tables} and len(tables) == 1


def test_postgresql_refusals_are_one_line_errors(postgres):
    with pytest.raises(BadInput, match="no schema of the search_path exists"):
        open_store(postgres.url("no_such_schema"))
    with pytest.raises(BadInput, match=r"cannot connect to PostgreSQL at postgresql://u:\*\*\*@127.0.0.1:1/db") as info:
        open_store("postgresql://u:secret@127.0.0.1:1/db?connect_timeout=2")
    assert "secret" not in str(info.value) and "\n" not in str(info.value)
