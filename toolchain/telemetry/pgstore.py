"""PostgreSQL event store (psycopg 3): the SQLite store's schema and semantics, shared by many server processes.

The same table `events(run_id, seq, type, timestamp, body, received_at)` keyed by (run_id, seq) and the same
answers as `store.EventStore`: a retried batch stores nothing new, a reused key with other content refuses the
whole batch. Writers in several processes do not serialize on one lock: a batch is one transaction of
`INSERT ... ON CONFLICT (run_id, seq) DO NOTHING RETURNING` (rows in key order, so two transactions never wait
on each other in a cycle) followed by a comparison of the bodies it did not insert; a concurrent insert of the
same key waits for the other transaction and then counts as a duplicate (or a conflict). READ COMMITTED.

The store lives in the connection's `current_schema()` (`public` unless the URL sets a search_path, e.g.
`?options=-csearch_path%3Dtelemetry`). Migrations are versioned (`telemetry_schema_version`) and applied once,
inside a transaction holding an advisory lock on that schema, so that servers started together migrate one
after the other; a schema holding any object that is not the store's (a table, view, sequence, foreign table,
function, type, operator, ...) is refused first, before anything is written. The database's encoding must be
UTF8 (or SQL_ASCII, which keeps the client's bytes): every connection sends UTF-8 (client_encoding), and a
LATIN1 database, which cannot hold every character a device name may have, is refused at start. A request
waits at most `POOL_WAIT_S` for a pooled connection. Connections: a small pool per process (`POOL_SIZE`); one the server lost (database
restarted) is dropped and the request answered 503, the next opens a new one.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager

from toolchain.errors import BadInput
from toolchain.telemetry.store import (
    OWN_TABLES,
    SCHEMA_VERSION,
    VERSION_TABLE,
    AddResult,
    RunInfo,
    StoreUnavailable,
    _decode,
    check_own,
    check_versions,
    conflict_error,
    plan_batches,
    run_info,
    same_body,
)

__all__ = ["PostgresEventStore", "POOL_SIZE", "redact"]

POOL_SIZE = 4                # connections per process; the server's handlers run in a thread pool
_CONNECT_TIMEOUT_S = 5
POOL_WAIT_S = 5.0            # a request waits at most this long for a pooled connection (all stuck: 503)
_ENCODINGS = ("UTF8", "SQL_ASCII")   # text kept as UTF-8 bytes (SQL_ASCII stores the client's bytes as they come)
_LOCK_CLASS = 0x746C6D72     # advisory lock (class, hashtext(schema)): "tlmr"
_RETRIES = 5                 # deadlock / serialization failure: retry the whole batch

# (version, statements): append only, never edit an applied one; the versions of store._SQLITE_MIGRATIONS.
_MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, ("""CREATE TABLE events (
                run_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                type TEXT NOT NULL,
                timestamp DOUBLE PRECISION NOT NULL,
                body TEXT NOT NULL,
                received_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (run_id, seq)
            )""",
         "CREATE INDEX events_by_type ON events (run_id, type)")),
)
assert _MIGRATIONS[-1][0] == SCHEMA_VERSION

_RUNS_QUERY = """
    SELECT e.run_id, COUNT(*), MIN(e.timestamp), MAX(e.timestamp),
           (SELECT body FROM events s WHERE s.run_id = e.run_id AND s.type = 'run_start' ORDER BY seq LIMIT 1),
           (SELECT body FROM events s WHERE s.run_id = e.run_id AND s.type = 'run_end' ORDER BY seq DESC LIMIT 1)
    FROM events e GROUP BY e.run_id ORDER BY MIN(e.timestamp), e.run_id COLLATE "C"
"""
# Every object of the store's schema, of any kind (relations, functions, types, operators, collations, text
# search configurations, conversions): a schema holding anything not the store's is refused. pg_catalog's
# operators are named explicitly (OPERATOR(pg_catalog.=)), so that operators the schema itself defines cannot
# make the check's own query ambiguous ("operator is not unique").
_OBJECTS_QUERY = """
    WITH s AS (SELECT oid FROM pg_catalog.pg_namespace
               WHERE nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema())
    SELECT CASE WHEN c.relkind IN ('i', 'I') THEN 'index' WHEN c.relkind IN ('v', 'm') THEN 'view'
                WHEN c.relkind OPERATOR(pg_catalog.=) 'S' THEN 'sequence'
                WHEN c.relkind OPERATOR(pg_catalog.=) 'f' THEN 'foreign table'
                WHEN c.relkind OPERATOR(pg_catalog.=) 'c' THEN 'type' ELSE 'table' END, c.relname::text
    FROM pg_catalog.pg_class c, s WHERE c.relnamespace OPERATOR(pg_catalog.=) s.oid
    UNION ALL SELECT 'function', p.proname::text FROM pg_catalog.pg_proc p, s
        WHERE p.pronamespace OPERATOR(pg_catalog.=) s.oid
    UNION ALL SELECT 'type', t.typname::text FROM pg_catalog.pg_type t, s
        WHERE t.typnamespace OPERATOR(pg_catalog.=) s.oid AND t.typrelid OPERATOR(pg_catalog.=) 0
          AND t.typcategory OPERATOR(pg_catalog.<>) 'A'
    UNION ALL SELECT 'operator', o.oprname::text FROM pg_catalog.pg_operator o, s
        WHERE o.oprnamespace OPERATOR(pg_catalog.=) s.oid
    UNION ALL SELECT 'collation', l.collname::text FROM pg_catalog.pg_collation l, s
        WHERE l.collnamespace OPERATOR(pg_catalog.=) s.oid
    UNION ALL SELECT 'conversion', v.conname::text FROM pg_catalog.pg_conversion v, s
        WHERE v.connamespace OPERATOR(pg_catalog.=) s.oid
    UNION ALL SELECT 'text search configuration', x.cfgname::text FROM pg_catalog.pg_ts_config x, s
        WHERE x.cfgnamespace OPERATOR(pg_catalog.=) s.oid
"""
_COLUMNS_QUERY = """
    SELECT c.relname::text, a.attname::text FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
    WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema() AND c.relkind OPERATOR(pg_catalog.=) 'r'
      AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
      AND c.relname::text OPERATOR(pg_catalog.=) ANY(%s::text[])
    ORDER BY c.relname, a.attnum
"""
_INSERT = """
    INSERT INTO events (run_id, seq, type, timestamp, body, received_at)
    SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::float8[], %s::text[], %s::float8[])
    ON CONFLICT (run_id, seq) DO NOTHING
    RETURNING run_id, seq
"""
_STORED_BODIES = """
    SELECT e.run_id, e.seq, e.body FROM events e
    JOIN unnest(%s::text[], %s::bigint[]) AS k(run_id, seq) ON e.run_id = k.run_id AND e.seq = k.seq
"""


def redact(url: str) -> str:
    """The URL without its password (for messages and the banner)."""
    url = re.sub(r"(://[^/@:?]*):[^/@?]*@", r"\1:***@", url)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", url)


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise BadInput("a postgresql:// --db needs psycopg 3 (a dependency of the toolchain: reinstall it, e.g. "
                       "make .venv/.installed)") from None
    return psycopg


class PostgresEventStore:
    """Thread-safe event store in a PostgreSQL database (psycopg 3), migrated on open.

    Raises:
        BadInput: the database cannot be reached, or its schema holds tables that are not the store's.
    """

    def __init__(self, url: str):
        self.url = url
        self._psycopg = psycopg = _psycopg()
        self._idle: list = []
        self._slots = threading.BoundedSemaphore(POOL_SIZE)
        self._lock = threading.Lock()
        self._closed = False
        conn = self._connect(refuse=BadInput)
        try:
            self.schema = self._migrate(conn)
        except psycopg.Error as e:
            conn.close()
            raise BadInput(f"cannot set up the telemetry store in {redact(url)}: {_first_line(e)}") from None
        except BaseException:
            conn.close()
            raise
        self._idle.append(conn)

    def _connect(self, refuse=StoreUnavailable):
        psycopg = self._psycopg
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.url)
        except psycopg.ProgrammingError as e:
            raise BadInput(f"{redact(self.url)} is not a valid PostgreSQL URL ({_first_line(e)})") from None
        extra = {"application_name": "toolchain-telemetry"}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = _CONNECT_TIMEOUT_S
        if "client_encoding" not in params:
            extra["client_encoding"] = "UTF8"     # whatever the database's default: our text is UTF-8
        try:
            return psycopg.connect(self.url, autocommit=True, **extra)
        except psycopg.Error as e:
            raise refuse(f"cannot connect to PostgreSQL at {redact(self.url)}: {_first_line(e)}") from None

    def _migrate(self, conn) -> str:
        with conn.transaction():
            schema = conn.execute("SELECT pg_catalog.current_schema()").fetchone()[0]
            if schema is None:
                raise BadInput(f"{redact(self.url)}: no schema of the search_path exists; create it "
                               f"(CREATE SCHEMA ...) or set options=-csearch_path%3D<schema>")
            encoding = conn.execute("SHOW server_encoding").fetchone()[0]
            if encoding not in _ENCODINGS:
                raise BadInput(f"database of {redact(self.url)} has encoding {encoding}; the telemetry store keeps "
                               f"UTF-8 text (a device name may hold any character): use a database created with "
                               f"ENCODING 'UTF8' (createdb -E UTF8 -T template0 NAME)")
            conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s, pg_catalog.hashtext(pg_catalog.current_schema()))",
                         (_LOCK_CLASS,))
            where = f"schema {schema} of {redact(self.url)}"
            objects = [(kind, name) for kind, name in conn.execute(_OBJECTS_QUERY).fetchall()
                       if not (kind == "index" and name.removesuffix("_pkey") in OWN_TABLES)]
            columns: dict[str, list[str]] = {}
            for table, column in conn.execute(_COLUMNS_QUERY, (list(OWN_TABLES),)).fetchall():
                columns.setdefault(table, []).append(column)
            check_own(where, objects, columns)
            if "events" in columns and VERSION_TABLE not in columns:
                raise BadInput(f"{where} has an events table but no {VERSION_TABLE}; it was not made by this "
                               f"store: choose another schema")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER PRIMARY KEY, "
                         f"applied_at DOUBLE PRECISION NOT NULL)")
            applied = {v for (v,) in conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchall()}
            check_versions(where, applied)
            for version, statements in _MIGRATIONS:
                if version not in applied:
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute(f"INSERT INTO {VERSION_TABLE} VALUES (%s, %s)", (version, time.time()))
        return schema

    @contextmanager
    def _conn(self):
        """A pooled connection; one found broken is closed and dropped. Errors of the database are
        StoreUnavailable, but for a deadlock or a serialization failure (the caller retries those)."""
        psycopg = self._psycopg
        if not self._slots.acquire(timeout=POOL_WAIT_S):
            raise StoreUnavailable(f"PostgreSQL did not answer: every pooled connection has been busy for "
                                   f"{POOL_WAIT_S:g} s; retry later")
        try:
            with self._lock:
                if self._closed:
                    raise StoreUnavailable("the telemetry store is closed")
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = self._connect()
            try:
                yield conn
            except BaseException as e:
                retryable = isinstance(e, _retryable(psycopg))
                lost = isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)) and not retryable
                if lost or conn.broken or conn.closed:
                    conn.close()
                else:
                    self._release(conn)       # e.g. a conflict: the transaction was rolled back
                if isinstance(e, psycopg.Error) and not retryable:
                    raise StoreUnavailable(f"PostgreSQL failed ({_first_line(e)}); retry later") from None
                raise
            else:
                self._release(conn)
        finally:
            self._slots.release()

    def _release(self, conn) -> None:
        with self._lock:
            if self._closed:
                conn.close()
            else:
                self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> PostgresEventStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, events: list[dict]) -> AddResult:
        """Store a validated batch atomically (see `store.EventStore.add`)."""
        return self.add_batches([events])[0]

    def add_batches(self, batches: list[list[dict]]) -> list[AddResult]:
        """Store several validated batches in one transaction (all or nothing); one result per batch.

        Raises:
            ConflictingEvents: a (run_id, seq) is repeated with different content; nothing stored.
            StoreUnavailable: the database failed; nothing stored.
        """
        plan, conflicts = plan_batches(batches)
        if conflicts:
            raise conflict_error(conflicts)
        rows = sorted((row for _, fresh in plan for row in fresh), key=lambda row: row[0])
        now = time.time()
        columns = ([k[0] for k, _, _ in rows], [k[1] for k, _, _ in rows], [e["type"] for _, e, _ in rows],
                   [float(e["timestamp"]) for _, e, _ in rows], [b for _, _, b in rows], [now] * len(rows))
        for attempt in range(_RETRIES):
            try:
                with self._conn() as conn, conn.transaction():
                    inserted = {(r, s) for r, s in conn.execute(_INSERT, columns).fetchall()}
                    others = [(k, b) for k, _, b in rows if k not in inserted]
                    if others:
                        stored = {(r, s): body for r, s, body in conn.execute(
                            _STORED_BODIES, ([k[0] for k, _ in others], [k[1] for k, _ in others])).fetchall()}
                        conflicts = [k for k, b in others if k not in stored or not same_body(stored[k], b)]
                        if conflicts:
                            raise conflict_error(conflicts)    # rolls the transaction back
                break
            except _retryable(self._psycopg) as e:
                if attempt + 1 == _RETRIES:
                    raise StoreUnavailable(f"PostgreSQL failed ({_first_line(e)}); retry later") from None
                time.sleep(0.01 * 2**attempt)
        return [AddResult(n, sum(k in inserted for k, _, _ in fresh), n - sum(k in inserted for k, _, _ in fresh))
                for n, fresh in plan]

    def runs(self) -> list[RunInfo]:
        """Every run with its event count, oldest first."""
        with self._conn() as conn:
            rows = conn.execute(_RUNS_QUERY).fetchall()
        return [run_info(*row) for row in rows]

    def events(self, run_id: str, *, after_seq: int = -1, limit: int | None = None) -> list[dict]:
        """A run's events in seq order (those with seq > after_seq, at most `limit`)."""
        after_seq = max(-1, min(int(after_seq), 2**63 - 1))
        limit = None if limit is None else max(0, min(int(limit), 2**63 - 1))
        with self._conn() as conn:
            rows = conn.execute("SELECT body FROM events WHERE run_id = %s AND seq > %s ORDER BY seq LIMIT %s",
                                (run_id, after_seq, limit)).fetchall()
        return [_decode(body) for (body,) in rows]

    def count(self, run_id: str | None = None) -> int:
        with self._conn() as conn:
            if run_id is None:
                return conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            return conn.execute("SELECT COUNT(*) FROM events WHERE run_id = %s", (run_id,)).fetchone()[0]

    def ping(self) -> None:
        """One trivial query (the server's /v1/health)."""
        with self._conn() as conn:
            conn.execute("SELECT 1").fetchone()

    def describe(self) -> str:
        """How the banner names this store."""
        return f"{redact(self.url)}, schema {self.schema}"


def _retryable(psycopg) -> tuple[type, ...]:
    return psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
