"""The telemetry server under hostile bodies and queries: every malformed request is a 4xx (never a
5xx), nothing of a refused batch is stored, nothing non-finite is ever stored, and a store poisoned by an
older version (Infinity in a body or a timestamp) still answers GET /v1/runs and GET .../events."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from telemetry_samples import run_start_event, step_event

from toolchain.telemetry.server import create_app
from toolchain.telemetry.store import EventStore

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def store(tmp_path):
    with EventStore(tmp_path / "t.sqlite3") as s:
        yield s


@pytest.fixture
def client(store):
    return TestClient(create_app(store, TOKEN, max_body_bytes=1 << 20), raise_server_exceptions=False)


def _post(client, body: str | bytes):
    return client.post("/v1/events", content=body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass"),
                       headers={**AUTH, "Content-Type": "application/json"})


GOOD = json.dumps(step_event(0))


NASTY = {
    "timestamp-1e400": GOOD.replace("1767225600.0", "1e400"),
    "timestamp-neg-1e400": GOOD.replace("1767225600.0", "-1e400"),
    "loss-Infinity": GOOD.replace("2.5", "Infinity"),
    "loss-NaN": GOOD.replace("2.5", "NaN"),
    "loss--Infinity": GOOD.replace("2.5", "-Infinity"),
    "seq-1e23": GOOD.replace('"seq": 0', '"seq": 99999999999999999999999'),
    "seq-2^63": GOOD.replace('"seq": 0', f'"seq": {2**63}'),
    "seq-5000-digits": GOOD.replace('"seq": 0', '"seq": ' + "9" * 5000),
    "timestamp-int-400-digits": GOOD.replace("1767225600.0", "1" + "0" * 400),
    "lone-surrogate-value": GOOD.replace('"r1"', '"\\ud800"'),
    "lone-surrogate-key": GOOD[:-1] + ', "\\udfff": 1}',
    "lone-surrogate-extra": GOOD[:-1] + ', "x": "a\\udc00b"}',
    "raw-surrogate-bytes": GOOD.encode().replace(b'"r1"', b'"\xed\xa0\x80"'),
    "latin1-bytes": GOOD.encode().replace(b'"r1"', b'"r\xe91"'),
    "nested-100k": "[" * 100_000 + "]" * 100_000,
    "nested-70-objects": '{"a":' * 70 + "1" + "}" * 70,
    "nested-in-event": GOOD[:-1] + ', "x": ' + "[" * 200 + "]" * 200 + "}",
    "empty": "",
    "whitespace": "   ",
    "null": "null",
    "number": "1e400",
    "string": '"event"',
    "empty-array": "[]",
    "array-of-null": "[null]",
    "array-of-arrays": "[[1], [2]]",
    "bom": "\ufeff" + GOOD,
    "nul-byte": GOOD.replace('"r1"', '"r\\u00001"'),
    "truncated": GOOD[:-3],
    "trailing-garbage": GOOD + "xyz",
    "two-objects": GOOD + GOOD,
    "huge-string": GOOD[:-1] + ', "x": "' + "a" * 500_000 + '"}',
    "run-id-1000-chars": GOOD.replace('"r1"', '"' + "r" * 1000 + '"'),
    "bool-seq": GOOD.replace('"seq": 0', '"seq": true'),
    "negative-seq": GOOD.replace('"seq": 0', '"seq": -1'),
    "float-seq": GOOD.replace('"seq": 0', '"seq": 0.5'),
    "batch-one-bad": json.dumps([step_event(1), step_event(2)])[:-1] + ', ' + GOOD.replace("2.5", "NaN") + "]",
    "conflict-in-batch": json.dumps([step_event(3), step_event(3, loss=1.0)]),
}


@pytest.mark.parametrize("name", list(NASTY))
def test_a_nasty_body_is_4xx_and_stores_nothing(client, store, name):
    r = _post(client, NASTY[name])
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert "error" in r.json()
    assert store.count() == 0


NASTY_QUERIES = ["/v1/runs/r1/events?after_seq=99999999999999999999999", "/v1/runs/r1/events?after_seq=1e400",
                 "/v1/runs/r1/events?after_seq=-5", "/v1/runs/r1/events?after_seq=nan", "/v1/runs/r1/events?limit=0",
                 "/v1/runs/r1/events?limit=99999999999999999999999", "/v1/runs/%ED%A0%80/events",
                 "/v1/runs/%FF%FE/events", "/v1/runs/" + "r" * 5000 + "/events", "/v1/runs/..%2F..%2Fetc/events",
                 f"/v1/runs/r1/events?after_seq={2**63 - 1}"]


@pytest.mark.parametrize("url", NASTY_QUERIES)
def test_a_nasty_query_is_never_5xx(client, store, url):
    store.add([step_event(0), step_event(1)])
    r = client.get(url, headers=AUTH)
    assert r.status_code < 500, (r.status_code, r.text[:300])


def test_a_store_poisoned_by_an_older_version_still_lists_runs_and_events(client, store):
    store.add([run_start_event("r1"), step_event(1)])
    poisoned = json.dumps(step_event(2, loss=float("inf"), timestamp=float("inf")))   # Infinity in the body
    store._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", ("r1", 2, "step", float("inf"), poisoned, 0.0))
    runs = client.get("/v1/runs", headers=AUTH)
    assert runs.status_code == 200, runs.text
    (run,) = runs.json()["runs"]
    assert run["events"] == 3 and run["last_timestamp"] is None
    events = client.get("/v1/runs/r1/events", headers=AUTH)
    assert events.status_code == 200 and events.json()["events"][2]["loss"] is None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                      max_size=4), max_leaves=20)
FIELDS = st.sampled_from(["seq", "timestamp", "loss", "run_id", "step", "step_time_s", "tokens_per_s", "type",
                          "schema_version", "elapsed_s", "extra"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.dictionaries(FIELDS, JSON, min_size=1, max_size=3), as_batch=st.booleans())
def test_fuzzed_events_are_stored_finite_or_refused_with_a_4xx(client, store, mutations, as_batch):
    event = {**step_event(0, run_id="fuzz"), **mutations}
    body = json.dumps([event, step_event(1, run_id="fuzz")] if as_batch else event, allow_nan=True,
                      ensure_ascii=False).encode("utf-8", "surrogatepass")
    before = store.count()
    r = _post(client, body)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:
        assert store.count() == before       # all or nothing
    for (text,) in store._db.execute("SELECT body FROM events").fetchall():   # nothing non-finite stored
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} stored"))
    for (ts,) in store._db.execute("SELECT timestamp FROM events").fetchall():
        assert math.isfinite(ts)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=300))
def test_random_bytes_are_4xx(client, store, body):
    r = _post(client, body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert store.count() == 0
