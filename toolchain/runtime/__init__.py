"""The host's program runtimes: run exported programs (read through `toolchain.program.ProgramDir`) on their real runtimes,
exactly as the apps do. The training run over them (row order, checkpoints, telemetry) is
`toolchain.training.program`; the session that opens a program once and trains, evaluates and generates on
it is `toolchain.training.session`."""

from toolchain.runtime.eager_runtime import EagerRuntime
from toolchain.runtime.loop import LayerLoop

__all__ = ["EagerRuntime", "LayerLoop"]
