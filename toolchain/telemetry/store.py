"""SQLite store of telemetry events: each (run_id, seq) once, batches all-or-nothing.

One table, `events(run_id, seq, type, timestamp, body, received_at)`, keyed by (run_id, seq).
A retried batch stores nothing new (its events are counted as duplicates). An event whose key is
already stored with a *different* body is a conflict (a client reused a sequence number): the
whole batch is refused, so the stored run never mixes two histories. WAL mode lets a report read
while the server writes; `synchronous=NORMAL` survives a crash of the server (not a power cut).

Reads are sanitized: a store written by an older version may hold `Infinity`/`NaN` (in a body or a
timestamp); they are read back as null, so listing runs and events keeps working (a report then
refuses such an event by name, since it is no longer a valid event).
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import NamedTuple

from toolchain.errors import BadInput
from toolchain.telemetry.events import canonical

__all__ = ["EventStore", "AddResult", "RunInfo", "ConflictingEvents"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    timestamp REAL NOT NULL,
    body TEXT NOT NULL,
    received_at REAL NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_by_type ON events (run_id, type);
"""


class ConflictingEvents(BadInput):
    """Events reuse a stored (run_id, seq) with different content. `keys` lists them."""

    def __init__(self, message: str, keys: list[tuple[str, int]]):
        super().__init__(message)
        self.keys = keys


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


class EventStore:
    """Thread-safe event store over one SQLite file (created when missing).

    Raises:
        BadInput: the file cannot be opened as a database.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise BadInput(f"directory {self.path.parent} does not exist; create it or choose another --db")
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise BadInput(f"{self.path} is not a usable SQLite database ({e}); choose another --db") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

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
        seen: dict[tuple[str, int], str] = {}
        conflicts: list[tuple[str, int]] = []
        plan: list[tuple[int, list[tuple]]] = []   # per batch: (events, rows new to this call)
        for events in batches:
            fresh = []
            for event in events:
                key, body = (event["run_id"], event["seq"]), canonical(event)
                if key in seen:
                    if seen[key] != body:
                        conflicts.append(key)
                    continue
                seen[key] = body
                fresh.append((key, event, body))
            plan.append((len(events), fresh))
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
                        elif row[0] != body:
                            conflicts.append(key)
                    results.append(AddResult(n_events, stored, n_events - stored))
                if conflicts:
                    self._db.execute("ROLLBACK")
                    shown = ", ".join(f"{r}#{s}" for r, s in conflicts[:5])
                    raise ConflictingEvents(f"{len(conflicts)} event(s) reuse a stored (run_id, seq) with different "
                                            f"content ({shown}); a client must not renumber events", conflicts)
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", new)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return results

    def runs(self) -> list[RunInfo]:
        """Every run with its event count, oldest first."""
        query = """
            SELECT e.run_id, COUNT(*), MIN(e.timestamp), MAX(e.timestamp),
                   (SELECT body FROM events s WHERE s.run_id = e.run_id AND s.type = 'run_start' ORDER BY seq LIMIT 1),
                   (SELECT body FROM events s WHERE s.run_id = e.run_id AND s.type = 'run_end' ORDER BY seq DESC LIMIT 1)
            FROM events e GROUP BY e.run_id ORDER BY MIN(e.timestamp), e.run_id"""
        with self._lock:
            rows = self._db.execute(query).fetchall()
        out = []
        for run_id, n, first, last, start, end in rows:
            start = _decode(start) if start else {}
            end = _decode(end) if end else {}
            out.append(RunInfo(run_id, n, _finite_or_none(first), _finite_or_none(last), _text(start, "model"),
                               _text(start, "device_model"), _text(end, "status")))
        return out

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
