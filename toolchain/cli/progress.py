"""A progress bar on stderr for commands that read one large input file (`data --text`, `tokenize`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["file_progress", "SHOW_FROM_BYTES"]

SHOW_FROM_BYTES = 8 * 2**20      # smaller inputs take about a second: no bar


@contextlib.contextmanager
def file_progress(path: Path, description: str) -> Iterator[Callable[[int], None] | None]:
    """Yield `on_bytes(n)` advancing a transient bar over `path`'s size, or None (stderr is not a terminal,
    or the file is small)."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        size = 0
    if size < SHOW_FROM_BYTES or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=size)
        yield lambda n: progress.advance(task, n)
