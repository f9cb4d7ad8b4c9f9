"""A memory-mapped file that shrinks under a running process: one `Error:` line instead of death by SIGBUS.

The weights file (and ExecuTorch's view of the .pte) is memory-mapped; when another process truncates
it, the next read of a page past the new end raises SIGBUS in whatever native code touches it (a
kernel's loads, a memcpy). What can be done about it, and what this module does:

- Python's `signal` module cannot handle it: its C handler only sets a flag and returns, the faulting
  load runs again and faults again, forever (and `faulthandler` prints a traceback, then dies by the
  signal). Unwinding out of the faulting native frame is not possible either.
- So `install()` puts a handler on SIGBUS through libc `sigaction()` with SA_SIGINFO (ctypes; plain
  `signal()` where the struct layout is not known: macOS, 32-bit) that writes one line to stderr and
  `_exit(2)`s at once, in the faulting thread: no unwinding, no cleanup, no checkpoint written from the
  handler (the state may be mid-update, and serializing is not async-signal safe). The line names the
  file that faulted: the faulting address (siginfo's si_addr) is looked up in /proc/self/maps, read at
  fault time with open/read (`_mapped_file`). A fault in the guarded program's files gives the prepared
  line (with, when a training run set it by `set_note`, the last checkpoint, which is whole: checkpoints
  are written atomically, so a SIGBUS during one leaves the previous file; its temporary is removed by the
  next run on that path, `toolchain.atomic.sweep_stale`); a fault in the native kernel library names its
  cache entry and how to clear it; any other mapped file is named as it is. Why a read at fault time and
  not a table of mapped ranges prepared beforehand: the mappings that fault are made by code this module
  does not see (ld.so mapping the kernel library during `dlopen`, the very fault a truncated cache entry
  causes; ExecuTorch mapping the .pte; numpy and safetensors mapping weights), so any table would miss the
  newest mapping exactly when it matters; open(2) and read(2) are async-signal-safe, and the parsing is
  done by the interpreter the handler already runs in (the allocation risk below is the same one).
- The step boundary is where a clean stop is possible: the training loop asks `Trainer.inputs_changed`
  (for a program: `ProgramDir.weights_changed`, size / inode / mtime of the weights file) before every
  step, and on a change saves the checkpoint of the last completed step and stops with one error. That
  checkpoint is exact when the file was truncated or replaced by a rename (a completed step read only
  pages that were still there, or the old inode); if the bytes were rewritten in place during the step,
  the step may have read a mix of old and new weights, which nothing on the host can detect.

Guaranteed: exit code 2 and one line, whichever thread faults, on Linux and macOS (CPython's ctypes
callback takes the GIL, or the thread already holds it); the faulting file named on 64-bit Linux (macOS has
no /proc/self/maps: there the line names the guarded file). Not guaranteed: a fault while the faulting
thread holds a lock the handler needs (malloc's, in the interpreter's allocation of the callback frame)
would hang instead of exit; none of the mapped reads happens inside the allocator.
"""

from __future__ import annotations

import os
import signal

__all__ = ["install", "set_note", "installed", "remove_on_fault", "guard_program"]

_state: dict[str, object] = {"handler": None, "line": b"", "note": b"", "remove": [], "siginfo": False,
                              "kernel_cache": b"", "what": b""}
_MAPS_BUF = 1 << 16


def _mapped_file(addr: int) -> bytes:
    """The path of the file mapping `addr` belongs to, from /proc/self/maps read at fault time with open/read
    (b"" when none: not a file mapping, no /proc, macOS)."""
    try:
        fd = os.open("/proc/self/maps", os.O_RDONLY)
    except OSError:
        return b""
    try:
        rest = b""
        while True:
            chunk = os.read(fd, _MAPS_BUF)
            if not chunk:
                return b""
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:   # "start-end perms offset dev inode   path"
                span, _, tail = line.partition(b" ")
                lo, _, hi = span.partition(b"-")
                if int(lo, 16) <= addr < int(hi, 16):
                    fields = tail.split(None, 4)
                    return fields[4].strip() if len(fields) == 5 and fields[4].startswith(b"/") else b""
    except (OSError, ValueError):
        return b""
    finally:
        os.close(fd)


def _line_for(path: bytes) -> bytes:
    """The line for a fault in the mapped file `path` (the installed line when it is the guarded file or unknown)."""
    if not path:
        return _state["line"]
    if path.endswith(b" (deleted)"):
        path = path[: -len(b" (deleted)")]
    cache = _state["kernel_cache"]
    if cache and path.startswith(cache):
        return (b"Error: the kernel library " + path + b" was truncated or replaced while loaded (bus error reading "
                b"it); clear the kernel cache with `rm -r " + path.rpartition(b"/")[0] + b"` (or point "
                b"$TOOLCHAIN_KERNEL_CACHE at another directory) and run again")
    if _state["what"] and (path == _state["what"] or path.startswith(_state["what"] + b"/")):
        return _state["line"]                  # the guarded file (or a file of the guarded program)
    return (b"Error: " + path + b" was truncated or replaced while memory-mapped (bus error reading it); keep the "
            b"files a command reads unchanged while it runs")


def _on_sigbus(_signum: int, info: int | None = None, _context: int | None = None) -> None:
    # runs in the faulting thread, never returns
    if _state.get("fired"):                    # another thread faulted too (torch's threads read in parallel):
        while True:                            # the first one is writing the line and exiting the process
            os.sched_yield()
    _state["fired"] = True                     # (under the GIL: the test and the set are one step)
    line = _state["line"]
    if info and _state["siginfo"]:
        addr = _state["ctypes"].c_void_p.from_address(info + _SI_ADDR_OFFSET).value or 0
        line = _line_for(_mapped_file(addr))
    for path in _state["remove"]:
        try:
            os.unlink(path)                    # async-signal-safe
        except OSError:
            pass
    os.write(2, line + _state["note"] + b"\n")
    os._exit(2)


_SI_ADDR_OFFSET = 16   # Linux, 64-bit: si_signo, si_errno, si_code, padding, then the union (si_addr first)


def _sigaction(libc, handler) -> bool:
    """Install `handler` (int, siginfo_t *, void *) with SA_SIGINFO through libc sigaction (Linux 64-bit glibc
    or musl layout). False where that layout is not known (then the caller falls back to signal())."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False

    class SigAction(ctypes.Structure):          # struct sigaction, x86_64 and aarch64
        _fields_ = [("sa_sigaction", ctypes.c_void_p), ("sa_mask", ctypes.c_ulong * 16), ("sa_flags", ctypes.c_int),
                    ("sa_restorer", ctypes.c_void_p)]

    act = SigAction()
    act.sa_sigaction = ctypes.cast(handler, ctypes.c_void_p).value
    act.sa_flags = 4                            # SA_SIGINFO (Linux)
    libc.sigaction.restype = ctypes.c_int
    libc.sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(SigAction), ctypes.c_void_p]
    return libc.sigaction(signal.SIGBUS, ctypes.byref(act), None) == 0


def install(what: str, guarded: str | os.PathLike | None = None) -> bool:
    """Make a SIGBUS one `Error:` line naming the mapped file the faulting address belongs to (`what`, the file
    this command guards, when the address cannot be placed, or lies in `guarded`, a file or directory, default
    `what`) and exit code 2. False when libc cannot be reached
    (then SIGBUS keeps its default: the process dies by it)."""
    import ctypes

    _state["line"] = (f"Error: {what} was truncated or replaced while memory-mapped (bus error reading it); "
                      f"keep the program's files unchanged while a command runs, and re-export or restore it"
                      ).encode()
    _state["what"] = os.fsencode(os.path.realpath(guarded if guarded is not None else what))
    _state["ctypes"] = ctypes
    try:
        from toolchain.native.build import kernel_cache

        _state["kernel_cache"] = os.fsencode(os.path.realpath(kernel_cache())) + b"/"
    except Exception:                           # noqa: BLE001 - no cache directory to name: the generic line
        _state["kernel_cache"] = b""
    if _state["handler"] is not None:
        return True
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    info_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    handler = info_type(_on_sigbus)
    try:
        ok = _sigaction(libc, handler)
    except AttributeError:
        ok = False
    if not ok:                                  # macOS, 32-bit: the plain handler and the installed line
        handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
        try:
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = [ctypes.c_int, handler_type]
        except AttributeError:
            return False
        handler = handler_type(_on_sigbus)
        libc.signal(signal.SIGBUS, handler)
    _state["siginfo"] = ok
    _state["handler"] = handler                 # kept alive for the process's lifetime
    return True


def installed() -> bool:
    return _state["handler"] is not None


def remove_on_fault(path) -> None:
    """Unlink `path` (e.g. the run's lock file) if the process ends by the handler."""
    _state["remove"].append(os.fsencode(path))


def guard_program(pdir) -> None:
    """`install` for a program directory: its weights file and its runtime's mapped files."""
    install(f"{pdir.weights_file} (or another file of {pdir.path})", guarded=pdir.path)


def set_note(note: str) -> None:
    """Text appended to the line (e.g. where the last checkpoint is)."""
    _state["note"] = (f"; {note}" if note else "").encode()
