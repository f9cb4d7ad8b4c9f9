"""Checks every command gets before its body runs, derived from its declared options (so a new command or
option is covered without code of its own):

- outputs never overlap inputs or each other (`toolchain.outputs.check_no_overlap`): the inputs are the
  path options that must exist (`click.Path(exists=True)`), a `--model`/`--tokenizer` that names an
  existing directory, and `--db`; the outputs are the other path options (`--out`, `--json`,
  `--adapter-out`, `--telemetry-out`, ...) plus the files a command derives from them (`train`'s
  checkpoint beside its adapter or program).
- output files are regular files or new, in a writable directory (`toolchain.atomic.check_output_file`):
  `--json /dev/null` must not replace /dev/null, a FIFO must not block the command at its end (or
  forever), a read-only location is found before the work, not after it.
- inputs are not FIFOs, sockets, devices or symbolic link loops (`toolchain.inputs.check_input`), and
  outputs follow the one rule for symbolic links (`toolchain.outputs.output_target`).
- stdout must be open: a command started with stdout closed (`>&-`) would print its answer nowhere
  and exit 0.
"""

from __future__ import annotations

import functools
import io
import os
import sys
from pathlib import Path

import click

__all__ = ["guard_command", "paths_of"]

_NOT_OUTPUTS = {"cache_dir", "cells_path"}    # caches and inputs-or-outputs, compared by their commands
_PATH_STRINGS = {"model", "source"}           # str options that may name a directory (--model, --tokenizer)
_BOTH = {"db"}                                # read and written (telemetry --db)
_STREAMS = {"telemetry_out"}                  # appended to as the command goes (/dev/null, a terminal: fine)


def _option(param: click.Parameter) -> str:
    return param.opts[0] if param.opts else param.name


def check_output_files(ctx: click.Context) -> None:
    """Every file output option (`click.Path(dir_okay=False)` that need not exist) names a regular file or
    nothing yet, in a writable location (`toolchain.atomic.check_output_file`), before any work."""
    from toolchain.atomic import check_output_file

    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if (value is None or not isinstance(param.type, click.Path) or param.type.exists or param.type.dir_okay
                or param.name in _NOT_OUTPUTS | _BOTH):
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            check_output_file(Path(v), option=_option(param), streams=param.name in _STREAMS)


def check_inputs(inputs: list[tuple[str, Path]]) -> None:
    """No input path is a FIFO, a socket, a device or a symbolic link loop (`toolchain.inputs.check_input`): a
    FIFO would block the command until a writer comes, forever."""
    from toolchain.inputs import check_input

    for opt, p in inputs:
        if p.exists() or p.is_symlink():     # --db may be new
            check_input(p, what=f"{opt} {p}")


def check_output_links(ctx: click.Context, outputs: list[tuple[str, Path]]) -> None:
    """Every output path follows the one rule for symbolic links (`toolchain.outputs.output_target`): a loop, a
    link to an open descriptor, are refused before any work."""
    from toolchain.outputs import output_target

    streams = {_option(p) for p in ctx.command.params if p.name in _STREAMS}
    for opt, p in outputs:
        output_target(p, option=opt, streams=opt in streams)


def paths_of(ctx: click.Context) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """(outputs, inputs) of the command being invoked, as (option, path)."""
    outputs, inputs = [], []
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value == ():
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        opt = _option(param)
        if isinstance(param.type, click.Path):
            for v in values:
                p = Path(v)
                if param.name in _BOTH:
                    outputs.append((opt, p))
                    inputs.append((opt, p))
                elif param.type.exists:
                    inputs.append((opt, p))
                elif param.name not in _NOT_OUTPUTS:
                    outputs.append((opt, p))
        elif param.name in _PATH_STRINGS and isinstance(value, str) and os.path.isdir(value):
            inputs.append((opt, Path(value)))
    if ctx.command.name == "train":
        outputs.extend(_train_derived(ctx.params))
    return outputs, inputs


def _train_derived(params: dict) -> list[tuple[str, Path]]:
    from toolchain.training.checkpoint import checkpoint_path

    base = params.get("adapter_out") or params.get("program")
    return [] if base is None else [("checkpoint", checkpoint_path(Path(base)))]


def _stdout_closed() -> bool:
    out = sys.stdout
    if out is None or getattr(out, "closed", False):
        return True                           # Python started with fd 1 closed, or it was closed since
    try:
        fd = out.fileno()
    except io.UnsupportedOperation:
        return False                          # an in-memory stdout (click's CliRunner)
    except (ValueError, OSError, AttributeError):
        return True
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _check_stdout() -> None:
    from toolchain.errors import BadInput

    if _stdout_closed():
        raise BadInput("stdout is closed, so the result would be lost; run with stdout open "
                       "(redirect it to a file or to /dev/null)")


def guard_command(command: click.Command) -> None:
    """Run the checks above before `command`'s body."""
    body = command.callback
    if body is None or getattr(body, "_guarded", False):
        return

    @functools.wraps(body)
    def guarded(*args, **kwargs):
        from toolchain.outputs import check_no_overlap

        _check_stdout()
        ctx = click.get_current_context()
        outputs, inputs = paths_of(ctx)
        check_inputs(inputs)
        check_output_links(ctx, outputs)
        check_no_overlap(outputs, inputs)
        check_output_files(ctx)
        return body(*args, **kwargs)

    guarded._guarded = True
    command.callback = guarded
