"""Atomic outputs: a failed command leaves nothing half-written.

Files are written to a temporary sibling and `os.replace`d into place; directories are built in a
temporary sibling directory and renamed into place only when the block exits without error.

Temporaries in flight are registered, so that a process told to stop (the CLI's SIGTERM handler)
can delete them with `discard_pending()` and exit at once, instead of unwinding through whatever
library code was running (an exception raised from a signal handler can be swallowed by a library's
`except BaseException`, or crash a half-finished native call during interpreter shutdown: both
were seen with torch.export). The rename into place runs with SIGTERM blocked, so a stop lands
before it (the old output stays) or after it (the new one is complete).

Nothing of the user's is replaced silently: `atomic_dir` refuses to swap out an existing non-empty
directory (or a file) unless the caller says `replace=True`: a command passes its `--force` there
(`atomic_dir(out, replace=force)`, through the writer it calls), after `check_output_dir(out, force=force)`,
which it calls before any long work, together with the writability and free-space checks of
`check_output_dir` / `check_output_file`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import signal
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from toolchain.errors import OutputExists, OutputNotWritable

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_chunks", "atomic_dir", "discard_pending",
           "discarded_on_stop",
           "check_output_dir", "check_output_file", "check_regular_output", "sweep_stale", "FORCE_HELP"]

_PENDING: set[Path] = set()   # temporary files and directories not yet renamed into place (for the SIGTERM handler)

FORCE_HELP = "Replace an existing non-empty output directory (by default it is refused and left untouched)."


def _key(path: Path) -> Path:
    return Path(os.path.abspath(path))


# Temporaries are `.<name>.<pid>.<random>.tmp` (and `.old`) beside their output: a run killed with SIGKILL
# (no handler runs) leaves them, and the next run on the same output deletes those of dead processes.
def _prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(path: Path) -> list[Path]:
    """Delete the temporaries a killed run left beside `path` (those of processes no longer alive)."""
    path = _key(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[^.]+\.(tmp|old)$")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for e in entries:
        m = pattern.match(e.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        p = Path(e.path)
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        removed.append(p)
    return removed


_KINDS = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISFIFO: "a FIFO (named pipe)",
          stat.S_ISSOCK: "a socket"}


def _special(path: Path) -> str | None:
    """What `path` is when it exists (links followed) and is neither a regular file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((kind for test, kind in _KINDS.items() if test(mode)), None)


def check_regular_output(path: Path, *, option: str = "--out", streams: bool = False) -> None:
    """An output file must be a regular file (or new): a device, FIFO or socket (or a link to one) would be
    replaced by a regular file (`--json /dev/null` as root replaced the system's /dev/null) or block.

    `streams`: the command appends to it as it goes (`--telemetry-out`), so a character device is taken
    as it is (/dev/null, a terminal). A FIFO is refused even then: with no reader, opening it blocks
    forever; with one, the appends (one open per event) end its input at the first event.

    Raises:
        OutputExists: `path` is special (and, with `streams`, not a character device).
    """
    kind = _special(path)
    if kind is None:
        return
    if streams and kind == "a character device":
        return
    link = " (through a symbolic link)" if Path(path).is_symlink() else ""
    raise OutputExists(f"{option} {path} is {kind}{link}, not a regular file; give a regular file path")


def _occupied(path: Path) -> str | None:
    """Why replacing `path` would lose something (None: nothing there, or an empty directory)."""
    if not (path.exists() or path.is_symlink()):
        return None
    if not path.is_dir():
        return "exists and is not a directory"
    try:
        with os.scandir(path) as it:
            names = [e.name for _, e in zip(range(3), it)]
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not names:
        return None
    return f"exists and is not empty (holds {', '.join(sorted(names))}{', ...' if len(names) == 3 else ''})"


_FS_IOC_GETFLAGS = 0x80086601               # linux/fs.h: the inode flags `lsattr` shows
_NO_DELETE = {0x10: "immutable", 0x20: "append-only"}   # FS_IMMUTABLE_FL, FS_APPEND_FL: unlink fails (EPERM)


def _undeletable(path: Path, limit: int = 100_000) -> str | None:
    """Why the tree at `path` could not be deleted whole (an immutable or append-only entry, a directory this
    user cannot write), or None. Checked before an output is replaced: the old tree is deleted after the swap,
    and a failure there would leave it behind as `.<name>.<pid>.<random>.old` (exit 0)."""
    import fcntl
    import struct

    stack, seen = [Path(path)], 0
    while stack and seen < limit:
        p = stack.pop()
        seen += 1
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            continue
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            fd = None
        if fd is not None:
            try:
                flags = struct.unpack("l", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 8))[0]
            except OSError:
                flags = 0                    # a file system without inode flags
            finally:
                os.close(fd)
            for bit, what in _NO_DELETE.items():
                if flags & bit:
                    return f"{p} is {what} (chattr -{'i' if bit == 0x10 else 'a'} lifts it)"
        if stat.S_ISDIR(st.st_mode):
            if p != Path(path) and not os.access(p, os.W_OK | os.X_OK):
                return f"{p} is not writable, so what it holds cannot be deleted"
            try:
                stack.extend(Path(e.path) for e in os.scandir(p))
            except OSError as e:
                return f"{p} cannot be read ({e.strerror})"
    return None


def _nearest_existing(path: Path) -> Path:
    path = _key(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable(path: Path, option: str, expected_bytes: int | None) -> None:
    """The directory that will receive `path` (or its nearest existing ancestor) takes a new file, and
    has `expected_bytes` free (with a 10% margin) when that size is known."""
    where = _nearest_existing(path.parent)
    if not where.is_dir():
        raise OutputNotWritable(f"{option} {path}: {where} is a file, so no directory can be created there")
    try:
        with _sigterm_blocked():     # created and deleted with no stop in between: never left behind
            fd, probe = tempfile.mkstemp(dir=where, prefix=".toolchain-probe-", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise OutputNotWritable(f"{option} {path}: cannot write in {where} ({e.strerror}); choose another "
                                f"location") from None
    if expected_bytes:
        free = shutil.disk_usage(where).free
        if free < expected_bytes * 1.1:
            raise OutputNotWritable(f"{option} {path}: needs about {_size(expected_bytes)}, only {_size(free)} "
                                    f"free on {where}; free some space or choose another location")


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def check_output_dir(path: Path, *, force: bool = False, option: str = "--out",
                     expected_bytes: int | None = None) -> Path:
    """Check an output directory before any long work: an existing non-empty directory (or a file) is
    refused unless `force` (the caller then writes it with `atomic_dir(path, replace=force)`), and its
    location must be writable with room for `expected_bytes` when known.

    Raises:
        OutputExists: something is at `path` and `force` is False (or it is a file).
        OutputNotWritable: the location is read-only, not creatable, or short of space.
    """
    path = Path(path)
    real, cwd = Path(os.path.realpath(path)), Path(os.path.realpath(os.getcwd()))
    if cwd.is_relative_to(real):
        raise OutputExists(f"{option} {path} is the current directory or contains it, which cannot be replaced; "
                           f"choose a new directory")
    sweep_stale(path)
    occupied = _occupied(path)
    if occupied is not None:
        if not path.is_dir():
            raise OutputExists(f"{option} {path} {occupied}; choose another path")
        if not force:
            raise OutputExists(f"{option} {path} {occupied}; pass --force to replace it, or choose another directory")
        why = _undeletable(path)
        if why is not None:
            raise OutputNotWritable(f"{option} {path} cannot be replaced: {why}; nothing was changed")
    _check_writable(path, option, expected_bytes)
    return path


def check_output_file(path: Path, *, option: str = "--out", expected_bytes: int | None = None,
                      streams: bool = False) -> Path:
    """Check an output file before any long work: not a directory nor a special file (`check_regular_output`;
    `streams`: appended to as the command goes), and its directory writable.

    Raises:
        OutputExists: `path` is a directory.
        OutputNotWritable: the location is read-only, not creatable, or short of space.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputExists(f"{option} {path} is a directory; give a file path")
    check_regular_output(path, option=option, streams=streams)
    if _special(path) is None:
        sweep_stale(path)
    _check_writable(path, option, expected_bytes)
    return path


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
    """Write `path` whole or not at all (a failed write, e.g. EFBIG or ENOSPC, leaves the old file and no
    temporary). A special file in its place is refused (`check_regular_output`)."""
    atomic_write_chunks(path, (data,))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_chunks(path: Path, chunks: Iterable[str | bytes]) -> None:
    """`atomic_write_bytes` of the concatenation of `chunks` (str as UTF-8), written as they come: an output
    produced as a stream in bounded memory. An exception from `chunks` leaves the old file and no temporary."""
    from toolchain.outputs import output_target

    check_regular_output(Path(path), option="output")
    path = output_target(path)         # a symbolic link is written through and kept (toolchain/outputs.py)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path)
    with _sigterm_blocked():     # a stop between the creation and the registration would leave tmp behind
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_prefix(path), suffix=".tmp")
        _PENDING.add(Path(tmp))
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            for chunk in chunks:
                f.write(chunk.encode() if isinstance(chunk, str) else chunk)
        with _sigterm_blocked():
            os.replace(tmp, path)
            _PENDING.discard(Path(tmp))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _PENDING.discard(Path(tmp))
        raise


def _refuse_occupied(path: Path, replace: bool) -> None:
    occupied = _occupied(path)
    if occupied is not None and not (replace and path.is_dir()):
        hint = "pass --force to replace it, or choose another directory" if path.is_dir() else "choose another path"
        raise OutputExists(f"{path} {occupied}; {hint}")


@contextlib.contextmanager
def atomic_dir(path: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `path`.

    An existing empty directory is replaced; an existing non-empty one only with `replace=True` (a command's
    --force), else OutputExists is raised (before the block runs, and again before the swap), and nothing at
    `path` is touched. A file at `path` is never replaced.
    """
    from toolchain.outputs import output_target

    shown, path = Path(path), output_target(path)     # a link is written through and kept (toolchain/outputs.py)
    _refuse_occupied(shown, replace)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path)
    with _sigterm_blocked():     # a stop between the creation and the registration would leave tmp behind
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=_prefix(path), suffix=".tmp"))
        _PENDING.add(tmp)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _PENDING.discard(tmp)
        raise
    try:
        _refuse_occupied(shown, replace)     # filled by someone else while we worked
    except OutputExists:
        shutil.rmtree(tmp, ignore_errors=True)
        _PENDING.discard(tmp)
        raise
    why = _undeletable(path) if path.is_dir() and not path.is_symlink() else None
    if why is not None:                      # the old tree could not be deleted after the swap
        shutil.rmtree(tmp, ignore_errors=True)
        _PENDING.discard(tmp)
        raise OutputNotWritable(f"{shown} cannot be replaced: {why}; nothing was changed")
    old = None
    with _sigterm_blocked():
        if path.exists() or path.is_symlink():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=_prefix(path), suffix=".old"))
            os.replace(path, old / "x")
        os.replace(tmp, path)
        _PENDING.discard(tmp)
        if old is not None:
            _PENDING.add(old)        # the previous output, now garbage: a stop deletes it too
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
        _PENDING.discard(old)
