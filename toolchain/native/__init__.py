"""Native kernels the programs can call (C++ beside this file), built for this host on first use.

`kernels.cpp`, the fused generation methods' kernels: `toolchain::int4_linear_a8.out`, group-wise int4
weights read in place from the weights file times int8-rounded activations (decode, prefill chunks and
the LM head of int4 generation), `toolchain::attention_decode.out`, softmax attention of a chunk of
tokens over the KV cache, and the small ops of a decode block; the whole list, with each kernel's
schema, reference and C signature, is the table in toolchain/mesp/kernels.py. The apps compile the same
file for arm64 (docs/export.md, "the generation kernel")."""

from toolchain.native.build import KERNEL_SOURCE, KernelUnavailable, kernel_library, kernel_path, load_kernels

__all__ = ["KERNEL_SOURCE", "KernelUnavailable", "kernel_library", "kernel_path", "load_kernels"]
