"""A memory-mapped file that shrinks under a running process: one `Error:` line instead of death by SIGBUS.

The weights file (and ExecuTorch's view of the .pte) is memory-mapped; when another process truncates
it, the next read of a page past the new end raises SIGBUS in whatever native code touches it (a
kernel's loads, a memcpy). What can be done about it, and what this module does:

- Python's `signal` module cannot handle it: its C handler only sets a flag and returns, the faulting
  load runs again and faults again, forever (and `faulthandler` prints a traceback, then dies by the
  signal). Unwinding out of the faulting native frame is not possible either.
- So `install()` puts a handler on SIGBUS through libc `signal()` (ctypes) that writes one prepared
  line to stderr and `_exit(2)`s at once, in the faulting thread: no unwinding, no cleanup, no
  checkpoint written from the handler (the state may be mid-update, and serializing is not async-signal
  safe). The line names the file and, when a training run set it (`set_note`), the last checkpoint,
  which is whole: checkpoints are written atomically, so a SIGBUS during one leaves the previous file
  (its temporary is removed by the next run on that path, `toolchain.atomic.sweep_stale`).
- The step boundary is where a clean stop is possible: the training loop asks `Trainer.inputs_changed`
  (for a program: `ProgramDir.weights_changed`, size / inode / mtime of the weights file) before every
  step, and on a change saves the checkpoint of the last completed step and stops with one error. That
  checkpoint is exact when the file was truncated or replaced by a rename (a completed step read only
  pages that were still there, or the old inode); if the bytes were rewritten in place during the step,
  the step may have read a mix of old and new weights, which nothing on the host can detect.

Guaranteed: exit code 2 and one line, whichever thread faults, on Linux and macOS (CPython's ctypes
callback takes the GIL, or the thread already holds it). Not guaranteed: a fault while the faulting
thread holds a lock the handler needs (malloc's, in the interpreter's allocation of the callback frame)
would hang instead of exit; none of the mapped reads happens inside the allocator.
"""

from __future__ import annotations

import os
import signal

__all__ = ["install", "set_note", "installed", "remove_on_fault", "guard_program"]

_state: dict[str, object] = {"handler": None, "line": b"", "note": b"", "remove": []}


def _on_sigbus(_signum: int) -> None:          # runs in the faulting thread, never returns
    if _state.get("fired"):                    # another thread faulted too (torch's threads read in parallel):
        while True:                            # the first one is writing the line and exiting the process
            os.sched_yield()
    _state["fired"] = True                     # (under the GIL: the test and the set are one step)
    for path in _state["remove"]:
        try:
            os.unlink(path)                    # async-signal-safe
        except OSError:
            pass
    os.write(2, _state["line"] + _state["note"] + b"\n")
    os._exit(2)


def install(what: str) -> bool:
    """Make a SIGBUS one `Error:` line about `what` (the mapped file) and exit code 2. False when libc's
    `signal()` cannot be reached (then SIGBUS keeps its default: the process dies by it)."""
    import ctypes

    _state["line"] = (f"Error: {what} was truncated or replaced while memory-mapped (bus error reading it); "
                      f"keep the program's files unchanged while a command runs, and re-export or restore it"
                      ).encode()
    if _state["handler"] is not None:
        return True
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
    try:
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, handler_type]
    except (OSError, AttributeError):
        return False
    handler = handler_type(_on_sigbus)
    libc.signal(signal.SIGBUS, handler)
    _state["handler"] = handler                 # kept alive for the process's lifetime
    return True


def installed() -> bool:
    return _state["handler"] is not None


def remove_on_fault(path) -> None:
    """Unlink `path` (e.g. the run's lock file) if the process ends by the handler."""
    _state["remove"].append(os.fsencode(path))


def guard_program(pdir) -> None:
    """`install` for a program directory: its weights file and its runtime's mapped files."""
    install(f"{pdir.weights_file} (or another file of {pdir.path})")


def set_note(note: str) -> None:
    """Text appended to the line (e.g. where the last checkpoint is)."""
    _state["note"] = (f"; {note}" if note else "").encode()
