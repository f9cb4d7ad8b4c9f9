"""A fleet's load on one store: 2 `toolchain telemetry serve` processes x 8 writers each, on one SQLite file or one
PostgreSQL database, one server killed with SIGKILL midway and restarted on its port.

Each writer owns a run and posts it in batches of BATCH events to its own server; when a request fails (the server
is gone, or answers 503) it retries the same batch on the same server until the batch is acknowledged (so the
writers of the killed server wait for its restart, while the other server's go on). Checked: at the kill, every event acknowledged so far is stored (0 acknowledged events lost); at
the end every event is stored exactly once (0 duplicated: the answers' `stored` counts add up to the events, each
run's seqs are 0..n-1 once), and batches retried after a lost answer come back as duplicates, not as new rows.

`make test` runs it at 2,000 events per backend (~20 s for both); the full size, 10,000 events (marked slow, in
`make test-all`; the figures in docs/telemetry.md):
    .venv/bin/pytest tests/telemetry/test_telemetry_fleet_load.py -m slow -q -s
"""

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

import pytest
from telemetry_samples import step_event

from toolchain.telemetry.store import open_store

TOKEN = "fleet-token"
SERVERS, WRITERS_PER_SERVER, BATCH = 2, 8, 10
DEADLINE_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port: int) -> bool:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/v1/health")
        ok = c.getresponse().status == 200
        c.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def _start(port: int, db) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "toolchain", "telemetry", "serve", "--port", str(port), "--db",
                             str(db)], env={**os.environ, "TOOLCHAIN_TELEMETRY_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_up(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while not _health(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start: {proc.stderr.read().decode()}")
        time.sleep(0.1)


class Writer:
    """One phone's uploader: keep-alive connections to both servers, its own run, batches retried until acked."""

    def __init__(self, i: int, ports: list[int], events: int):
        self.run_id, self.home, self.ports = f"phone-{i:02d}", i % SERVERS, ports
        self.batches = [[step_event(s, run_id=self.run_id) for s in range(start, min(start + BATCH, events))]
                        for start in range(0, events, BATCH)]
        self.conns: dict[int, http.client.HTTPConnection] = {}
        self.acked: list[int] = []            # seqs acknowledged (as stored or as duplicates)
        self.stored = self.duplicates = self.failures = self.resent = 0   # resent: events of batches sent again
        self.error: BaseException | None = None
        self.after_restart = 0                # batches acknowledged by a restarted server
        self.restarted = threading.Event()
        self.end = 0.0

    def _post(self, server: int, body: str) -> tuple[int, dict]:
        conn = self.conns.get(server)
        if conn is None:
            conn = self.conns[server] = http.client.HTTPConnection("127.0.0.1", self.ports[server], timeout=30)
        try:
            conn.request("POST", "/v1/events", body=body,
                         headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        except BaseException:
            conn.close()
            del self.conns[server]
            raise

    def run(self, lock: threading.Lock, acked: set) -> None:
        deadline = time.monotonic() + DEADLINE_S
        try:
            for batch in self.batches:
                body, server = json.dumps(batch), self.home
                while True:
                    try:
                        status, answer = self._post(server, body)
                    except (OSError, http.client.HTTPException):
                        status, answer = None, None
                    if status == 200:
                        break
                    assert status in (None, 503), (status, answer)
                    assert time.monotonic() < deadline, "batch not acknowledged in time"
                    self.failures += 1
                    self.resent += len(batch)
                    time.sleep(0.05)
                self.after_restart += self.restarted.is_set() and server == 0
                self.stored += answer["stored"]
                self.duplicates += answer["duplicates"]
                with lock:
                    acked.update((self.run_id, e["seq"]) for e in batch)
        except BaseException as e:  # surfaced by the test
            self.error = e
        finally:
            self.end = time.perf_counter()
            for conn in self.conns.values():
                conn.close()


def fleet_load(db, events: int, capsys) -> None:
    ports = [_free_port() for _ in range(SERVERS)]
    procs = [_start(port, db) for port in ports]
    for proc, port in zip(procs, ports):
        _wait_up(proc, port)
    n_writers = SERVERS * WRITERS_PER_SERVER
    per_writer = [events // n_writers + (i < events % n_writers) for i in range(n_writers)]
    writers = [Writer(i, ports, n) for i, n in enumerate(per_writer)]
    acked: set = set()
    lock = threading.Lock()
    threads = [threading.Thread(target=w.run, args=(lock, acked)) for w in writers]
    try:
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        while len(acked) < events // 2 and any(t.is_alive() for t in threads):
            time.sleep(0.005)
        procs[0].send_signal(signal.SIGKILL)                  # midway: server 0 dies with requests in flight
        t_kill = time.perf_counter()
        procs[0].wait(timeout=30)
        with lock:
            acked_at_kill = set(acked)
        with open_store(db) as store:
            stored_at_kill = {(w.run_id, e["seq"]) for w in writers for e in store.events(w.run_id)}
        lost_at_kill = acked_at_kill - stored_at_kill
        procs[0] = _start(ports[0], db)                       # restarted on its port; writers come back to it
        _wait_up(procs[0], ports[0])
        t_up = time.perf_counter()
        for w in writers:
            w.restarted.set()
        for t in threads:
            t.join(timeout=DEADLINE_S)
        seconds = max(w.end for w in writers) - t0
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    assert not [w.error for w in writers if w.error], [w.error for w in writers if w.error]
    assert not lost_at_kill, f"{len(lost_at_kill)} acknowledged events lost at the kill"
    with open_store(db) as store:
        assert store.count() == events
        for w, n in zip(writers, per_writer):
            assert [e["seq"] for e in store.events(w.run_id)] == list(range(n)), w.run_id
    assert len(acked) == events
    retried = sum(w.duplicates for w in writers)
    # each event acknowledged once, as stored or (a batch whose first answer was lost) as a duplicate
    assert sum(w.stored for w in writers) + retried == events
    assert all(w.duplicates <= w.resent for w in writers)    # a duplicate only where a batch was sent again
    assert sum(w.after_restart for w in writers) > 0          # the restarted server took its writers back
    with capsys.disabled():
        backend = "postgresql" if isinstance(db, str) else "sqlite"
        print(f"\n  fleet load ({backend}): {SERVERS} servers x {WRITERS_PER_SERVER} writers, {events} events in "
              f"batches of {BATCH}: {len(acked_at_kill) / (t_kill - t0):.0f} events/s before the kill; server 0 "
              f"killed -9 at {len(acked_at_kill)} acknowledged, back {t_up - t_kill:.1f} s later; all in "
              f"{seconds:.1f} s = {events / seconds:.0f} events/s; {len(stored_at_kill) - len(acked_at_kill)} "
              f"stored but not yet acknowledged at the kill, 0 acknowledged lost, {sum(w.failures for w in writers)} "
              f"failed requests retried, {retried} events re-sent and refused as duplicates, 0 duplicated")


@pytest.mark.parametrize("events", [2_000, pytest.param(10_000, marks=pytest.mark.slow)])
def test_fleet_load_two_servers_kill_9(db_target, events, capsys):
    fleet_load(db_target, events, capsys)
