"""`toolchain` command line. Each command lives in its own module and imports heavy libraries
(torch, executorch, ...) inside its body, so `toolchain -h` stays fast."""

from __future__ import annotations

import contextlib
import errno
import os
import resource  # here, not where memory ran out: importing it then fails too

import click

from toolchain import __version__
from toolchain.errors import FieldError, ToolchainError

__all__ = ["cli", "UserError"]


class UserError(click.ClickException):
    """A ToolchainError at the command boundary: one `Error: ...` line on stderr, exit code 2."""

    exit_code = 2


def _exit_on_sigterm(signum, _frame) -> None:
    # Python's default SIGTERM ends the process at once and leaves the temporary outputs of an export
    # or a checkpoint behind. Delete them (`toolchain.atomic`), then exit at once: not by raising,
    # which unwinds through whatever library code is running (torch.export can swallow the exception
    # and finish the export, or crash in interpreter shutdown). Stopping is as safe as a kill:
    # a training run resumes from its last checkpoint.
    import os
    import sys

    from toolchain.atomic import discard_pending

    discard_pending()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)


# OSErrors that come from the machine, not from a bug: reported as one line (with the file) and exit 2.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                       errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.EMFILE, errno.ENFILE,
                       errno.EIO, errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.ENOTEMPTY, errno.EXDEV, errno.EFBIG,
                       errno.ENXIO, errno.ENOMEM}
_HINTS = {errno.ENOSPC: "free some space or choose another output location",
          errno.EDQUOT: "free some space or choose another output location",
          errno.EROFS: "choose an output location on a writable file system",
          errno.EACCES: "check the permissions or choose another location",
          errno.EFBIG: "the file size limit (ulimit -f) or the file system's maximum file size was reached; raise "
                       "it or choose another output location",
          errno.ENOMEM: "not enough memory; close other programs or raise the limit (ulimit -v)"}

# Third-party loggers muted (to ERROR) unless --verbose / TOOLCHAIN_VERBOSE=1 (which click reads for --verbose;
# the commands that open a runtime pass the flag on: cli/options.py `verbose_requested`).
_NOISY_LOGGERS = ("torch", "torchao", "executorch", "coremltools", "onnxscript", "onnx", "onnxruntime",
                  "transformers", "peft", "huggingface_hub", "matplotlib", "PIL")


def _quiet_third_party() -> None:
    """Silence other libraries' warnings and log lines at the command boundary, so that an answer, or an
    error, is what a command prints first. torch's loggers are reset when torch is imported, hence
    TORCH_LOGS; ExecuTorch's native cpuinfo lines are routed in runtime/executorch_runtime.py."""
    import logging
    import sys
    import warnings

    os.environ.setdefault("TORCH_LOGS", "-torch")          # torch's own loggers at ERROR (see torch._logging)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # c10 (C++) log lines
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"toolchain(\.|$)")
    for name in _NOISY_LOGGERS:
        if name != "torch" or "torch" in sys.modules:
            logging.getLogger(name).setLevel(logging.ERROR)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's last flush of a broken stdout is not a second error."""
    import sys

    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _flush_stdout() -> None:
    """Flush stdout inside the command, so that a reader gone away (EPIPE) is reported as an error, not met by
    the interpreter's final flush after an exit code 0."""
    import io
    import sys

    if sys.stdout is not None:
        with contextlib.suppress(io.UnsupportedOperation, ValueError):
            sys.stdout.flush()


_OUT_OF_MEMORY = ("out of memory; close other programs, raise the memory limit (ulimit -v) or use a smaller model, "
                  "--seq-len or --rank")
_ALLOCATION_FAILED = ("can't allocate memory", "cannot allocate memory", "std::bad_alloc", "out of memory",
                      "failed to map segment")


def _address_limit() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return "" if soft == resource.RLIM_INFINITY else f" (this process may map at most {soft / 2**20:.0f} MiB: ulimit -v)"


def _out_of_memory(e: BaseException) -> bool:
    """Whether `e` is how an allocation failure surfaced: MemoryError; torch's "can't allocate memory"
    RuntimeError; a shared library that could not be mapped; or a SystemError ("error return without
    exception set": a C extension's failed allocation during an import) under an address-space limit."""
    if isinstance(e, MemoryError) or isinstance(e.__cause__ or e.__context__, MemoryError):
        return True
    text = str(e).lower()
    if any(s in text for s in _ALLOCATION_FAILED):
        return True
    return isinstance(e, SystemError) and resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


def _exit_out_of_memory() -> None:
    """Report and leave at once: unwinding further, and other libraries' exit handlers (torch's atexit
    logging), would fail allocating too and print tracebacks after the error line. In process (click's
    CliRunner: stderr is no file) it is an ordinary UserError instead."""
    import io
    import sys

    from toolchain.atomic import discard_pending

    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        raise UserError(_OUT_OF_MEMORY + _address_limit()) from None
    discard_pending()
    with contextlib.suppress(Exception):
        os.write(fd, f"Error: {_OUT_OF_MEMORY}{_address_limit()}\n".encode())
    os._exit(UserError.exit_code)


def _os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    hint = _HINTS.get(e.errno)
    return f"{where}{e.strerror or e}" + (f"; {hint}" if hint else "")


class _Group(click.Group):
    def main(self, *args, **kwargs):
        """click's whole run (parsing and its own error reporting too, not only `invoke`): an allocation that
        fails there is the same one `Error:` line."""
        try:
            return super().main(*args, **kwargs)
        except (MemoryError, SystemError) as e:
            if not _out_of_memory(e):
                raise
            _exit_out_of_memory()

    def invoke(self, ctx: click.Context):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            result = super().invoke(ctx)
            _flush_stdout()
            return result
        except FieldError as e:              # the library names the field, the command line the option
            from toolchain.cli.options import FIELD_OPTIONS

            raise UserError(e.named(FIELD_OPTIONS.get(e.field, e.field))) from None
        except ToolchainError as e:
            raise UserError(str(e)) from None
        except BrokenPipeError:              # stdout's reader went away (`toolchain tokenize f | head -c 10`)
            _silence_stdout()
            raise UserError("stdout was closed by its reader (broken pipe) before the output was complete") \
                from None
        except RecursionError:               # JSON parsed outside toolchain.validate (before RuntimeError, its base)
            raise UserError("an input is nested too deeply to read") from None
        except (MemoryError, SystemError, RuntimeError, ImportError) as e:
            if not _out_of_memory(e):
                raise
            _exit_out_of_memory()
        except OSError as e:
            if e.errno not in _ENVIRONMENT_ERRNOS:
                raise
            raise UserError(_os_error(e)) from None
        except UnicodeDecodeError as e:      # a file read outside toolchain.validate (e.g. a checkpoint's config)
            raise UserError(f"an input file is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") \
                from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="toolchain")
@click.option("--verbose", is_flag=True, envvar="TOOLCHAIN_VERBOSE",
              help="Show other libraries' warnings and log lines (torch, torchao, ExecuTorch's native "
                   "cpuinfo lines, ...), hidden by default.  [env: TOOLCHAIN_VERBOSE=1]")
def cli(verbose: bool) -> None:
    """On-phone LoRA fine-tuning of Qwen2.5: exact MeSP training steps, LCSB plans, and programs
    for ExecuTorch, Core ML and ONNX that phones run to train."""
    if not verbose:
        _quiet_third_party()


def _register() -> None:
    from toolchain.cli.bench import bench
    from toolchain.cli.data import data
    from toolchain.cli.demo import demo
    from toolchain.cli.eval import eval_command
    from toolchain.cli.export import export
    from toolchain.cli.generate import generate_command
    from toolchain.cli.grads import grads
    from toolchain.cli.guard import guard_command
    from toolchain.cli.plan import plan
    from toolchain.cli.telemetry import telemetry
    from toolchain.cli.tokenize import tokenize
    from toolchain.cli.train import train

    def guard(command: click.Command) -> None:
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                guard(sub)
        else:
            guard_command(command)

    for command in (grads, demo, train, plan, bench, export, telemetry, tokenize, data, eval_command,
                    generate_command):
        guard(command)
        cli.add_command(command)


_register()
