"""SwiGLU gate of Qwen2's MLP: a = silu(g) * u.

Forward:  a = g * sigma(g) * u
Backward: du = da * silu(g),   dg = da * u * sigma(g) * (1 + g * (1 - sigma(g)))
Saved: g, u [T, f]. Recomputed: sigma(g) and silu(g) (elementwise), never stored.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["SwigluSaved", "SwigluGrads", "swiglu_forward", "swiglu_backward", "swiglu_train_reference"]


class SwigluSaved(NamedTuple):
    g: Tensor  # [T, f] gate projection output
    u: Tensor  # [T, f] up projection output


class SwigluGrads(NamedTuple):
    dg: Tensor  # [T, f]
    du: Tensor  # [T, f]


def swiglu_forward(g: Tensor, u: Tensor) -> tuple[Tensor, SwigluSaved]:
    return torch.nn.functional.silu(g) * u, SwigluSaved(g, u)


def swiglu_backward(da: Tensor, saved: SwigluSaved) -> SwigluGrads:
    g, u = saved
    sg = torch.sigmoid(g)                                            # [T, f] recomputed
    du = da * (g * sg)
    dg = da * u * sg * (1 + g * (1 - sg))
    return SwigluGrads(dg, du)


def swiglu_train_reference(g: Tensor, u: Tensor, da: Tensor) -> Tensor:
    """The definition of `toolchain::swiglu_train` (mesp/kernels.py; the native kernel in toolchain/native/
    kernels.cpp), what the `--compute int8` block's MLP backward calls per chunk: the recomputed a = silu(g) * u and
    the gradients for da, in one pass. Returns [3, *g.shape]: a, dg, du."""
    sw = swiglu_backward(da, SwigluSaved(g, u))
    return torch.stack([swiglu_forward(g, u)[0], sw.dg, sw.du])
