"""`toolchain` command line. Each command lives in its own module and imports heavy libraries
(torch, executorch, ...) inside its body, so `toolchain -h` stays fast."""

from __future__ import annotations

import contextlib

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
    # which unwinds through whatever library code is running (torch.export once swallowed it and
    # finished the export, once segfaulted in interpreter shutdown). Stopping is as safe as a kill:
    # a training run resumes from its last checkpoint.
    import os
    import sys

    from toolchain.atomic import discard_pending

    discard_pending()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return super().invoke(ctx)
        except ToolchainError as e:
            raise UserError(str(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="toolchain")
def cli() -> None:
    """On-phone LoRA fine-tuning of Qwen2.5: exact MeSP training steps, LCSB plans, and programs
    for ExecuTorch, Core ML and ONNX that phones run to train."""


def _register() -> None:
    from toolchain.cli.bench import bench
    from toolchain.cli.demo import demo
    from toolchain.cli.export import export
    from toolchain.cli.grads import grads
    from toolchain.cli.plan import plan
    from toolchain.cli.telemetry import telemetry
    from toolchain.cli.train import train

    for command in (grads, demo, train, plan, bench, export, telemetry):
        cli.add_command(command)


_register()
