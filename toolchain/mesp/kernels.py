"""The native kernels' table: every kernel of toolchain/native/kernels.cpp written once, here.

A row is one C entry point `toolchain_<name>` (its ctypes signature) and, unless it is a C-only entry, the
ExecuTorch custom op `toolchain::<name>` with its out variant `toolchain::<name>.out` (the kernel the library
registers with `EXECUTORCH_LIBRARY`): its torch schema, its PyTorch reference (the op's definition: what eager
generation runs and what the kernel is tested against), its shape function for tracing, and the roles of the
fused generation methods that call it. Everything else is made from the table:

  - the ops' registration with PyTorch (`_register`, when `toolchain.mesp` is imported),
  - the C entry points' ctypes signatures (`load_native_kernels`, through `toolchain.native.load_kernels`),
  - the kernels a fused generation method lists in the manifest (`generation_ops`: program/spec.py
    `FUSED_KERNELS`),
  - tests/native/test_kernel_table.py, which checks that kernels.cpp's `EXECUTORCH_LIBRARY` lines and
    `extern "C"` entry points (names and C signatures) are exactly this table.

Adding a kernel is one row (a C-only entry, such as a function the tests or build.py call: a row with
`schema=None`), plus its C++ and, for an op, its reference.

Why the table is in mesp: a kernel's identity includes its reference and shape function, torch code that lives
beside the math it fuses (mesp/ops/quant.py, mesp/decode.py, mesp/decode_ops.py), while toolchain.native is a
bottom layer without torch (it builds and loads the library). So the table sits at the lowest layer that can
hold the references, and its users stay above it or take it as data: export/ (above mesp) imports it, and
native receives the C signatures as an argument (`load_kernels(signatures)`), never importing up.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from toolchain.mesp.decode import attention_with_cache
from toolchain.mesp.decode_ops import (lora_linear_a8_reference, lora_linear_a8_rows_reference, rms_norm_reference,
                                       rope_heads_reference, swiglu_reference)
from toolchain.mesp.ops.attention import attention_train_backward_reference, attention_train_reference
from toolchain.mesp.ops.ce_online import exp_sub_rows_reference, online_softmax_stats_reference
from toolchain.mesp.ops.lora_linear import lora_backward_reference, lora_rows_backward_reference
from toolchain.mesp.ops.quant import int4_dyw_a8_acc_reference, int4_dyw_a8_reference, int4_linear_a8_reference
from toolchain.mesp.ops.rmsnorm import rms_norm_backward_reference
from toolchain.mesp.ops.rope import rope_train_backward_reference, rope_train_reference
from toolchain.mesp.ops.swiglu import swiglu_train_reference
from toolchain.native import load_kernels

__all__ = ["Kernel", "KERNELS", "executorch_ops", "generation_ops", "c_signatures", "load_native_kernels"]

_PTR, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_BLOCKS = ("block_prefill", "block_decode")


@dataclass(frozen=True)
class Kernel:
    """One native kernel. `c_args` / `c_result`: the C entry's ctypes signature (every pointer a c_void_p).
    `schema`: the op's arguments in torch schema syntax (None: a C entry with no ExecuTorch op, and then no
    reference, shape function or methods). `methods`: roles of the fused generation methods that call the op
    (contract GENERATION_ROLES; the `_fused` variant of each)."""

    name: str
    c_args: tuple[type, ...]
    c_result: type = ctypes.c_int
    schema: str | None = None
    reference: Callable | None = None
    meta: Callable | None = None
    methods: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.schema is None) != (self.reference is None) or (self.schema is None) != (self.meta is None):
            raise ValueError(f"kernel {self.name}: an op needs schema, reference and meta together")
        if self.schema is None and self.methods:
            raise ValueError(f"kernel {self.name}: a C-only entry is called by no method")

    @property
    def entry(self) -> str:
        """The C entry point's symbol."""
        return f"toolchain_{self.name}"

    @property
    def op(self) -> str | None:
        """The ExecuTorch kernel's name, `toolchain::<name>.out` (None for a C-only entry)."""
        return None if self.schema is None else f"toolchain::{self.name}.out"


KERNELS: tuple[Kernel, ...] = (
    Kernel("int4_linear_a8", (_PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _PTR),
           schema="Tensor x, Tensor qweight, Tensor scales, int group",
           reference=int4_linear_a8_reference,
           meta=lambda x, qweight, scales, group: x.new_empty((*x.shape[:-1], qweight.shape[0])),
           methods=("head_logits",)),
    Kernel("attention_decode", (_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _PTR),
           schema="Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor pos, float scale",
           reference=attention_with_cache,
           meta=lambda q, k, v, k_cache, v_cache, pos, scale: q.new_empty((q.shape[1], q.shape[0] * q.shape[2])),
           methods=_BLOCKS),
    Kernel("rms_norm", (_PTR, _I64, _I64, _PTR, _F32, _PTR),
           schema="Tensor x, Tensor w, float eps",
           reference=rms_norm_reference,
           meta=lambda x, w, eps: torch.empty_like(x),
           methods=_BLOCKS + ("head_logits",)),
    Kernel("lora_linear_a8", (_PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _F32, _PTR,
                              _PTR),
           schema="Tensor x, Tensor qweight, Tensor scales, int group, Tensor? bias, Tensor? lora_a, "
                  "Tensor? lora_b, float lora_scale, Tensor? residual",
           reference=lora_linear_a8_reference,
           meta=lambda x, qweight, *rest: x.new_empty((x.shape[0], qweight.shape[0])),
           methods=_BLOCKS),
    Kernel("rope_heads", (_PTR, _I64, _I64, _I64, _I64, _F32, _PTR),
           schema="Tensor x, Tensor pos, int heads, float theta",
           reference=rope_heads_reference,
           meta=lambda x, pos, heads, theta: x.new_empty((heads, x.shape[0], x.shape[1] // heads)),
           methods=_BLOCKS),        # plain RoPE only: scaled RoPE runs as stock ops (mesp/decode.py)
    Kernel("swiglu", (_PTR, _PTR, _I64, _PTR),
           schema="Tensor g, Tensor u",
           reference=swiglu_reference,
           meta=lambda g, u: torch.empty_like(g),
           methods=_BLOCKS),
    # dX = dy W of an int4 W for training (`--compute int8`; no generation method calls it: training methods
    # list it through their program spec)
    Kernel("int4_dyw_a8", (_PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _PTR),   # dy, T, o, q, scales, i, ng,
           schema="Tensor dy, Tensor qweight, Tensor scales, int group",              # group, dx
           reference=int4_dyw_a8_reference,
           meta=lambda dy, qweight, scales, group: dy.new_empty((*dy.shape[:-1], 2 * qweight.shape[1]))),
    # acc + dy W[row0 : row0 + o] in one call (W's rows read in place; the kernel adds acc as it stores dX: the MLP
    # chunks' dn2 and da, the head's running sum)
    Kernel("int4_dyw_a8_acc", (_PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _PTR, _PTR),   # ..., group,
           schema="Tensor dy, Tensor qweight, Tensor scales, int group, int row0, Tensor? acc",    # row0, acc, dx
           reference=int4_dyw_a8_acc_reference,
           meta=lambda dy, qweight, scales, group, row0, acc: dy.new_empty((*dy.shape[:-1], 2 * qweight.shape[1]))),
    # an MLP chunk's gate / up product with its LoRA rows, W's and B's rows read in place (`--compute int8` training)
    Kernel("lora_linear_a8_rows", (_PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _I64, _F32,
                                   _PTR),   # x, T, i, q, scales, o, ng, group, row0, rows, a, b, r, s, y
           schema="Tensor x, Tensor qweight, Tensor scales, int group, int row0, int rows, Tensor? lora_a, "
                  "Tensor? lora_b, float lora_scale",
           reference=lora_linear_a8_rows_reference,
           meta=lambda x, qweight, scales, group, row0, rows, *rest: x.new_empty((x.shape[0], rows))),
    # causal attention of a whole training sequence and its gradients (`--compute int8` programs' training methods:
    # the float32 attention on the thread pool; mesp/block.py)
    Kernel("attention_train", (_PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _F32, _PTR),   # q, k, v, H, Hk, T, D, scale,
           schema="Tensor q, Tensor k, Tensor v, float scale",                            # out
           reference=attention_train_reference,
           meta=lambda q, k, v, scale: q.new_empty((q.shape[1], q.shape[0] * q.shape[2]))),
    Kernel("attention_train_backward", (_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _F32, _PTR),
           schema="Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, float scale",
           reference=attention_train_backward_reference,
           meta=lambda dout, q, k, v, o, scale: q.new_empty((q.shape[0] + 2 * k.shape[0], q.shape[1], q.shape[2]))),
    Kernel("swiglu_train", (_PTR, _PTR, _PTR, _I64, _PTR),                      # g, u, da, N, out [3, N]
           schema="Tensor g, Tensor u, Tensor da",
           reference=swiglu_train_reference,
           meta=lambda g, u, da: g.new_empty((3, *g.shape))),
    # the LM head chunk's online softmax (`--compute int8` head_loss; mesp/ops/ce_online.py)
    Kernel("online_softmax_stats", (_PTR, _PTR, _PTR, _I64, _I64, _PTR),         # z, m, s, C, V, out [C, 3]
           schema="Tensor z, Tensor m, Tensor s",
           reference=online_softmax_stats_reference,
           meta=lambda z, m, s: z.new_empty((z.shape[0], 3))),
    Kernel("exp_sub_rows", (_PTR, _PTR, _I64, _I64, _PTR),                       # z, m, C, V, out [C, V]
           schema="Tensor z, Tensor m",
           reference=exp_sub_rows_reference,
           meta=lambda z, m: torch.empty_like(z)),
    # a projection's LoRA backward and an MLP chunk's LoRA rows (`--compute int8` training methods;
    # mesp/ops/lora_linear.py, mesp/block.py)
    Kernel("lora_backward", (_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _F32, _PTR),  # dy, x, a, b, dx,
           schema="Tensor dy, Tensor x, Tensor a, Tensor b, float scale, Tensor dx",           # T, i, o, r, s, out
           reference=lora_backward_reference,
           meta=lambda dy, x, a, b, scale, dx: x.new_empty(((x.shape[0] + a.shape[0]) * x.shape[1]
                                                             + dy.shape[1] * a.shape[0],))),
    Kernel("lora_rows_backward", (_PTR, _PTR, _PTR, _I64, _I64, _I64, _F32, _PTR),   # dy, h, b, T, C, r, s, out
           schema="Tensor dy, Tensor h, Tensor b, float scale",
           reference=lora_rows_backward_reference,
           meta=lambda dy, h, b, scale: dy.new_empty((dy.shape[1] + dy.shape[0], h.shape[1]))),
    # the attention half's RoPE (forward; backward from the attention backward's stacked gradients) and the RMSNorm
    # backward with the sums around it (`--compute int8` training methods; mesp/block.py)
    Kernel("rope_train", (_PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR),                # x, cos, sin, T, n, D, out
           schema="Tensor x, Tensor cos, Tensor sin, int heads",
           reference=rope_train_reference,
           meta=lambda x, cos, sin, heads: x.new_empty((heads, x.shape[0], x.shape[1] // heads))),
    Kernel("rope_train_backward", (_PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR),  # dy, cos, sin, N, start,
           schema="Tensor dy, Tensor cos, Tensor sin, int start, int heads",          # T, n, D, out
           reference=rope_train_backward_reference,
           meta=lambda dy, cos, sin, start, heads: dy.new_empty((dy.shape[1], heads * dy.shape[2]))),
    Kernel("rms_norm_backward", (_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32, _PTR),  # x, w, dy, dy2, dy3,
           schema="Tensor x, Tensor w, float eps, Tensor dy, Tensor? dy2, Tensor? dy3, Tensor? residual",  # residual,
           reference=rms_norm_backward_reference,                                                    # T, d, eps, out
           meta=lambda x, w, eps, dy, dy2, dy3, residual: torch.empty_like(x)),
    # C-only entries: the kernel path chosen at load (docs/kernels.md), for tests, the timing line and the apps.
    Kernel("kernel_path", (), ctypes.c_char_p),            # generic, avx2, avx_vnni, avx512_vnni, neon, dotprod, i8mm
    Kernel("kernel_path_error", (), ctypes.c_char_p),      # why $TOOLCHAIN_KERNEL_PATH was refused, or NULL
    Kernel("select_kernel_path", (ctypes.c_char_p,)),      # force a path by name (tests): 0, or -2 if unavailable
    Kernel("kernel_threads", (), ctypes.c_int64),          # the thread pool's size the kernels split rows over
    Kernel("pool_units", (), ctypes.c_int64),              # units run over more than one thread since load
)


def executorch_ops() -> tuple[str, ...]:
    """The ExecuTorch kernels the library registers, `toolchain::<name>.out`, in table order (a runtime built
    with kernels.cpp has all of them)."""
    return tuple(k.op for k in KERNELS if k.op is not None)


def generation_ops() -> tuple[str, ...]:
    """The ops the fused generation methods call (rows with `methods`), in table order: what each fused
    generation method lists (program/spec.py `FUSED_KERNELS`). A training-only op (int4_dyw_a8, the *_train ones)
    is not among them, so generation programs and the runtimes that check their kernels do not depend on it."""
    return tuple(k.op for k in KERNELS if k.op is not None and k.methods)


def c_signatures() -> dict[str, tuple[type, tuple[type, ...]]]:
    """entry point -> (restype, argtypes), for `toolchain.native.load_kernels`."""
    return {k.entry: (k.c_result, k.c_args) for k in KERNELS}


def load_native_kernels() -> ctypes.CDLL:
    """The native library for this host, loaded (its ExecuTorch kernels registered) with every C entry point's
    signature set from the table.

    Raises:
        toolchain.native.KernelUnavailable: it cannot be built or loaded here.
    """
    return load_kernels(c_signatures())


def _register() -> torch.library.Library:
    """Each op and its out variant (what ExecuTorch's `to_executorch` calls, and what the native kernel
    implements), with the reference as their CPU implementation and the shape function for tracing."""
    lib = torch.library.Library("toolchain", "DEF")
    for k in KERNELS:
        if k.schema is None:
            continue
        lib.define(f"{k.name}({k.schema}) -> Tensor")
        lib.define(f"{k.name}.out({k.schema}, *, Tensor(a!) out) -> Tensor(a!)")

        def out_variant(*args, out, _reference=k.reference, **kwargs):
            out.copy_(_reference(*args, **kwargs))
            return out

        lib.impl(k.name, k.reference, "CompositeExplicitAutograd")
        lib.impl(f"{k.name}.out", out_variant, "CompositeExplicitAutograd")
        lib.impl(k.name, k.meta, "Meta")
    return lib


_LIBRARY = _register()   # kept alive: the registrations last as long as the library object
