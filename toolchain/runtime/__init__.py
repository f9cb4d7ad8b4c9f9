"""Host runners: run exported programs on their real runtimes, exactly as the apps do."""

from toolchain.runtime.eager_runner import EagerRunner
from toolchain.runtime.loop import LayerLoop
from toolchain.runtime.program_dir import ProgramDir
from toolchain.runtime.trainer import TrainResult, TrainRun, data_order, pad_example, run_program

__all__ = ["EagerRunner", "LayerLoop", "ProgramDir", "TrainRun", "TrainResult", "run_program", "pad_example",
           "data_order"]
