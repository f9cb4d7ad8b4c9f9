"""`toolchain` command line. Each command lives in its own module and imports heavy libraries
(torch, executorch, ...) inside its body, so `toolchain -h` stays fast."""

from __future__ import annotations

import contextlib
import errno
import os

import click

from toolchain import __version__
from toolchain.errors import ToolchainError

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
                       errno.EIO, errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.ENOTEMPTY, errno.EXDEV}
_HINTS = {errno.ENOSPC: "free some space or choose another output location",
          errno.EDQUOT: "free some space or choose another output location",
          errno.EROFS: "choose an output location on a writable file system",
          errno.EACCES: "check the permissions or choose another location"}

# Third-party loggers muted (to ERROR) unless --verbose / TOOLCHAIN_VERBOSE=1.
_NOISY_LOGGERS = ("torch", "torchao", "executorch", "coremltools", "onnxscript", "onnx", "onnxruntime",
                  "transformers", "peft", "huggingface_hub", "matplotlib", "PIL")


def verbose() -> bool:
    return os.environ.get("TOOLCHAIN_VERBOSE", "") not in ("", "0")


def _quiet_third_party() -> None:
    """Silence other libraries' warnings and log lines at the command boundary, so that an answer, or an
    error, is what a command prints first. torch's loggers are reset when torch is imported, hence
    TORCH_LOGS; ExecuTorch's native cpuinfo lines are routed in runtime/executorch_runner.py."""
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


def _os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    hint = _HINTS.get(e.errno)
    return f"{where}{e.strerror or e}" + (f"; {hint}" if hint else "")


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        import signal
        import threading

        from toolchain.atomic import output_scope

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            with output_scope():     # --force permissions last one command
                return super().invoke(ctx)
        except ToolchainError as e:
            raise UserError(str(e)) from None
        except OSError as e:
            if e.errno not in _ENVIRONMENT_ERRNOS:
                raise
            raise UserError(_os_error(e)) from None
        except UnicodeDecodeError as e:      # a file read outside toolchain.validate (e.g. a checkpoint's config)
            raise UserError(f"an input file is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") \
                from None
        except RecursionError:               # JSON parsed outside toolchain.validate
            raise UserError("an input is nested too deeply to read") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="toolchain")
@click.option("--verbose", is_flag=True, envvar="TOOLCHAIN_VERBOSE",
              help="Show other libraries' warnings and log lines (torch, torchao, ExecuTorch's native "
                   "cpuinfo lines, ...), hidden by default.  [env: TOOLCHAIN_VERBOSE=1]")
def cli(verbose: bool) -> None:
    """On-phone LoRA fine-tuning of Qwen2.5: exact MeSP training steps, LCSB plans, and programs
    for ExecuTorch, Core ML and ONNX that phones run to train."""
    if verbose:
        os.environ["TOOLCHAIN_VERBOSE"] = "1"      # read by the runtime (native log lines)
    else:
        os.environ.pop("TOOLCHAIN_VERBOSE", None)
        _quiet_third_party()


def _register() -> None:
    from toolchain.cli.bench import bench
    from toolchain.cli.data import data
    from toolchain.cli.demo import demo
    from toolchain.cli.eval import eval_command
    from toolchain.cli.export import export
    from toolchain.cli.generate import generate_command
    from toolchain.cli.grads import grads
    from toolchain.cli.plan import plan
    from toolchain.cli.telemetry import telemetry
    from toolchain.cli.tokenize import tokenize
    from toolchain.cli.train import train

    for command in (grads, demo, train, plan, bench, export, telemetry, tokenize, data, eval_command,
                    generate_command):
        cli.add_command(command)


_register()
