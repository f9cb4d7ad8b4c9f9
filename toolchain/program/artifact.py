"""What a target exporter hands back to the pipeline (build.py) for the manifest.

Each target is a thin adapter (listed in export/targets.py) with the signature
    export_<target>(spec: ProgramSpec, out_dir, *, on_stage=None, ...) -> TargetArtifact
that writes its files under `out_dir` (the program directory being built) and exports every method of
`program.method_specs(spec)` with exactly those inputs and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TargetArtifact", "tree_bytes"]


@dataclass(frozen=True)
class TargetArtifact:
    target: str                            # executorch | onnx | coreml
    file: str                              # program file (or directory) relative to the program dir
    methods: dict[str, str] | None = None  # one file per method: method name -> relative path
    planned_arena_bytes: dict[str, int] = field(default_factory=dict)  # per method, where the target plans it
    delegate: str | None = None
    details: dict = field(default_factory=dict)  # extra manifest fields of this program (opset, ops, ...)


def tree_bytes(path: Path) -> int:
    """Size of a file, or of every file under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
