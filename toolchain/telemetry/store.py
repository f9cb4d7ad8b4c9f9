"""Event stores of telemetry: each (run_id, seq) once, batches all-or-nothing; SQLite or PostgreSQL.

One table, `events(run_id, seq, type, timestamp, body, received_at)`, keyed by (run_id, seq).
A retried batch stores nothing new (its events are counted as duplicates). An event whose key is
already stored with a *different* body is a conflict (a client reused a sequence number): the
whole batch is refused, so the stored run never mixes two histories.

`open_store(db)`: a `postgresql://` (or `postgres://`) URL opens `pgstore.PostgresEventStore` (several
server processes share one database), anything else is the path of a SQLite file (`EventStore`). Both
keep their schema in versioned migrations (`telemetry_schema_version`: one row per applied version,
applied once, under a lock) and touch only what is their own: a database (a PostgreSQL schema) that holds
any other table, view or trigger is refused before anything is written to it, pragmas included.

SQLite: WAL mode lets a report read while the server writes; `synchronous=NORMAL` survives a crash of
the server (not a power cut). A file this store created is removed again when opening it fails.

Reads are sanitized: a store written by an older version may hold `Infinity`/`NaN` (in a body or a
timestamp); they are read back as null, so listing runs and events keeps working (a report then
refuses such an event by name, since it is no longer a valid event).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from toolchain.errors import BadInput, ToolchainError
from toolchain.telemetry.events import canonical

__all__ = ["EventStore", "AddResult", "RunInfo", "ConflictingEvents", "StoreUnavailable", "open_store",
           "is_database_url", "SCHEMA_VERSION", "VERSION_TABLE"]

VERSION_TABLE = "telemetry_schema_version"
EVENT_COLUMNS = ("run_id", "seq", "type", "timestamp", "body", "received_at")
VERSION_COLUMNS = ("version", "applied_at")
OWN_TABLES = {"events": EVENT_COLUMNS, VERSION_TABLE: VERSION_COLUMNS}
OWN_INDEXES = {"events_by_type"}

# (version, statements): append only, never edit an applied one. PostgreSQL's are in pgstore.py,
# with the same versions and the same tables.
_SQLITE_MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, ("""CREATE TABLE IF NOT EXISTS events (
                run_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                type TEXT NOT NULL,
                timestamp REAL NOT NULL,
                body TEXT NOT NULL,
                received_at REAL NOT NULL,
                PRIMARY KEY (run_id, seq)
            ) WITHOUT ROWID""",
         "CREATE INDEX IF NOT EXISTS events_by_type ON events (run_id, type)")),
)
SCHEMA_VERSION = _SQLITE_MIGRATIONS[-1][0]


class ConflictingEvents(BadInput):
    """Events reuse a stored (run_id, seq) with different content. `keys` lists them."""

    def __init__(self, message: str, keys: list[tuple[str, int]]):
        super().__init__(message)
        self.keys = keys


class StoreUnavailable(ToolchainError):
    """The database failed or cannot be reached (the server answers 503: retry later)."""


class AddResult(NamedTuple):
    received: int     # events in the batch
    stored: int       # newly stored
    duplicates: int   # already stored (or repeated within the batch) with the same content


class RunInfo(NamedTuple):
    run_id: str
    events: int
    first_timestamp: float | None   # None: not a finite number (a store written by an older version)
    last_timestamp: float | None
    model: str | None        # from run_start, when received
    device_model: str | None
    status: str | None       # from run_end, when received


_MAX_SQLITE_INT = 2**63 - 1


def is_database_url(db) -> bool:
    """A PostgreSQL URL (`postgresql://...` or `postgres://...`) rather than a SQLite path."""
    return isinstance(db, str) and db.lower().startswith(("postgresql://", "postgres://"))


def open_store(db: str | Path):
    """The store `db` names: a PostgreSQL URL or a SQLite path (created when missing).

    Raises:
        BadInput: the database cannot be used (unreachable, not a database, holds tables not ours).
    """
    if is_database_url(db):
        from toolchain.telemetry.pgstore import PostgresEventStore

        return PostgresEventStore(db)
    return EventStore(Path(db))


def _finite_or_none(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _text(doc, key: str) -> str | None:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def _decode(body: str):
    """A stored body; NaN/Infinity (stored by older versions) read as null, unreadable bodies as {}."""
    try:
        return json.loads(body, parse_constant=lambda _name: None,
                          parse_float=lambda s: _finite_or_none(float(s)))
    except (ValueError, RecursionError):
        return {}


Key = tuple[str, int]
Plan = list[tuple[int, list[tuple[Key, dict, str]]]]   # per batch: (events, rows new to this call)


def _json_equal(a, b) -> bool:
    """Equality of parsed JSON values: numbers by value (1767225600 == 1767225600.0), booleans only equal to
    booleans (true is not 1), objects key by key, arrays in order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def same_body(a: str | bytes, b: str | bytes) -> bool:
    """Whether two stored event bodies are the same event: equal text, or equal parsed JSON values (a client that
    re-sends `1767225600` where it first sent `1767225600.0` repeats itself, it does not conflict)."""
    if isinstance(a, bytes):
        a = a.decode("utf-8", "replace")
    if isinstance(b, bytes):
        b = b.decode("utf-8", "replace")
    if a == b:
        return True
    try:
        return _json_equal(json.loads(a), json.loads(b))
    except (ValueError, RecursionError):
        return False


def plan_batches(batches: list[list[dict]]) -> tuple[Plan, list[Key]]:
    """Each batch's events that are new to this call (key, event, canonical body), and the keys repeated
    within the call with different content."""
    seen: dict[Key, str] = {}
    conflicts: list[Key] = []
    plan: Plan = []
    for events in batches:
        fresh = []
        for event in events:
            key, body = (event["run_id"], event["seq"]), canonical(event)
            if key in seen:
                if not same_body(seen[key], body):
                    conflicts.append(key)
                continue
            seen[key] = body
            fresh.append((key, event, body))
        plan.append((len(events), fresh))
    return plan, conflicts


def conflict_error(conflicts: list[Key]) -> ConflictingEvents:
    shown = ", ".join(f"{r}#{s}" for r, s in conflicts[:5])
    return ConflictingEvents(f"{len(conflicts)} event(s) reuse a stored (run_id, seq) with different "
                             f"content ({shown}); a client must not renumber events", conflicts)


def run_info(run_id: str, n: int, first, last, start: str | None, end: str | None) -> RunInfo:
    start = _decode(start) if start else {}
    end = _decode(end) if end else {}
    return RunInfo(run_id, n, _finite_or_none(first), _finite_or_none(last), _text(start, "model"),
                   _text(start, "device_model"), _text(end, "status"))


def check_own(where: str, objects: list[tuple[str, str]], columns: dict[str, list[str]]) -> None:
    """Refuse a database holding anything but this store's tables (with this store's columns).

    objects: (kind, name) of every table, view, trigger and index; columns: the columns of our tables.
    """
    foreign = sorted(f"{kind} {name}" for kind, name in objects
                     if not ((kind == "table" and name in OWN_TABLES) or (kind == "index" and name in OWN_INDEXES)))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" (+{len(foreign) - 5} more)" if len(foreign) > 5 else "")
        raise BadInput(f"{where} holds {shown}, not the telemetry store's; it was left untouched: choose a new "
                       f"--db (or, on PostgreSQL, a schema of its own)")
    for table, got in columns.items():
        if tuple(got) != OWN_TABLES[table]:
            raise BadInput(f"{where} has a table {table} with columns ({', '.join(got)}), not the telemetry "
                           f"store's ({', '.join(OWN_TABLES[table])}); it was left untouched: choose a new --db")


def check_versions(where: str, applied: set[int]) -> None:
    if applied and max(applied) > SCHEMA_VERSION:
        raise BadInput(f"{where} has telemetry schema version {max(applied)}, newer than this toolchain's "
                       f"{SCHEMA_VERSION}; upgrade the toolchain")


def _sqlite_objects(db: sqlite3.Connection) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    objects = [(kind, name) for kind, name in db.execute("SELECT type, name FROM sqlite_master")
               if not name.startswith("sqlite_")]        # SQLite's own (autoindexes, sqlite_sequence, stats)
    columns = {name: [c for (c,) in db.execute("SELECT name FROM pragma_table_info(?) ORDER BY cid", (name,))]
               for kind, name in objects if kind == "table" and name in OWN_TABLES}
    return objects, columns


class EventStore:
    """Thread-safe event store over one SQLite file (created when missing).

    Raises:
        BadInput: the file cannot be opened as a database, or holds tables that are not the store's.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise BadInput(f"directory {self.path.parent} does not exist; create it or choose another --db")
        self._lock = threading.Lock()
        try:        # created here (exclusively: a store another process creates at once is "existing")
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            created = True
        except FileExistsError:
            created = False
        except OSError as e:
            raise BadInput(f"cannot create {self.path}: {e.strerror}; choose another --db") from None
        if not created:
            if not self.path.is_file():
                raise BadInput(f"{self.path} is not a regular file; choose another --db")
            self._check_existing()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._migrate()
            except BaseException:
                self._db.close()
                raise
        except BaseException as e:
            if created:       # nothing of a refused start is left behind
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            if isinstance(e, sqlite3.DatabaseError):
                raise BadInput(f"{self.path} is not a usable SQLite database ({e}); choose another --db") from None
            raise

    def _check_existing(self) -> None:
        """Read-only look at an existing file before anything (a pragma included) is written to it."""
        try:
            ro = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True, timeout=10.0)
        except sqlite3.Error as e:
            raise BadInput(f"{self.path} cannot be opened ({e}); choose another --db") from None
        try:
            objects, columns = _sqlite_objects(ro)
            if any(kind == "table" and name == VERSION_TABLE for kind, name in objects):
                check_versions(str(self.path), {v for (v,) in ro.execute(f"SELECT version FROM {VERSION_TABLE}")})
        except sqlite3.DatabaseError as e:
            raise BadInput(f"{self.path} is not a usable SQLite database ({e}); choose another --db") from None
        finally:
            ro.close()
        check_own(str(self.path), objects, columns)

    def _migrate(self) -> None:
        """Apply the migrations not yet applied, once (BEGIN IMMEDIATE: one process at a time)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            objects, columns = _sqlite_objects(db)    # again, under the write lock
            check_own(str(self.path), objects, columns)
            db.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER PRIMARY KEY, "
                       f"applied_at REAL NOT NULL)")
            applied = {v for (v,) in db.execute(f"SELECT version FROM {VERSION_TABLE}")}
            check_versions(str(self.path), applied)
            for version, statements in _SQLITE_MIGRATIONS:
                if version not in applied:     # a store of before the version table has events already: IF NOT EXISTS
                    for statement in statements:
                        db.execute(statement)
                    db.execute(f"INSERT INTO {VERSION_TABLE} VALUES (?, ?)", (version, time.time()))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def ping(self) -> None:
        """One trivial query (the server's /v1/health)."""
        with self._lock:
            self._db.execute("SELECT 1").fetchone()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, events: list[dict]) -> AddResult:
        """Store a validated batch atomically.

        Raises:
            ConflictingEvents: a (run_id, seq) is repeated with different content; nothing stored.
        """
        return self.add_batches([events])[0]

    def add_batches(self, batches: list[list[dict]]) -> list[AddResult]:
        """Store several validated batches in one transaction (all or nothing); one result per batch
        (an event repeated in a later batch counts as a duplicate there).

        Raises:
            ConflictingEvents: a (run_id, seq) is repeated with different content; nothing stored.
        """
        plan, conflicts = plan_batches(batches)
        now = time.time()
        results: list[AddResult] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                new = []
                for n_events, fresh in plan:
                    stored = 0
                    for key, event, body in fresh:
                        row = self._db.execute("SELECT body FROM events WHERE run_id = ? AND seq = ?",
                                               key).fetchone()
                        if row is None:
                            new.append((*key, event["type"], float(event["timestamp"]), body, now))
                            stored += 1
                        elif not same_body(row[0], body):
                            conflicts.append(key)
                    results.append(AddResult(n_events, stored, n_events - stored))
                if conflicts:
                    self._db.execute("ROLLBACK")
                    raise conflict_error(conflicts)
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", new)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return results

    RUNS_QUERY = """
        SELECT e.run_id, COUNT(*), MIN(e.timestamp), MAX(e.timestamp),
               (SELECT body FROM events s WHERE s.run_id = e.run_id AND s.type = 'run_start' ORDER BY seq LIMIT 1),
               (SELECT body FROM events s WHERE s.run_id = e.run_id AND s.type = 'run_end' ORDER BY seq DESC LIMIT 1)
        FROM events e GROUP BY e.run_id ORDER BY MIN(e.timestamp), e.run_id"""

    def runs(self) -> list[RunInfo]:
        """Every run with its event count, oldest first."""
        with self._lock:
            rows = self._db.execute(self.RUNS_QUERY).fetchall()
        return [run_info(*row) for row in rows]

    def events(self, run_id: str, *, after_seq: int = -1, limit: int | None = None) -> list[dict]:
        """A run's events in seq order (those with seq > after_seq, at most `limit`)."""
        query = "SELECT body FROM events WHERE run_id = ? AND seq > ? ORDER BY seq"
        after_seq = max(-1, min(int(after_seq), _MAX_SQLITE_INT))   # SQLite integers are int64
        args: tuple = (run_id, after_seq)
        if limit is not None:
            query += " LIMIT ?"
            args += (max(0, min(int(limit), _MAX_SQLITE_INT)),)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [_decode(body) for (body,) in rows]

    def count(self, run_id: str | None = None) -> int:
        with self._lock:
            if run_id is None:
                return self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM events WHERE run_id = ?", (run_id,)).fetchone()[0]

    def describe(self) -> str:
        """How the banner names this store."""
        return str(self.path)
