"""HTTP ingest of telemetry events (FastAPI on uvicorn) over an `EventStore`.

  POST /v1/events                 one event or an array; Bearer token; all-or-nothing
  GET  /v1/runs                   runs with their `events` count
  GET  /v1/runs/{run_id}/events   a run's events in seq order (?after_seq=N&limit=M)
  GET  /v1/health                 liveness and the database's state, no token: 200 {"ok": true, "database":
                                  "ok"}, or 503 {"ok": false, "database": why} when the database fails or does
                                  not answer within HEALTH_TIMEOUT_S (2 s)

Answers: 200 `{"received", "stored", "duplicates"}`; 401 missing/wrong token; 400 invalid JSON or
not an event/array; 413 body over the limit; 422 schema violations (`errors`: index -> messages);
409 an event reuses a stored (run_id, seq) with other content; 503 the database failed (SQLite or
PostgreSQL: `store.StoreUnavailable`, a lost connection included), or did not answer within
STORE_TIMEOUT_S (5 s: a frozen or unreachable database; the write may still land when it wakes, and the client's
retry is then a duplicate, not a conflict). Every
refusal is `{"error": reason}` and stores nothing. Handlers never let an exception escape as a
crash: the server keeps serving.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import re
import secrets
import socket
import sqlite3
import threading
import time
from typing import NamedTuple

# Imported at module level (not in create_app): FastAPI resolves the handlers' annotations
# (`request: Request`) from this module's globals. Only `toolchain telemetry serve` imports this module.
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from toolchain.errors import BadInput
from toolchain.telemetry.events import InvalidBatch, parse_batch
from toolchain.telemetry.store import ConflictingEvents, EventStore, StoreUnavailable

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app", "serve", "bind_socket", "RunningServer", "start_in_thread",
           "is_loopback", "check_token", "MAX_TOKEN_CHARS"]

DEFAULT_MAX_BODY_BYTES = 1 << 20   # 1 MiB: ~3,000 typical events; phones send smaller batches
_MAX_SEQ = 2**63 - 1                # SQLite integers are int64: a larger after_seq is a 422, not a 500
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")   # telemetry_event.schema.json's run_id
_log = logging.getLogger(__name__)
_STORE_ERRORS = (sqlite3.Error, StoreUnavailable)
MAX_TOKEN_CHARS = 4096
STORE_TIMEOUT_S = 5.0               # a store call (read or write) answered 503 after this long
HEALTH_TIMEOUT_S = 2.0              # /v1/health's bound on the database's answer
_TOKEN = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")   # an HTTP header value: visible ASCII, inner spaces


def check_token(token: str | None) -> str:
    """The token, if a client can send it as `Authorization: Bearer <token>` (an HTTP header value: visible
    ASCII, spaces only inside), at most MAX_TOKEN_CHARS.

    Raises:
        BadInput: empty, blank, surrounded by spaces, or with other characters.
    """
    if not token or not token.strip():
        raise BadInput("the telemetry token must not be empty or blank; pass --token (or TOOLCHAIN_TELEMETRY_TOKEN), "
                       "e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))'")
    if len(token) > MAX_TOKEN_CHARS:
        raise BadInput(f"the telemetry token is {len(token)} characters long; at most {MAX_TOKEN_CHARS}")
    if not _TOKEN.fullmatch(token):
        bad = "spaces around it" if token != token.strip(" ") else next(
            f"character {c!r}" for c in token if not ("\x20" <= c <= "\x7e"))
        raise BadInput(f"the telemetry token has {bad}; a client sends it in an HTTP header: use visible ASCII "
                       f"characters only (no spaces around it)")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse(status: int, reason: str, **extra) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": reason, **extra}, status_code=status, headers=headers)


async def _read_body(request: Request, max_body_bytes: int) -> bytes | None:
    """The body, or None when it exceeds the limit (declared in Content-Length, or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(store: EventStore, token: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """The ASGI app. `token` is the shared secret clients send as `Authorization: Bearer <token>`."""
    check_token(token)
    expected = f"Bearer {token}".encode()
    app = FastAPI(title="toolchain telemetry", docs_url=None, redoc_url=None, openapi_url=None)

    def authorized(request: Request) -> bool:
        return secrets.compare_digest(request.headers.get("authorization", "").encode(), expected)

    def ingest(body: bytes) -> dict:
        return store.add(parse_batch(body))._asdict()

    async def in_thread(fn, *args, **kwargs):
        """`fn` in the thread pool, at most STORE_TIMEOUT_S (then StoreUnavailable: the thread finishes alone)."""
        try:
            return await asyncio.wait_for(run_in_threadpool(fn, *args, **kwargs), STORE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise StoreUnavailable(f"the database did not answer within {STORE_TIMEOUT_S:g} s") from None

    @app.post("/v1/events")
    async def post_events(request: Request):
        if not authorized(request):
            return _refuse(401, "missing or wrong bearer token")
        body = await _read_body(request, max_body_bytes)
        if body is None:
            return _refuse(413, f"body larger than {max_body_bytes} bytes; send smaller batches")
        try:
            return await in_thread(ingest, body)
        except InvalidBatch as e:
            return _refuse(422, str(e), errors={str(i): msgs for i, msgs in e.errors.items()})
        except ConflictingEvents as e:
            return _refuse(409, str(e))
        except BadInput as e:
            return _refuse(400, str(e))
        except _STORE_ERRORS as e:
            _log.exception("telemetry store failed")
            return _refuse(503, f"storage failed ({e}); retry later")

    async def read(fn, *args, **kwargs):
        try:
            return await in_thread(fn, *args, **kwargs)
        except _STORE_ERRORS as e:
            _log.exception("telemetry store failed")
            return _refuse(503, f"storage failed ({e}); retry later")

    @app.get("/v1/runs")
    async def get_runs(request: Request):
        if not authorized(request):
            return _refuse(401, "missing or wrong bearer token")
        runs = await read(store.runs)
        if isinstance(runs, JSONResponse):
            return runs
        return {"runs": [r._asdict() for r in runs]}

    @app.get("/v1/runs/{run_id}/events")
    async def get_run_events(request: Request, run_id: str, after_seq: int = Query(-1, ge=-1, le=_MAX_SEQ),
                             limit: int = Query(10_000, ge=1, le=100_000)):
        if not authorized(request):
            return _refuse(401, "missing or wrong bearer token")
        if not _RUN_ID.fullmatch(run_id):     # no stored run has another id (and it may not even be UTF-8)
            return _refuse(404, f"no events for run {run_id.encode('utf-8', 'replace').decode()!r}")
        events = await read(store.events, run_id, after_seq=after_seq, limit=limit)
        if isinstance(events, JSONResponse):
            return events
        if not events and after_seq < 0:
            return _refuse(404, f"no events for run {run_id!r}")
        return {"run_id": run_id, "events": events}

    pinging: dict[str, asyncio.Future] = {}     # one database check in flight at a time (a frozen one: no pile-up)

    @app.get("/v1/health")
    async def health():
        ping = pinging.get("ping")
        if ping is None or ping.done():
            ping = pinging["ping"] = asyncio.ensure_future(run_in_threadpool(store.ping))
            ping.add_done_callback(lambda f: f.cancelled() or f.exception())   # retrieved, even if late
        try:
            await asyncio.wait_for(asyncio.shield(ping), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            return JSONResponse({"ok": False, "database": f"no answer within {HEALTH_TIMEOUT_S:g} s"}, status_code=503)
        except _STORE_ERRORS as e:
            return JSONResponse({"ok": False, "database": f"failed ({e})"}, status_code=503)
        return {"ok": True, "database": "ok"}

    return app


def _config(app, host: str, port: int):
    import uvicorn

    # h11 (pure Python) and asyncio: no optional C extensions, same behaviour everywhere.
    return uvicorn.Config(app, host=host, port=port, http="h11", loop="asyncio", lifespan="off",
                          log_level="warning", access_log=False, timeout_keep_alive=30)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket bound to (host, port), so that a taken port is found before serving (port 0: the
    system's choice, `sock.getsockname()[1]`).

    Raises:
        BadInput: the port is taken, or the address is not one of this machine's.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise BadInput(f"cannot listen on {host}: {e.strerror}; pass --host with an address of this machine") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does (TIME_WAIT is not "taken")
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise BadInput(f"port {port} on {host} is already in use; stop the other server or pass another "
                           f"--port") from None
        raise BadInput(f"cannot listen on {host}:{port} ({e.strerror}); pass another --host/--port") from None
    sock.listen(2048)   # uvicorn's backlog: a client that connects before the server runs waits, is not refused
    return sock


def serve(store: EventStore, token: str, *, host: str = "127.0.0.1", port: int = 8765,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, sock: socket.socket | None = None) -> None:
    """Serve until interrupted (Ctrl-C). `sock`: already bound by `bind_socket` (else bound here)."""
    import uvicorn

    sock = sock or bind_socket(host, port)
    server = uvicorn.Server(_config(create_app(store, token, max_body_bytes=max_body_bytes), host, port))
    server.run(sockets=[sock])


class RunningServer(NamedTuple):
    url: str                      # e.g. http://127.0.0.1:41234
    port: int
    server: object                # the uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def start_in_thread(app, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 10.0) -> RunningServer:
    """Run `app` on a real uvicorn server in a daemon thread (port 0: a free port). For tests and
    for host-side tools that post to themselves."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(_config(app, host, port))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="telemetry-server")
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("telemetry server did not start")
        time.sleep(0.01)
    shown = f"[{host}]" if ":" in host else host
    return RunningServer(f"http://{shown}:{port}", port, server, thread)
