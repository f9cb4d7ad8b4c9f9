"""SQLite event store: each (run_id, seq) once, conflicting reuse refused, batches all-or-nothing."""

from __future__ import annotations

import threading

import pytest
from telemetry_samples import run_start_event, step_event

from toolchain.errors import BadInput
from toolchain.telemetry.store import ConflictingEvents, EventStore


@pytest.fixture
def store(tmp_path):
    with EventStore(tmp_path / "t.sqlite3") as s:
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


def test_data_survives_reopening(tmp_path):
    with EventStore(tmp_path / "t.sqlite3") as s:
        s.add([step_event(0)])
    with EventStore(tmp_path / "t.sqlite3") as s:
        assert s.count("r1") == 1


def test_not_a_database_or_no_directory(tmp_path):
    bad = tmp_path / "x.sqlite3"
    bad.write_text("this is not sqlite " * 100)
    with pytest.raises(BadInput, match="not a usable SQLite database"):
        EventStore(bad)
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
