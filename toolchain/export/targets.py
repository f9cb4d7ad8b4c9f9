"""The one table of export targets: what each exports, whether it plans memory, whether this host can
run it. Exporters are imported lazily (each pulls in its own heavy library). Host runtimes live in
runtime/program_runtime.py, keyed by the names of the host-runnable targets here."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from toolchain.errors import BadInput
from toolchain.program.artifact import TargetArtifact
from toolchain.program.spec import ProgramSpec

__all__ = ["Target", "TARGETS", "target", "HOST_RUNNABLE"]


@dataclass(frozen=True)
class Target:
    name: str
    exporter: str          # "module:function", called as function(spec, out_dir, on_stage=...) -> TargetArtifact
    host_runnable: bool    # this (Linux) host can run it: `toolchain train --program`, `bench memory`
    description: str

    def export(self, spec: ProgramSpec, out_dir: Path, *, on_stage=None, **options) -> TargetArtifact:
        """`options`: this target's own knobs (executorch: xnnpack)."""
        module, fn = self.exporter.split(":")
        return getattr(importlib.import_module(module), fn)(spec, out_dir, on_stage=on_stage, **options)


_TABLE = (
    Target("executorch", "toolchain.export.executorch:export_executorch", True,
           "ExecuTorch .pte (Android, iOS); runs here on the ExecuTorch runtime's Python bindings"),
    Target("onnx", "toolchain.export.onnx:export_onnx", True,
           "ONNX graphs, one per method (ONNX Runtime on Android, iOS, desktop)"),
    Target("coreml", "toolchain.export.coreml:export_coreml", False,
           "Core ML .mlpackage per method (iOS 18+); predictions need macOS"),
)
TARGETS = tuple(t.name for t in _TABLE)
HOST_RUNNABLE = tuple(t.name for t in _TABLE if t.host_runnable)


def target(name: str) -> Target:
    for t in _TABLE:
        if t.name == name:
            return t
    raise BadInput(f"unknown target {name!r}; choose from {', '.join(TARGETS)}")
