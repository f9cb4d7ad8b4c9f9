"""The telemetry tests' backends: a SQLite file, or a fresh schema of a real PostgreSQL cluster (one per session,
started on first use; the PostgreSQL cases skip, with the reason, where it cannot be started)."""

from __future__ import annotations

import pytest
import pg_cluster


@pytest.fixture(scope="session")
def postgres():
    reason = pg_cluster.why_not()
    if reason:
        pytest.skip(reason)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pyproject.toml pins it; run make .venv/.installed)")
    cluster = pg_cluster.Cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_target(request, tmp_path):
    """Where a store lives: a SQLite path that does not exist yet, or the URL of a new empty PostgreSQL schema."""
    if request.param == "sqlite":
        return tmp_path / "t.sqlite3"
    return request.getfixturevalue("postgres").new_schema()[1]
