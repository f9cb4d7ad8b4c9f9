"""Telemetry events: batch parsing (all-or-nothing), strict JSON, JSONL files, and the writer."""

from __future__ import annotations

import json

import pytest

from telemetry_samples import step_event

from toolchain.errors import BadInput, SchemaError
from toolchain.schemas import load_schema
from toolchain.telemetry.events import (EVENT_TYPES, PROBES, InvalidBatch, TelemetryRecorder, canonical, parse_batch,
                                        read_jsonl)


def test_constants_match_the_schema():
    schema = load_schema("telemetry_event")
    assert tuple(schema["properties"]["type"]["enum"]) == EVENT_TYPES
    assert tuple(schema["$defs"]["memory"]["properties"]["probe"]["enum"]) == PROBES


def test_one_event_or_an_array():
    assert parse_batch(json.dumps(step_event(0))) == [step_event(0)]
    assert parse_batch(json.dumps([step_event(0), step_event(1)]).encode()) == [step_event(0), step_event(1)]


@pytest.mark.parametrize("body, message", [
    (b"{", "invalid JSON"),
    (b"\xff\xfe\x00", "invalid JSON"),
    (json.dumps(step_event(0)).replace("2.5", "NaN"), "NaN is not valid JSON"),
    (json.dumps(step_event(0)).replace("2.5", "Infinity"), "Infinity is not valid JSON"),
    (b"[]", "empty batch"),
    (b"42", "expected an event object or an array"),
    (b'"step"', "expected an event object or an array"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
])
def test_bad_bodies_are_refused_with_a_reason(body, message):
    with pytest.raises(BadInput, match=message):
        parse_batch(body)


def test_a_batch_names_every_bad_event_by_index():
    batch = [step_event(0), step_event(1, loss="x"), step_event(2), {"type": "step"}]
    with pytest.raises(InvalidBatch) as info:
        parse_batch(json.dumps(batch))
    assert sorted(info.value.errors) == [1, 3]
    assert "event 1" in str(info.value) and "2 invalid events" in str(info.value)
    assert "loss" in info.value.errors[1][0]   # the field's own error comes first


def test_memory_event_without_a_measurement_says_what_is_missing():
    event = {"schema_version": 1, "type": "memory", "run_id": "r", "seq": 0, "timestamp": 1.0, "probe": "android_dumpsys"}
    with pytest.raises(InvalidBatch, match="needs at least one of anon_bytes"):
        parse_batch(json.dumps(event))


def test_canonical_form_ignores_key_order_and_float_spelling():
    a = json.loads('{"b": 1.50, "a": 2}')
    b = json.loads('{"a": 2, "b": 1.5}')
    assert canonical(a) == canonical(b) == '{"a":2,"b":1.5}'


def test_recorder_numbers_validates_and_appends_to_the_event_log(tmp_path):
    path = tmp_path / "sub" / "events.jsonl"
    clock = iter([100.0, 101.0, 102.0])
    w = TelemetryRecorder(path, "run-a", clock=lambda: next(clock))
    w.emit("thermal", state="nominal")
    w.emit("memory", probe="linux_proc_status", anon_bytes=1 << 20)
    with pytest.raises(InvalidBatch):
        w.emit("memory", probe="linux_proc_status")            # no measurement: refused, not written
    with pytest.raises(BadInput, match="seq"):
        w.emit("thermal", state="fair", seq=7)
    events = read_jsonl(path)
    assert [e["seq"] for e in events] == [0, 1]
    assert [e["timestamp"] for e in events] == [100.0, 101.0]
    resumed = TelemetryRecorder(path, "run-a", start_seq=2)
    resumed.emit("battery", level_pct=50, charging=False)
    assert [e["seq"] for e in read_jsonl(path)] == [0, 1, 2]


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps(step_event(0)) + "\n\n" + json.dumps(step_event(1, tokens_per_s=-1)) + "\n")
    with pytest.raises(SchemaError, match=r"e.jsonl:3: not a valid telemetry event: tokens_per_s"):
        read_jsonl(path)
    path.write_text(json.dumps(step_event(0)) + "\n{oops\n")
    with pytest.raises(BadInput, match=r"e.jsonl:2: invalid JSON"):
        read_jsonl(path)
    path.write_text("\n")
    with pytest.raises(BadInput, match="no events"):
        read_jsonl(path)
    with pytest.raises(BadInput, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_a_json_array_of_events_reads_like_jsonl(tmp_path):
    """The form of shared_schemas/examples/telemetry_run_*.json (one array) is accepted as well as JSONL."""
    from toolchain.schemas import SCHEMA_DIR

    example = SCHEMA_DIR / "examples" / "telemetry_run_android.json"
    events = read_jsonl(example)
    assert events == json.loads(example.read_text()) and len(events) == 12
    path = tmp_path / "a.json"
    path.write_text("  \n" + json.dumps([step_event(0), step_event(1, tokens_per_s=-1)], indent=2))
    with pytest.raises(SchemaError, match=r"a.json: array element 1: not a valid telemetry event: tokens_per_s"):
        read_jsonl(path)
    path.write_text('[{"type": "step",\n')
    with pytest.raises(BadInput, match=r"a.json: invalid JSON .*one JSON array of events"):
        read_jsonl(path)
    path.write_text("[]")
    with pytest.raises(BadInput, match="no events"):
        read_jsonl(path)


def test_one_event_over_several_lines_reads_and_anything_else_names_the_formats(tmp_path):
    from toolchain.schemas import SCHEMA_DIR

    example = SCHEMA_DIR / "examples" / "telemetry_error_runtime_log.json"
    if example.exists():                                    # the app error example: one event, pretty-printed
        assert read_jsonl(example) == [json.loads(example.read_text())]
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(step_event(0), indent=2))
    assert read_jsonl(path) == [step_event(0)]
    path.write_text(json.dumps(step_event(0, tokens_per_s=-1), indent=2))
    with pytest.raises(SchemaError, match=r"pretty.json: not a valid telemetry event: tokens_per_s"):
        read_jsonl(path)
    path.write_text(json.dumps(step_event(0), indent=2) + json.dumps(step_event(1), indent=2))   # two: neither form
    with pytest.raises(BadInput, match=r"pretty.json:1: invalid JSON .*expected JSONL \(one event object per line\) "
                                       r"or one JSON array of events"):
        read_jsonl(path)
    path.write_text("3\n")
    with pytest.raises(BadInput, match=r"pretty.json:1: a JSON int, not an event object"):
        read_jsonl(path)
