"""What a command reads is a regular file (or a directory where one is expected), never a FIFO, a socket, a
device or a symbolic link loop: opening a FIFO blocks until a writer comes (forever), reading a device can
block or never end, a loop is an `OSError` traceback.

- `check_input(path)`: the path as it is now (links followed); the CLI runs it on every input path option
  before the command body (toolchain/cli/guard.py), so `--data FIFO`, `--plan FIFO`, `--model` a socket are
  refused up front.
- `open_input(path)` / `read_input(path)`: every reader of a file inside an input (a checkpoint's config.json
  and shards, a program's manifest, an adapter's files, a plan, data) opens with `O_NONBLOCK` (a FIFO opens at
  once instead of blocking), checks what it opened with `fstat` (no race between the check and the open), and
  only then reads.

Each refusal is one `BadInput` naming the path and what it is.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from toolchain.errors import BadInput

__all__ = ["special_kind", "check_input", "open_input", "read_input", "file_identity"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def special_kind(mode: int) -> str | None:
    """What a stat mode is when it is neither a regular file nor a directory (None otherwise)."""
    return next((kind for test, kind in _KINDS if test(mode)), None)


def _refusal(where: str, kind: str) -> BadInput:
    return BadInput(f"{where} is {kind}, not a regular file; give the path of a regular file")


def _os_refusal(where: str, e: OSError, path: Path | None = None) -> BadInput:
    if path is not None and e.errno in (errno.ENXIO, errno.EOPNOTSUPP):   # open(2) of a socket
        try:
            kind = special_kind(os.stat(path).st_mode)
        except OSError:
            kind = None
        if kind is not None:
            return _refusal(where, kind)
    if e.errno == errno.ELOOP:
        return BadInput(f"{where} is a symbolic link loop (it never reaches a file); fix or remove the link")
    if e.errno == errno.ENOENT:
        return BadInput(f"{where} does not exist" + (" (a symbolic link to a missing file)"
                                                      if os.path.islink(where) else ""))
    return BadInput(f"{where} cannot be read ({e.strerror})")


def check_input(path: Path, *, what: str | None = None, dir_ok: bool = True) -> None:
    """Refuse an input path that is special (FIFO, socket, device) or a symbolic link loop.

    Raises:
        BadInput: as above, or a directory where a file is expected (`dir_ok=False`).
    """
    where = what or str(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise _os_refusal(where, e) from None
    kind = special_kind(mode)
    if kind is not None:
        raise _refusal(where, kind)
    if stat.S_ISDIR(mode) and not dir_ok:
        raise BadInput(f"{where} is a directory, not a file")


def open_input(path: Path, *, what: str | None = None) -> BinaryIO:
    """Open a regular file for reading (see the module docstring), as a binary file object.

    Raises:
        BadInput: missing, a directory, special, a link loop, or unreadable.
    """
    where = what or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise BadInput(f"{where} is a directory, not a file") from None
    except OSError as e:
        raise _os_refusal(where, e, path) from None
    try:
        mode = os.fstat(fd).st_mode
        kind = special_kind(mode)
        if kind is not None:
            raise _refusal(where, kind)
        if stat.S_ISDIR(mode):
            raise BadInput(f"{where} is a directory, not a file")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: Path, *, what: str | None = None) -> bytes:
    """The bytes of a regular file (`open_input`)."""
    with open_input(path, what=what) as f:
        try:
            return f.read()
        except OSError as e:
            raise BadInput(f"{what or path} cannot be read ({e.strerror})") from None


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns) of a file: what changes when it is replaced or rewritten (a rewrite that
    keeps the size and restores the mtime does not change it)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
