"""How a method computes the same math: `Compute`, a description passed with the block's parameters
(`BlockParams.compute`) and to the functions that multiply by frozen weights, never a module-level switch.

  precision  "fp32" (the default, exact), "fp16": the frozen-weight matmuls in float16 (`--compute fp16`,
             the training methods; what that means is ops/half.py), or "int8": every int4 frozen-weight
             matmul of the step on int8 activations with exact integer sums (`--compute int8`; ops/quant.py):
             x W^T through `toolchain::int4_linear_a8`, dy W through `toolchain::int4_dyw_a8`
  int8_dx    with "int8": dX = dy W through `toolchain::int4_dyw_a8` too (the default); False keeps dX
             float32 over dequantized chunks (the forward, the recompute and the head's logits stay int8)
             With "int8" the block's causal attention (forward, recompute, gradients) is one float32 native op
             each, `toolchain::attention_train` / `attention_train_backward`, and the MLP chunks' SwiGLU
             `toolchain::swiglu` (forward) / `toolchain::swiglu_train` (recompute + gradients), the LoRA backward
             `toolchain::lora_backward` (per projection) / `lora_rows_backward` (per MLP chunk), the RMSNorms
             `toolchain::rms_norm` and their backwards `toolchain::rms_norm_backward`, and RoPE (without q/k norms)
             `toolchain::rope_train` / `rope_train_backward` (`train_kernels`; mesp/block.py, ops/lora_linear.py),
             the MLP chunks' gate / up rows in place (`toolchain::lora_linear_a8_rows`) and their dX sums
             accumulated by `toolchain::int4_dyw_a8_acc`: an int8 program needs the native kernels anyway, and
             they run on the thread pool
  fused      the fused generation methods: an int4 `x W^T` is one `toolchain::int4_linear_a8` call
             (ops/quant.py), the decode block and the head's norm call the native kernels' custom ops
             (mesp/decode.py; the ops are mesp/kernels.py's table)

The exporter (export/bodies.py) builds one per method: fp16 / int8 for the training methods of a `--compute fp16`
/ `--compute int8` program, fused for the generation methods whose spec lists kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["COMPUTE_CHOICES", "Compute", "FP32"]

COMPUTE_CHOICES = ("fp32", "fp16", "int8")   # `--compute`, the manifest's `compute`


@dataclass(frozen=True)
class Compute:
    """The frozen-weight matmuls' precision and whether the native kernels' custom ops replace stock graphs."""

    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    fused: bool = False
    int8_dx: bool = True

    def __post_init__(self) -> None:
        if self.precision not in COMPUTE_CHOICES:
            raise ValueError(f"unknown compute precision {self.precision!r}; choose {' or '.join(COMPUTE_CHOICES)}")

    @property
    def half(self) -> bool:
        return self.precision == "fp16"

    @property
    def int8(self) -> bool:
        """int4 x W^T products on int8 activations (`toolchain::int4_linear_a8`)."""
        return self.precision == "int8"

    @property
    def train_kernels(self) -> bool:
        """The training block's attention, SwiGLU, LoRA backward, RMSNorms and RoPE through the native float32 ops
        (`toolchain::attention_train`, `attention_train_backward`, `swiglu`, `swiglu_train`, `lora_backward`,
        `lora_rows_backward`, `rms_norm`, `rms_norm_backward`, `rope_train`, `rope_train_backward`: the math of
        ops/attention.py, ops/swiglu.py, ops/lora_linear.py, ops/rmsnorm.py, ops/rope.py; an int8 program needs the
        native kernels anyway)."""
        return self.precision == "int8"

    @property
    def int8_dyw(self) -> bool:
        """int4 dy W products on int8-rounded dy (`toolchain::int4_dyw_a8`)."""
        return self.precision == "int8" and self.int8_dx


FP32 = Compute()   # the stock float32 computation (every function's default)
