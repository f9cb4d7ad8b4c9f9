"""`toolchain telemetry serve|import|runs|report|fleet`: collect the phones' telemetry, report on a run and
across runs."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.atomic import FORCE_HELP

DEFAULT_DB = Path("telemetry.sqlite3")
_DB_HELP = ("The event store: a SQLite file, or a PostgreSQL URL postgresql://USER@HOST:PORT/DBNAME (password in "
            "PGPASSWORD or ~/.pgpass; ?options=-csearch_path%3DSCHEMA for a schema other than public).")


class _Db(click.Path):
    """A PostgreSQL URL (kept as a string) or the path of a SQLite file."""

    name = "db"

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx):
        from toolchain.telemetry.store import is_database_url

        if is_database_url(value):
            return value
        return super().convert(value, param, ctx)


_db_option = click.option("--db", type=_Db(), default=DEFAULT_DB, show_default=True, help=_DB_HELP)


def _existing_db(ctx, param, value: Path | str) -> Path | str:
    if isinstance(value, Path) and not value.is_file():
        raise click.BadParameter(f"{value} does not exist; start `toolchain telemetry serve` or "
                                 f"`toolchain telemetry import` with this --db first")
    return value


_existing_db_option = click.option("--db", type=_Db(), default=DEFAULT_DB, show_default=True,
                                   callback=_existing_db, help=_DB_HELP)


@click.group()
def telemetry() -> None:
    """Receive training telemetry from phones (or the host runtime) and report on a run."""


@telemetry.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; 0.0.0.0 to accept phones on the LAN (adb reverse needs only loopback).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@_db_option
@click.option("--token", envvar="TOOLCHAIN_TELEMETRY_TOKEN", required=True,
              help="Shared secret clients send as 'Authorization: Bearer TOKEN' [env: TOOLCHAIN_TELEMETRY_TOKEN].")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=1 << 20, show_default=True,
              help="Largest accepted request body.")
def serve(host: str, port: int, db: Path | str, token: str, max_body_bytes: int) -> None:
    """Serve POST /v1/events, GET /v1/runs and GET /v1/runs/RUN_ID/events until Ctrl-C. Several servers may
    share one PostgreSQL --db (behind a load balancer); a SQLite --db is for one machine."""
    from toolchain.telemetry.server import bind_socket, check_token, is_loopback
    from toolchain.telemetry.server import serve as run_server
    from toolchain.telemetry.store import open_store

    check_token(token)                    # refusals come before anything is bound or created
    sock = bind_socket(host, port)        # a taken port is one error line, before the store is opened
    try:
        store = open_store(db)
    except BaseException:
        sock.close()
        raise
    with store:
        if not is_loopback(host):
            click.echo(f"warning: listening on {host}: plain HTTP, the token is the only protection", err=True)
        bound = sock.getsockname()[1]     # --port 0: the port the system chose
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"telemetry server on http://{shown}:{bound}/v1/events (db {store.describe()}); Ctrl-C stops",
                   err=True)
        run_server(store, token, host=host, port=bound, max_body_bytes=max_body_bytes, sock=sock)


@telemetry.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_db_option
def import_(files: tuple[Path, ...], db: Path | str) -> None:
    """Store the events of files pulled from a phone: JSONL (one event per line) or one JSON array of events
    (re-importing stores nothing twice). All or nothing: every file is validated, and all are stored in one
    transaction (a conflict stores none)."""
    from toolchain.telemetry.events import read_jsonl
    from toolchain.telemetry.store import open_store

    batches = [(path, read_jsonl(path)) for path in files]   # validate every file before storing any
    with open_store(db) as store:
        results = store.add_batches([events for _, events in batches])
    for (path, events), result in zip(batches, results):
        runs = sorted({e["run_id"] for e in events})
        click.echo(f"{path}: {result.stored} new, {result.duplicates} already stored; run {', '.join(runs)}")


@telemetry.command()
@_existing_db_option
def runs(db: Path | str) -> None:
    """List the stored runs with their event counts."""
    from toolchain.telemetry.store import open_store

    with open_store(db) as store:
        for r in store.runs():
            click.echo(f"{r.run_id}  {r.events} events  {r.model or '?'} on {r.device_model or '?'}  "
                       f"{r.status or 'incomplete'}")


@telemetry.command()
@click.argument("run_id")
@_existing_db_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output directory: index.html, memory.png, loss.png, step_time.png, summary.json (an existing "
                   "non-empty one is refused unless --force).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def report(run_id: str, db: Path | str, out: Path, force: bool) -> None:
    """Plot a run's memory (against its budget and the published MeSP/MeBP peaks), loss and step time."""
    from toolchain.atomic import check_output_dir
    from toolchain.errors import BadInput
    from toolchain.telemetry.report import write_report
    from toolchain.telemetry.store import open_store

    check_output_dir(out, force=force)

    with open_store(db) as store:
        events = store.events(run_id)
        known = [r.run_id for r in store.runs()]
    if not events:
        raise BadInput(f"no events for run {run_id!r} in {store.describe()}; stored runs: {', '.join(known) or 'none'}")
    files = write_report(run_id, events, out, replace=force)
    click.echo(f"{len(events)} events -> {files.html}")


def _date(ctx, param, value: str | None) -> float | None:
    """YYYY-MM-DD (UTC) as Unix seconds at 00:00."""
    if value is None:
        return None
    import calendar
    import time

    try:
        return float(calendar.timegm(time.strptime(value, "%Y-%m-%d")))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date YYYY-MM-DD (UTC)") from None


@telemetry.command()
@_existing_db_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output directory: index.html, fleet.json, scatter.png, runs/RUN_ID/ (each run's report); an "
                   "existing non-empty one is refused unless --force.")
@click.option("--model", "models", multiple=True, help="Only runs of this model (repeatable).")
@click.option("--device", "devices", multiple=True, help="Only runs on this device model (repeatable).")
@click.option("--since", callback=_date, help="Only runs whose first event is on or after this date (YYYY-MM-DD, UTC).")
@click.option("--until", callback=_date, help="Only runs whose first event is before the end of this date "
                                               "(YYYY-MM-DD, UTC).")
@click.option("--no-run-reports", is_flag=True, help="Skip the per-run reports (faster for many runs; no links).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def fleet(db: Path | str, out: Path, models: tuple[str, ...], devices: tuple[str, ...], since: float | None,
          until: float | None, no_run_reports: bool, force: bool) -> None:
    """Across the stored runs: per device model and config, runs, completed, killed, low-memory signals,
    median step time, measured peak above the loaded runtime vs the planner's estimate; a scatter of
    measured vs predicted peak; links to each run's report."""
    from toolchain.atomic import check_output_dir
    from toolchain.errors import BadInput
    from toolchain.telemetry.fleet import write_fleet
    from toolchain.telemetry.store import open_store

    import sys

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    check_output_dir(out, force=force)
    filters = {"model": list(models) or None, "device": list(devices) or None,
               "since": since, "until": until}
    with open_store(db) as store:
        infos = store.runs()
        chosen = [r for r in infos
                  if (not models or r.model in models) and (not devices or r.device_model in devices)
                  and (since is None or (r.first_timestamp is not None and r.first_timestamp >= since))
                  and (until is None or (r.first_timestamp is not None and r.first_timestamp < until + 86400))]
        if not chosen:
            raise BadInput(f"no stored run in {store.describe()} matches the filters ({len(infos)} runs stored)")
        # each run's events read as its page is written (never the whole fleet's in memory); a bar on a terminal
        with Progress(TextColumn("fleet"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as progress:
            task = progress.add_task("fleet", total=len(chosen))
            files = write_fleet(((r.run_id, store.events(r.run_id)) for r in chosen), out, filters=filters,
                                reports=not no_run_reports, replace=force, on_run=lambda: progress.advance(task))
    click.echo(f"{len(chosen)} runs -> {files.html}")
