"""The telemetry HTTP server, on a real uvicorn server bound to 127.0.0.1 (a free port) in a thread, over both
backends (SQLite, PostgreSQL): round trip, idempotent retries, token checks, bad-input refusals that store
nothing, a lost database connection (503, then served again), and load; `toolchain telemetry serve`'s refusals
(tokens, a foreign --db, a taken port) leave nothing behind, and its banner names the bound port."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from telemetry_samples import run_start_event, step_event

from toolchain.errors import BadInput
from toolchain.telemetry.server import check_token, create_app, start_in_thread
from toolchain.telemetry.store import EventStore, open_store

TOKEN = "s3cret-token"
MAX_BODY = 64 * 1024


class Client:
    """One keep-alive HTTP/1.1 connection, like a phone's uploader."""

    def __init__(self, port: int, token: str | None = TOKEN):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.token = token

    def request(self, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None):
        h = {"Content-Type": "application/json", **(headers or {})}
        if self.token is not None:
            h["Authorization"] = f"Bearer {self.token}"
        self.conn.request(method, path, body=body, headers=h)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else None

    def post(self, payload, **kw):
        body = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
        return self.request("POST", "/v1/events", body, **kw)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def server(db_target):
    store = open_store(db_target)
    running = start_in_thread(create_app(store, TOKEN, max_body_bytes=MAX_BODY))
    yield running, store
    running.stop()
    store.close()


@pytest.fixture
def client(server):
    c = Client(server[0].port)
    yield c
    c.close()


def test_round_trip_and_idempotent_retry(server, client):
    _, store = server
    batch = [run_start_event("run-a"), step_event(1, "run-a"), step_event(2, "run-a")]
    assert client.post(batch) == (200, {"received": 3, "stored": 3, "duplicates": 0})
    assert client.post(batch) == (200, {"received": 3, "stored": 0, "duplicates": 3})       # the retry
    assert client.post(step_event(3, "run-a")) == (200, {"received": 1, "stored": 1, "duplicates": 0})
    status, runs = client.request("GET", "/v1/runs")
    assert status == 200 and [(r["run_id"], r["events"], r["model"]) for r in runs["runs"]] == [("run-a", 4, "tiny")]
    status, got = client.request("GET", "/v1/runs/run-a/events")
    assert status == 200 and got["events"] == [*batch, step_event(3, "run-a")]
    status, page = client.request("GET", "/v1/runs/run-a/events?after_seq=1&limit=2")
    assert [e["seq"] for e in page["events"]] == [2, 3]
    assert client.request("GET", "/v1/runs/unknown/events")[0] == 404
    assert store.count() == 4


@pytest.mark.parametrize("token", [None, "wrong", "", f"{TOKEN}x"])
def test_missing_or_wrong_token_is_401_and_stores_nothing(server, token):
    port, store = server[0].port, server[1]
    c = Client(port, token)
    status, body = c.post(step_event(0))
    assert status == 401 and "token" in body["error"]
    assert c.request("GET", "/v1/runs")[0] == 401
    assert c.request("GET", "/v1/runs/r1/events")[0] == 401
    c.close()
    assert store.count() == 0


def test_basic_scheme_or_raw_token_is_refused(server):
    port = server[0].port
    for header in (f"Basic {TOKEN}", TOKEN, f"bearer  {TOKEN}"):
        c = Client(port, None)
        assert c.post(step_event(0), headers={"Authorization": header})[0] == 401
        c.close()


@pytest.mark.parametrize("body, status, reason", [
    ("{not json", 400, "invalid JSON"),
    (b"\xff\xfe garbage", 400, "invalid JSON"),
    ('{"loss": NaN}', 400, "NaN"),
    ("[]", 400, "empty batch"),
    ("17", 400, "expected an event object"),
    ("[" * 50_000 + "]" * 50_000, 413, "larger than"),
    ("[" * 10_000 + "]" * 10_000, 400, "nested too deeply"),
    (json.dumps(step_event(0, loss="low")), 422, "not a valid telemetry event"),
    (json.dumps({**step_event(0), "extra": 1}), 422, "extra"),
    (json.dumps([step_event(i) for i in range(2000)]), 413, "larger than"),
])
def test_bad_input_is_4xx_with_a_reason_and_stores_nothing(server, client, body, status, reason):
    got_status, got = client.post(body)
    assert got_status == status and reason in got["error"]
    assert server[1].count() == 0
    assert client.post(step_event(0))[0] == 200            # and the server is still serving


def test_a_partly_bad_batch_stores_nothing(server, client):
    batch = [step_event(0), step_event(1), step_event(2, step_time_s=-1.0), step_event(3)]
    status, body = client.post(batch)
    assert status == 422 and list(body["errors"]) == ["2"] and "step_time_s" in body["errors"]["2"][0]
    assert server[1].count() == 0
    assert client.post(batch[:2] + batch[3:])[1]["stored"] == 3


def test_conflicting_reuse_of_a_seq_is_409_and_stores_nothing(server, client):
    client.post(step_event(0))
    status, body = client.post([step_event(1), step_event(0, loss=1.0)])
    assert status == 409 and "r1#0" in body["error"]
    assert server[1].count() == 1


def test_oversize_body_without_content_length_is_refused(server, client):
    def chunks():
        for _ in range(MAX_BODY // 1024 + 8):
            yield b" " * 1024

    client.conn.putrequest("POST", "/v1/events")
    client.conn.putheader("Authorization", f"Bearer {TOKEN}")
    client.conn.putheader("Transfer-Encoding", "chunked")
    client.conn.endheaders()
    for chunk in chunks():
        client.conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    client.conn.send(b"0\r\n\r\n")
    r = client.conn.getresponse()
    assert r.status == 413 and "larger than" in json.loads(r.read())["error"]


def test_a_lost_database_connection_is_503_then_served_again(postgres):
    schema, url = postgres.new_schema()
    store = open_store(url)
    running = start_in_thread(create_app(store, TOKEN))
    c = Client(running.port)
    try:
        assert c.post(step_event(0))[0] == 200
        with postgres.connect() as admin:     # what a database restart or failover does to the server's connections
            killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                   "application_name = 'toolchain-telemetry'").fetchall()
        assert killed
        status, body = c.post(step_event(1))
        assert status == 503 and "retry later" in body["error"]
        assert c.post(step_event(1)) == (200, {"received": 1, "stored": 1, "duplicates": 0})   # the client's retry
        assert c.request("GET", "/v1/runs")[1]["runs"][0]["events"] == 2
    finally:
        c.close()
        running.stop()
        store.close()


@pytest.mark.parametrize("token, reason", [
    ("", "must not be empty"), ("   ", "must not be empty or blank"), (" abc", "spaces around it"),
    ("abc ", "spaces around it"), ("a\tb", r"character '\\t'"), ("t\u00f6ken", "character 'ö'"),
    ("a\r\nX-Injected: 1", r"character '\\r'"), ("x" * 4097, "4097 characters"),
])
def test_tokens_a_client_cannot_send_are_refused(token, reason):
    with pytest.raises(BadInput, match=reason):
        check_token(token)
    with pytest.raises(BadInput, match=reason):
        create_app(None, token)


@pytest.mark.parametrize("token", ["s3cret", "a b", "~!#$%&'*+-.^_`|", "x" * 4096])
def test_tokens_of_visible_ascii_with_inner_spaces_are_accepted(token):
    assert check_token(token) == token


def _serve(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "toolchain", "telemetry", "serve", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None})


@pytest.mark.parametrize("args, env, reason", [
    (["--token", ""], None, "must not be empty"),
    (["--token", "   "], None, "must not be empty or blank"),
    ([], {"TOOLCHAIN_TELEMETRY_TOKEN": "  "}, "must not be empty or blank"),
    (["--token", "tok\u00e9n"], None, "character 'é'"),
])
def test_serve_refuses_bad_tokens_before_creating_anything(tmp_path, args, env, reason):
    r = _serve("--port", 0, "--db", tmp_path / "t.sqlite3", *args, env={"TOOLCHAIN_TELEMETRY_TOKEN": None, **(env or {})})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("Error: ") and reason in r.stderr
    assert "telemetry server on" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_serve_refuses_a_foreign_db_and_a_taken_port_leaving_nothing(tmp_path):
    import sqlite3

    app = tmp_path / "app.db"
    with sqlite3.connect(app) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    before = app.read_bytes()
    r = _serve("--port", 0, "--db", app, "--token", TOKEN)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and "holds table users" in r.stderr
    assert r.stderr.count("\n") == 1 and app.read_bytes() == before
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = _serve("--port", taken.getsockname()[1], "--db", tmp_path / "new.sqlite3", "--token", TOKEN)
    assert r.returncode == 2 and "already in use" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_serve_on_port_0_prints_the_bound_port(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", "telemetry", "serve", "--port", "0", "--db",
                             str(tmp_path / "t.sqlite3"), "--token", TOKEN], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stderr.readline()
        port = int(banner.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert port != 0, banner
        c = Client(port, None)
        assert c.request("GET", "/v1/health") == (200, {"ok": True, "database": "ok"})   # the banner's port is the server's
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_health_needs_no_token(server):
    c = Client(server[0].port, None)
    assert c.request("GET", "/v1/health") == (200, {"ok": True, "database": "ok"})
    c.close()


@pytest.fixture
def cli_server(tmp_path):
    """`toolchain telemetry serve` in its own process (so the clients do not share its GIL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "load.sqlite3"
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", "telemetry", "serve", "--port", str(port),
                             "--db", str(db)], env={**os.environ, "TOOLCHAIN_TELEMETRY_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            c = Client(port, None)
            if c.request("GET", "/v1/health")[0] == 200:
                c.close()
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"server did not start: {proc.stderr.read().decode()}")
            time.sleep(0.1)
    store = EventStore(db)
    yield port, store
    proc.terminate()
    proc.wait(timeout=30)
    store.close()


def load_test(port: int, store: EventStore, clients: int, events: int, capsys) -> None:
    """`clients` concurrent uploaders, `events` events each, one event per request, every 10th sent
    twice (a retry): none lost, none duplicated."""
    results: dict[int, list] = {}
    errors: list = []

    def upload(i: int) -> None:
        c = Client(port)
        out = []
        try:
            for seq in range(events):
                out.append(c.post(step_event(seq, run_id=f"client-{i}")))
                if seq % 10 == 0:
                    out.append(c.post(step_event(seq, run_id=f"client-{i}")))
        except Exception as e:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(e)
        finally:
            c.close()
        results[i] = out

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - t0
    assert not errors, errors
    answers = [a for out in results.values() for a in out]
    assert all(status == 200 for status, _ in answers)
    retries = clients * len(range(0, events, 10))
    assert sum(body["stored"] for _, body in answers) == clients * events
    assert sum(body["duplicates"] for _, body in answers) == retries
    assert store.count() == clients * events
    for i in range(clients):
        assert [e["seq"] for e in store.events(f"client-{i}", limit=None)] == list(range(events))
    with capsys.disabled():
        print(f"\n  load: {clients} clients x {events} events (+{retries} retries) in {seconds:.1f} s = "
              f"{(clients * events + retries) / seconds:.0f} requests/s on loopback")


def test_load_8_clients_x_100_events(cli_server, capsys):
    load_test(*cli_server, 8, 100, capsys)


@pytest.mark.slow
def test_load_8_clients_x_1000_events(cli_server, capsys):
    load_test(*cli_server, 8, 1000, capsys)
