"""Training: the eager trainer (MeSP steps in PyTorch) and the program trainer (an exported program on
its runtime, as the apps run it), one run loop for both (loop.py): one row order (order.py), one
checkpoint format with verified resume (checkpoint.py), one result (result.py)."""

from toolchain.training.checkpoint import CHECKPOINT_SUFFIX, checkpoint_path
from toolchain.training.eager import EagerTrainer, RunState, evaluate, start_run, train, train_step
from toolchain.training.loop import Trainer, TrainRun
from toolchain.training.order import DataOrder, data_order
from toolchain.training.program import ProgramTrainer, host_run_info, pad_row, run_program
from toolchain.training.result import StepLog, RunOutcome

__all__ = ["RunState", "EagerTrainer", "start_run", "train_step", "train", "evaluate", "TrainRun",
           "ProgramTrainer", "run_program", "pad_row", "host_run_info", "Trainer", "DataOrder", "data_order",
           "StepLog", "RunOutcome", "CHECKPOINT_SUFFIX", "checkpoint_path"]
