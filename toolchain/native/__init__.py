"""Native kernels the programs can call (C++ beside this file), built for this host on first use.

`int4_linear.cpp`: `toolchain::int4_linear.out`, group-wise int4 x float matmul read in place from the
weights file (decode, prefill chunks and the LM head of int4 generation). The apps compile the same file
for arm64 (docs/export.md, "the generation kernel")."""

from toolchain.native.build import KERNEL_OPS, KERNEL_SOURCE, KernelUnavailable, kernel_library, load_kernels

__all__ = ["KERNEL_OPS", "KERNEL_SOURCE", "KernelUnavailable", "kernel_library", "load_kernels"]
