"""Telemetry events: parse and validate what phones send, and write events the way phones do.

An event is a flat JSON object (`shared_schemas/telemetry_event.schema.json`): common fields
`schema_version, type, run_id, seq, timestamp` plus the fields of its `type`. A batch is one event
or a JSON array of events. A batch is accepted whole or refused whole: every event is validated
before anything is stored, and the refusal names each bad event by its index.

Bodies and files go through `toolchain.validate` first (strict JSON: no NaN/Infinity, no 1e400, no
integer outside int64, no lone surrogate, nesting limit), so nothing non-finite or unstorable reaches
the store.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolchain.errors import BadInput, SchemaError
from toolchain.schemas import validation_errors
from toolchain.validate import InvalidJson, check_json, decode_utf8, loads

__all__ = ["SCHEMA_VERSION", "EVENT_TYPES", "PROBES", "MAX_ERRORS_REPORTED", "InvalidBatch", "parse_batch",
           "check_events", "canonical", "read_jsonl", "JSONL_OR_ARRAY", "TelemetryRecorder", "EventLog", "new_run_id"]

SCHEMA_VERSION = 1
EVENT_TYPES = ("run_start", "run_end", "step", "memory", "thermal", "battery", "error", "eval", "gate", "memory_adapted")
PROBES = ("android_proc_status", "android_debug_meminfo", "android_dumpsys", "android_activity_manager",
          "ios_phys_footprint", "ios_os_proc_available", "linux_proc_status")
MAX_ERRORS_REPORTED = 20   # a refusal lists at most this many bad events (a 10,000-event batch stays readable)
_MAX_MESSAGE = 300


class InvalidBatch(SchemaError):
    """A batch with at least one invalid event. `errors` maps event index -> its violations."""

    def __init__(self, message: str, errors: dict[int, list[str]]):
        super().__init__(message)
        self.errors = errors


def _short(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE] + "..."


_MEASUREMENTS = ("anon_bytes", "rss_bytes", "pss_bytes", "peak_bytes", "available_bytes")


def _explain(problems: list[str]) -> list[str]:
    """Most useful message first: a field's own error before the root-level consequences (a type's
    fields count as 'unevaluated' once that type's branch fails), the memory anyOf in words."""
    out = []
    for p in problems:
        if p.startswith("<root>: ") and p.endswith("is not valid under any of the given schemas"):
            p = f"<root>: a memory event needs at least one of {', '.join(_MEASUREMENTS)}"
        out.append(_short(p))
    return sorted(out, key=lambda p: p.startswith("<root>: Unevaluated properties"))


def check_events(events: list[Any]) -> None:
    """Validate every event of a batch against the schema.

    Raises:
        InvalidBatch: naming the first bad event and how many are bad; `.errors` has the details.
    """
    errors: dict[int, list[str]] = {}
    for i, event in enumerate(events):
        try:
            check_json(event, "event")        # finite numbers, int64, UTF-8 strings (events built in Python)
            problems = validation_errors("telemetry_event", event)
        except BadInput as e:
            problems = [str(e)]
        if problems:
            errors[i] = _explain(problems)
            if len(errors) >= MAX_ERRORS_REPORTED:
                break
    if errors:
        first = min(errors)
        more = f" ({len(errors)}{'+' if len(errors) >= MAX_ERRORS_REPORTED else ''} invalid events)" \
            if len(errors) > 1 else ""
        raise InvalidBatch(f"event {first} is not a valid telemetry event: {errors[first][0]}{more}", errors)


def parse_batch(body: bytes | str) -> list[dict]:
    """Decode and validate a request body: one event or a non-empty array of events.

    Raises:
        BadInput: the body is not JSON, or neither an object nor an array, or an empty array.
        InvalidBatch: some event violates the schema (nothing of the batch may be stored).
    """
    try:
        doc = loads(body, "body")
    except InvalidJson as e:
        raise BadInput(f"invalid JSON: {e.reason}") from None
    if isinstance(doc, dict):
        events = [doc]
    elif isinstance(doc, list):
        events = doc
    else:
        raise BadInput(f"expected an event object or an array of events, got {type(doc).__name__}")
    if not events:
        raise BadInput("empty batch: send at least one event")
    check_events(events)
    return events


def canonical(event: dict) -> str:
    """The stored form of an event: compact JSON with sorted keys (equal events, equal strings)."""
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


JSONL_OR_ARRAY = "JSONL (one event object per line) or one JSON array of events"


def read_jsonl(path: Path) -> list[dict]:
    """Read a telemetry file and validate every event: JSONL (one event per line; blank lines allowed), or
    one JSON array of events (the form of shared_schemas/examples/telemetry_run_*.json), or one event object
    (also over several lines, as in shared_schemas/examples/telemetry_error_*.json).

    Raises:
        BadInput: the file is missing, or not JSON in either form (the line number is named, and the
            expected formats).
        SchemaError: an event is not valid (its line, or its index in the array, is named).
    """
    from toolchain.inputs import read_input

    path = Path(path)
    data = read_input(path)
    if data.lstrip()[:1] == b"[":
        return _read_array(path, data)
    events, line_of = [], []
    for lineno, raw in enumerate(data.splitlines(), start=1):
        line = decode_utf8(raw, f"{path}:{lineno}")
        if not line.strip():
            continue
        try:
            event = loads(line, f"{path}:{lineno}")
        except InvalidJson as e:
            if not events and data.lstrip()[:1] == b"{":    # one event object over several lines
                try:
                    return _read_array(path, data, single=True)
                except InvalidJson:
                    pass
            raise BadInput(f"{path}:{lineno}: invalid JSON ({e.reason}); expected {JSONL_OR_ARRAY}") from None
        if not isinstance(event, dict):
            raise BadInput(f"{path}:{lineno}: a JSON {type(event).__name__}, not an event object; expected "
                           f"{JSONL_OR_ARRAY}")
        events.append(event)
        line_of.append(lineno)
    if not events:
        raise BadInput(f"{path} has no events")
    _check_all(events, lambda first: f"{path}:{line_of[first]}: ", "lines")
    return events


def _check_all(events: list[dict], where: Callable[[int], str], unit: str) -> None:
    """Schema-check every event; the first invalid one named by `where(index)`, the count of the others by unit."""
    try:
        check_events(events)
    except InvalidBatch as e:
        first = min(e.errors)
        raise SchemaError(f"{where(first)}not a valid telemetry event: {e.errors[first][0]}"
                          f"{f' ({len(e.errors)} invalid {unit})' if len(e.errors) > 1 else ''}") from None


def _read_array(path: Path, data: bytes, *, single: bool = False) -> list[dict]:
    """The whole file as one JSON array of events (or, `single`, as one event object: InvalidJson if not)."""
    try:
        doc = loads(data, str(path))
    except InvalidJson as e:
        if single:
            raise
        raise BadInput(f"{path}: invalid JSON ({e.reason}); a file starting with '[' must be one JSON array of "
                       f"events (else: {JSONL_OR_ARRAY})") from None
    if single:
        if not isinstance(doc, dict):
            raise InvalidJson(str(path), "not an event object")
        doc = [doc]
    if not doc:
        raise BadInput(f"{path} has no events (an empty array)")
    _check_all(doc, lambda first: f"{path}: {'' if single else f'array element {first}: '}", "events")
    return doc


def new_run_id() -> str:
    return uuid.uuid4().hex


class EventLog:
    """The append-only JSONL file of a run's events, one canonical event per line (the offline record; the
    apps' upload queue reads theirs). `path` is appended to and created with its directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(canonical(event) + "\n")


class TelemetryRecorder:
    """Record a run's events the way the apps do: numbered, stamped, validated, handed to its `EventLog`.

    Args:
        path: the event log's JSONL file (appended to; created with its directory).
        run_id: the run's id (default: a new random one).
        start_seq: first sequence number (a resumed run continues its numbering). Default: 0.
        clock: wall-clock source in seconds (tests pass a fake). Default: time.time.
    """

    def __init__(self, path: Path, run_id: str | None = None, *, start_seq: int = 0, clock=time.time):
        self.log = EventLog(path)
        self.run_id = run_id or new_run_id()
        self.seq = start_seq
        self._clock = clock
        self._t0 = time.monotonic()

    @property
    def path(self) -> Path:
        return self.log.path

    @property
    def elapsed_s(self) -> float:
        """Monotonic seconds since the recorder was created (the events' `elapsed_s`)."""
        return time.monotonic() - self._t0

    def emit(self, type: str, **fields: Any) -> dict:
        """Validate and append one event; returns it. Raises InvalidBatch when the fields are wrong."""
        clash = sorted(fields.keys() & {"schema_version", "type", "run_id", "seq"})
        if clash:
            raise BadInput(f"{', '.join(clash)} are set by the recorder, not by the caller")
        event = {"schema_version": SCHEMA_VERSION, "type": type, "run_id": self.run_id, "seq": self.seq,
                 "timestamp": round(self._clock(), 6), "elapsed_s": round(self.elapsed_s, 6), **fields}
        check_events([event])
        self.log.append(event)
        self.seq += 1
        return event
