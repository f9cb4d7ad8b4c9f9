"""`toolchain telemetry serve` killed with SIGKILL in the middle of uploads: every event it acknowledged
is in the store after the kill; clients then retry what was not acknowledged against a restarted server,
and the store ends with every event exactly once (figures printed: sent, acknowledged, stored,
duplicates, lost)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from telemetry_samples import step_event

from toolchain.telemetry.store import EventStore

TOKEN = "kill-token"
CLIENTS, EVENTS, BATCH = 4, 400, 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, db) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", "telemetry", "serve", "--port", str(port), "--db",
                             str(db)], env={**os.environ, "TOOLCHAIN_TELEMETRY_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v1/health")
            if c.getresponse().status == 200:
                c.close()
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


def _post(port: int, events: list[dict]) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/v1/events", body=json.dumps(events),
                  headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def test_kill_9_loses_nothing_acknowledged_and_retries_store_each_event_once(tmp_path, capsys):
    db, port = tmp_path / "kill.sqlite3", _free_port()
    proc = _start(port, db)
    acked: set[tuple[str, int]] = set()
    lock = threading.Lock()
    sent = [0]

    def upload(i: int) -> None:
        for start in range(0, EVENTS, BATCH):
            batch = [step_event(s, run_id=f"client-{i}") for s in range(start, start + BATCH)]
            try:
                status, _ = _post(port, batch)
            except OSError:
                return                                    # the server is gone
            with lock:
                sent[0] += len(batch)
                if status == 200:
                    acked.update((e["run_id"], e["seq"]) for e in batch)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    while len(acked) < CLIENTS * EVENTS // 3 and any(t.is_alive() for t in threads):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    for t in threads:
        t.join(timeout=60)
    with EventStore(db) as store:
        stored = {(e["run_id"], e["seq"]) for i in range(CLIENTS) for e in store.events(f"client-{i}")}
    lost = acked - stored
    assert not lost, f"{len(lost)} acknowledged events lost"

    proc = _start(port, db)                              # restart; clients retry everything not acknowledged
    try:
        duplicates = stored_new = 0
        for i in range(CLIENTS):
            for start in range(0, EVENTS, BATCH):
                batch = [step_event(s, run_id=f"client-{i}") for s in range(start, start + BATCH)]
                if all((e["run_id"], e["seq"]) in acked for e in batch) and start % (5 * BATCH):
                    continue                             # acknowledged: most are not resent, every 5th batch is
                status, body = _post(port, batch)
                assert status == 200, body
                duplicates += body["duplicates"]
                stored_new += body["stored"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with EventStore(db) as store:
        assert store.count() == CLIENTS * EVENTS
        for i in range(CLIENTS):
            assert [e["seq"] for e in store.events(f"client-{i}")] == list(range(EVENTS))
    with capsys.disabled():
        print(f"\n  kill -9: {sent[0]} events sent before the kill, {len(acked)} acknowledged, {len(stored)} stored "
              f"at the kill ({len(stored) - len(acked)} stored but not acknowledged), {len(lost)} lost; after the "
              f"restart {stored_new} stored by retries, {duplicates} duplicates refused, final "
              f"{CLIENTS * EVENTS} = {CLIENTS} x {EVENTS}, each once")
