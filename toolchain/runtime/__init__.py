"""Host runners: run exported programs on their real runtimes, exactly as the apps do."""

from toolchain.runtime.program_dir import ProgramDir
from toolchain.runtime.executorch_runner import run_executorch_step
from toolchain.runtime.trainer import TrainResult, TrainRun, data_order, pad_example, run_program

__all__ = ["run_executorch_step", "ProgramDir", "TrainRun", "TrainResult", "run_program", "pad_example", "data_order"]
