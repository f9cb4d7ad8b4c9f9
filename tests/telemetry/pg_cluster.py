"""A throwaway PostgreSQL cluster for the tests: `initdb` in a temporary directory, `pg_ctl start` on a free port,
listening on a unix socket in that directory only (no TCP). PostgreSQL refuses to run as root: as root the
cluster runs as the `postgres` user (through `runuser`), which owns the directory.

`why_not()` says why a cluster cannot be started here (None when it can); tests skip with that reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

BINARIES = ("initdb", "pg_ctl", "postgres")
_EXTRA_BIN_DIRS = ("/usr/local/bin", "/usr/local/pgsql/bin", "/usr/lib/postgresql/15/bin")


def _which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in _EXTRA_BIN_DIRS:
        if os.access(Path(d, name), os.X_OK):
            return str(Path(d, name))
    return None


def _run_as() -> list[str]:
    """The command prefix that runs PostgreSQL as a non-root user ([] when not root)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


def why_not() -> str | None:
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return f"PostgreSQL binaries not found ({', '.join(missing)}; looked on PATH and in {', '.join(_EXTRA_BIN_DIRS)})"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, PostgreSQL refuses root, and there is no `postgres` user to run it as"
        if shutil.which("runuser") is None:
            return "running as root, PostgreSQL refuses root, and `runuser` is missing to run it as `postgres`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A running cluster; `url(schema)` is a URL for a fresh schema in database `postgres`."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tc-pg-", dir="/tmp"))   # short: unix socket paths <= 107 bytes
        self.port = _free_port()
        self.data = self.dir / "data"
        prefix = _run_as()
        if prefix:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._prefix = prefix
        try:
            self._pg("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C",
                     "--no-sync")
            self._pg("pg_ctl", "-D", self.data, "-l", self.dir / "log", "-w", "-t", "60", "-o",
                     f"-p {self.port} -k {self.dir} -c listen_addresses='' -c max_connections=200", "start")
        except BaseException:
            self.stop()
            raise

    def _pg(self, binary: str, *args) -> None:
        cmd = [*self._prefix, _which(binary), *map(str, args)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log = (self.dir / "log").read_text() if (self.dir / "log").exists() else ""
            raise RuntimeError(f"{binary} failed ({r.returncode}): {r.stderr.strip()}\n{log[-2000:]}")

    def base_url(self) -> str:
        return f"postgresql://postgres@/postgres?host={quote(str(self.dir), safe='')}&port={self.port}"

    def url(self, schema: str) -> str:
        return f"{self.base_url()}&options={quote(f'-csearch_path={schema}', safe='')}"

    def connect(self):
        import psycopg

        return psycopg.connect(self.base_url(), autocommit=True)

    def new_schema(self) -> tuple[str, str]:
        """(schema, url) of a new empty schema."""
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with self.connect() as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return schema, self.url(schema)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self._prefix, _which("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
