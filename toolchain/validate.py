"""One validation layer for what users and phones hand us: every input file, JSON document, number
option and telemetry event goes through it, so a bad input is one `BadInput` naming the problem (the
CLI's `Error: ...` line, the server's 4xx) and never a traceback, a 500 or a silently wrong run.

- Text files are UTF-8 (`read_text`); the error names the line and byte of the first bad byte.
- JSON is strict (`loads`): no NaN/Infinity, no number that overflows a float (`1e400`), no integer
  outside int64 (what SQLite and the runtimes store), no lone surrogate in a string (not encodable as
  UTF-8), at most `MAX_JSON_DEPTH` levels of nesting. JSON we write is `allow_nan=False` (`dumps`).
- Numbers given on the command line are finite (`FiniteFloat`) and within bounds stated in the error,
  derived from the model (`check_rank`, `check_seq_len`) or fixed here (`MAX_STEPS`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from toolchain.errors import BadInput, FieldError

__all__ = ["InvalidJson", "MAX_JSON_DEPTH", "MAX_INT", "MIN_INT", "MAX_STEPS", "MAX_SEED", "MAX_THREADS", "read_text", "decode_utf8", "loads",
           "check_json", "read_json", "dumps", "finite", "FiniteFloat", "SEED", "STEPS", "THREADS", "check_rank",
           "max_rank", "check_seq_len"]

MAX_JSON_DEPTH = 64          # our documents nest at most ~6 levels; the limit keeps recursion far away
MAX_INT = 2**63 - 1          # int64: SQLite INTEGER, the runtimes' int64 tensors
MIN_INT = -(2**63)
MAX_STEPS = 1_000_000        # the data order of a run is planned up front (one entry per step)
MAX_SEED = 2**63 - 1
MAX_THREADS = 256            # runtime thread pools: far above any phone's or host's useful count (ExecuTorch
                             # aborted creating 10^9); the one bound of every --threads


# ------------------------------------------------------------------------------------------------ text

def decode_utf8(data: bytes, where: str) -> str:
    """`data` as UTF-8 text, or BadInput naming the line and byte of the first undecodable byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BadInput(f"{where} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, offset {e.start}); "
                       f"save it as UTF-8") from None


def read_text(path: Path, *, what: str | None = None) -> str:
    """A UTF-8 text file. `what` names it in errors (default: the path).

    Raises:
        BadInput: missing, a directory, a FIFO / socket / device / link loop (toolchain.inputs), unreadable, or
            not UTF-8.
    """
    from toolchain.inputs import read_input

    path = Path(path)
    where = what or str(path)
    return decode_utf8(read_input(path, what=where), where)


# ------------------------------------------------------------------------------------------------ JSON

class InvalidJson(BadInput):
    """A JSON document `loads`/`check_json` refuse; `reason` is the message without the `where` prefix."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


class _Invalid(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _Invalid(f"{name} is not valid JSON (write a missing or non-finite number as null)")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Invalid(f"number {text[:40]} is out of range")
    return value


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise _Invalid(f"integer {text[:40]}{'...' if len(text) > 40 else ''} is out of range (at most 2^63 - 1)")
    value = int(text)
    if not MIN_INT <= value <= MAX_INT:
        raise _Invalid(f"integer {text} is out of range (at most 2^63 - 1)")
    return value


def _check_string(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise _Invalid(f"string {s[:40]!r} holds a lone surrogate (not encodable as UTF-8)") from None


def check_json(doc: Any, where: str = "document", *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """A parsed (or about to be written) JSON value: finite floats, int64 integers, UTF-8-encodable
    strings, at most `max_depth` levels of nesting. Iterative (no recursion limit to hit).

    Raises:
        BadInput: the first violation, with `where`.
    """
    stack: list[tuple[Any, int]] = [(doc, 1)]
    try:
        while stack:
            value, depth = stack.pop()
            if isinstance(value, str):
                _check_string(value)
            elif isinstance(value, bool) or value is None:
                continue
            elif isinstance(value, int):
                if not MIN_INT <= value <= MAX_INT:
                    raise _Invalid(f"integer {str(value)[:40]} is out of range (at most 2^63 - 1)")
            elif isinstance(value, float):
                if not math.isfinite(value):
                    raise _Invalid(f"{value} is not a finite number")
            elif isinstance(value, (dict, list, tuple)):
                if depth > max_depth:
                    raise _Invalid(f"nested too deeply (more than {max_depth} levels)")
                if isinstance(value, dict):
                    for k, v in value.items():
                        if isinstance(k, str):
                            _check_string(k)
                        stack.append((v, depth + 1))
                else:
                    stack.extend((v, depth + 1) for v in value)
    except _Invalid as e:
        raise InvalidJson(where, str(e)) from None


def loads(text: str | bytes, where: str = "document", *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON (see the module docstring). Bytes must be UTF-8.

    Raises:
        BadInput: not UTF-8, not JSON, or a value `check_json` refuses; the message starts with `where`.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidJson(where, f"not UTF-8 (byte 0x{text[e.start]:02x} at offset {e.start})") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int)
    except RecursionError:
        raise InvalidJson(where, f"nested too deeply (more than {max_depth} levels)") from None
    except json.JSONDecodeError as e:
        raise InvalidJson(where, f"not valid JSON ({e.msg}, line {e.lineno} column {e.colno})") from None
    except ValueError as e:   # _Invalid, and Python's own limits (e.g. int digits)
        raise InvalidJson(where, str(e)) from None
    check_json(doc, where, max_depth=max_depth)
    return doc


def read_json(path: Path, *, what: str | None = None) -> Any:
    """A strict JSON file (UTF-8). Raises BadInput naming the file."""
    where = what or str(path)
    return loads(read_text(path, what=where), where)


def dumps(doc: Any, *, where: str = "document", **kwargs) -> str:
    """json.dumps that never writes NaN/Infinity (not JSON): BadInput instead."""
    try:
        return json.dumps(doc, allow_nan=False, **kwargs)
    except ValueError as e:
        raise BadInput(f"refusing to write {where}: it holds a non-finite number ({e})") from None


# ------------------------------------------------------------------------------------------------ numbers

def finite(value: float, name: str) -> float:
    """`value` as a float, or BadInput when it is NaN or infinite."""
    value = float(value)
    if not math.isfinite(value):
        raise BadInput(f"{name} must be a finite number, got {value}")
    return value


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses nan, inf and -inf (FloatRange lets NaN through any bound)."""

    name = "float"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


SEED = click.IntRange(0, MAX_SEED)
THREADS = click.IntRange(1, MAX_THREADS)
STEPS = click.IntRange(1, MAX_STEPS)


def max_rank(arch, targets) -> int | None:
    """The largest meaningful LoRA rank: min(in, out) over the targeted projections (None: no known target;
    unknown target names are left to the LoRA config's own check)."""
    dims = []
    for t in targets:
        try:
            dims.append(min(arch.linear_shape(t)))
        except (KeyError, ValueError):
            continue
    return min(dims) if dims else None


def check_rank(rank: int, arch, targets) -> None:
    """Raises FieldError (field `rank`) when `rank` exceeds min(in, out) of a targeted projection of `arch`."""
    limit = max_rank(arch, targets)
    if limit is not None and rank > limit:
        raise FieldError("rank", f"{rank} is larger than this model allows: at most {limit} "
                                 f"(min(in, out) of the targeted projections {', '.join(targets)})")


def check_seq_len(seq_len: int, arch) -> None:
    """Raises FieldError (field `seq_len`) when `seq_len` exceeds the model's positions (max_position_embeddings)."""
    if seq_len > arch.max_positions:
        raise FieldError("seq_len", f"{seq_len} is longer than the model's {arch.max_positions} positions "
                                    f"(max_position_embeddings)")
