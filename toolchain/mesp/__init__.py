"""MeSP: memory-efficient structured backpropagation with hand-derived LoRA backward passes."""

from toolchain.mesp import kernels as _kernels  # noqa: F401  (registers the native kernels' ops with PyTorch)
from toolchain.mesp.block import BlockParams, block_backward, block_forward
from toolchain.mesp.step import StepOptions, StepResult, block_params, chunk_overrides, mesp_step, model_loss

__all__ = ["BlockParams", "block_backward", "block_forward", "StepOptions", "chunk_overrides", "StepResult",
           "block_params", "mesp_step", "model_loss"]
