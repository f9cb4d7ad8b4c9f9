"""Errors a user can fix. The CLI turns each into one `Error: ...` line and exit code 2.

Anything that is not a `ToolchainError` is a bug: it surfaces as a traceback and exit code 1.
Messages are one line naming the problem and the way out.
"""

from __future__ import annotations

__all__ = ["ToolchainError", "BadInput", "FieldError", "ShapeMismatch", "MissingWeights", "SchemaError", "OutputExists",
           "OutputNotWritable"]


class ToolchainError(Exception):
    """Base class of every error caused by the user's input rather than by a bug."""


class BadInput(ToolchainError):
    """A value, file or option the user gave is invalid (unknown preset, bad token id, ...)."""


class FieldError(BadInput):
    """A bad value of one config field, the message naming the field (`rank 9999 is larger than ...`); the CLI
    names the option instead (`--rank 9999 ...`: `cli.options.FIELD_OPTIONS`)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field} {detail}")
        self.field, self.detail = field, detail

    def named(self, name: str) -> str:
        """The message with the field called `name` (the command-line option that sets it)."""
        return f"{name} {self.detail}"


class ShapeMismatch(ToolchainError):
    """Tensors the user supplied (checkpoint, adapter) do not fit the model's architecture."""


class MissingWeights(ToolchainError):
    """Real weights were asked for but are not on this machine."""


class SchemaError(ToolchainError):
    """A JSON document does not follow its schema in shared_schemas/."""


class OutputExists(BadInput):
    """An output location already holds the user's files (replaced only with --force)."""


class OutputNotWritable(BadInput):
    """An output location cannot be written (read-only, no permission, not enough free space)."""
