"""The XNNPACK generation variant's int4 linear: int8 dynamically quantized activations x int4 weights
(what ExecuTorch's `export_llama -qmode 8da4w` computes), written with PyTorch's `quantized_decomposed` ops,
the pattern XNNPACK's partitioner turns into one qd8 x qb4w fully-connected delegate.

  x: each row quantized to int8 with its own scale and zero point (asymmetric, `choose_qparams_per_token_asymmetric`)
     and dequantized again; W: the program's int4 values q in [-8, 7] (unpacked to int8 [o, i]) times the group
     scales rounded to bfloat16 (XNNPACK stores blockwise scales as bfloat16:
     executorch/backends/xnnpack/operators/node_visitor.py); y = linear(x_dq, W_dq).

Run eagerly, the same ops are the reference the XNNPACK kernels are compared with (tests/export/
test_xnnpack_generation.py): same quantized values, only the summation order and float rounding differ.
The weight must be a constant of the exported method (`Int4Constant` built from module buffers): XNNPACK packs
constant weights once, at load, into its own (anonymous) memory; it has no int4 kernel for runtime weights.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Int4Constant", "int4_constant", "unpack_int4", "linear_8da4w"]


class Int4Constant(NamedTuple):
    """One int4 matrix as the XNNPACK variant holds it: q int8 [o, i] in [-8, 7], scale float32 [o, i/G] (values
    bfloat16-exact), zero float32 zeros [o, i/G] (the weights are symmetric; a buffer, not a traced `zeros`, so
    the partitioner sees a constant)."""

    q: Tensor
    scale: Tensor
    zero: Tensor


def unpack_int4(packed: Tensor) -> Tensor:
    """uint8 [o, i/2] nibbles (mesp/ops/quant.py layout: high nibble = even column, stored q + 8) -> int8 [o, i]."""
    hi = torch.div(packed, 16, rounding_mode="floor").to(torch.int16) - 8
    lo = (packed & 15).to(torch.int16) - 8
    return torch.stack([hi, lo], dim=-1).reshape(packed.shape[0], -1).to(torch.int8)


def int4_constant(packed: Tensor, scale: Tensor) -> Int4Constant:
    """The stored int4 matrix (packed nibbles, float32 group scales) as an `Int4Constant` (copies)."""
    s = scale.to(torch.bfloat16).to(torch.float32).contiguous()
    return Int4Constant(unpack_int4(packed).contiguous(), s, torch.zeros_like(s))


def linear_8da4w(x: Tensor, w: Int4Constant) -> Tensor:
    """x [T, i] W^T with x quantized per row to int8 (asymmetric) and W int4 per group: [T, o] float32."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed::*)

    ops = torch.ops.quantized_decomposed
    group = w.q.shape[1] // w.scale.shape[1]
    s, zp = ops.choose_qparams_per_token_asymmetric(x, torch.int8)
    xq = ops.quantize_per_token(x, s, zp, -128, 127, torch.int8)
    xd = ops.dequantize_per_token(xq, s, zp, -128, 127, torch.int8, torch.float32)
    wd = ops.dequantize_per_channel_group(w.q, w.scale, w.zero, -8, 7, torch.int8, group, torch.float32)
    return F.linear(xd, wd)
