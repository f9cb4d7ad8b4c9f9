"""Atomic outputs: a failed command leaves nothing half-written.

Files are written to a temporary sibling and `os.replace`d into place; directories are built in a
temporary sibling directory and renamed into place only when the block exits without error.

Temporaries in flight are registered, so that a process told to stop (the CLI's SIGTERM handler)
can delete them with `discard_pending()` and exit at once, instead of unwinding through whatever
library code was running (an exception raised from a signal handler can be swallowed by a library's
`except BaseException`, or crash a half-finished native call during interpreter shutdown: both
were seen with torch.export). The rename into place runs with SIGTERM blocked, so a stop lands
before it (the old output stays) or after it (the new one is complete).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_dir", "discard_pending", "discarded_on_stop"]

_PENDING: set[Path] = set()   # temporary files and directories not yet renamed into place


def discard_pending() -> None:
    """Delete every temporary output still in flight (called on the way out of a stopped process)."""
    for tmp in list(_PENDING):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _PENDING.discard(tmp)


@contextlib.contextmanager
def discarded_on_stop(path: Path) -> Iterator[Path]:
    """Register a scratch file or directory (its owner deletes it normally) so that a stopped
    process deletes it too (`discard_pending`)."""
    path = Path(path)
    _PENDING.add(path)
    try:
        yield path
    finally:
        _PENDING.discard(path)


@contextlib.contextmanager
def _sigterm_blocked() -> Iterator[None]:
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    _PENDING.add(Path(tmp))
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        with _sigterm_blocked():
            os.replace(tmp, path)
            _PENDING.discard(Path(tmp))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _PENDING.discard(Path(tmp))
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `path` (an existing one is swapped out)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    _PENDING.add(tmp)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _PENDING.discard(tmp)
        raise
    old = None
    with _sigterm_blocked():
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.replace(path, old / "x")
        os.replace(tmp, path)
        _PENDING.discard(tmp)
        if old is not None:
            _PENDING.add(old)        # the previous output, now garbage: a stop deletes it too
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
        _PENDING.discard(old)
