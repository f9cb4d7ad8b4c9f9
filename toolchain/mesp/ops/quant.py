"""Group-wise quantized frozen weights, dequantized inside the step right where they are used.

int8: q = round(w / s) in [-127, 127], one scale s = max|w| / 127 per group of G input columns.
int4: q = round(w / s) in [-8, 7],     s = max|w| / 7, stored as (q + 8) nibbles, two per uint8,
      interleaved: byte j of a row holds column 2j (high nibble) and column 2j + 1 (low nibble),
      the layout of ExecuTorch's `quantized_decomposed::embedding_4bit` kernel
      (kernels/quantized/cpu/embeddingxb.cpp), which dequantizes a chunk of rows in one pass. The
      ExecuTorch methods are traced with that op (their weights are `QuantWeight(executorch=True)`,
      export/bodies.py `method_module(executorch=True)`): 3.9x faster than the
      unpacking below for a [4864, 896] matvec (8.0 vs 31.3 ms, CHANGELOG.md 2026-12-01) and one node
      instead of seven. Everywhere else (eager, ONNX, Core ML) the unpacking is floor division by 16
      (`>>` is not core ATen and fails ExecuTorch's `to_edge`, docs/export.md) and `& 15`, joined
      on a new last axis; the values are the same bits either way (tests/mesp/ops/test_quant.py).
Dequantization: w = q * s (broadcast over each group). A dequantized matrix is a transient of the
matmul that needs it, in forward and again in backward; it is never saved. Matmuls dequantize
`chunk_rows` output rows at a time, so the transient is [chunk_rows, i] instead of [o, i]:
  x W^T = [x W_1^T, ..., x W_n^T]        dy W = sum_j dy[:, rows_j] W_j

Generation reads every int4 weight once per token, where dequantizing it costs more than the matmul
(docs/benchmarks.md). With a fused `Compute` (ops/compute.py) an int4 `x W^T` is one call of the custom op
`toolchain::int4_linear_a8(x, qweight, scales, group)`, which multiplies the packed weight in place with x
quantized to int8 per row and group (W4A8: what ExecuTorch's own 8da4w LLM programs compute; integer dot
products, 64 per instruction on AVX-512 VNNI): its ExecuTorch kernel is toolchain/native/kernels.cpp;
its PyTorch implementation here (`int4_linear_a8_reference`) defines it, is what eager generation runs, and
is the reference the kernel is tested against. The stock generation methods (a runtime without the kernel)
and the training step (but under `--compute int8`) keep float32 activations (`dequantize` + `linear`); the activations' int8 rounding
costs the demo model +0.0004 nats per byte of held-out loss (docs/benchmarks.md). The op is registered with
PyTorch by the native kernels' table, mesp/kernels.py, when `toolchain.mesp` is imported.

Training on the same arithmetic (`--compute int8`, a `Compute` of precision "int8"): every x W^T by an int4 W
of the step (the projections, the MLP's chunks, the LM head's vocabulary chunks; forward and recompute) is that
op, and every dY W (dX of the projections, the MLP's chunks and the head) is `toolchain::int4_dyw_a8(dy, qweight,
scales, group)`: the reduction runs over W's output rows n while its scales vary along its input columns, so W^T
is requantized per call to int8 with one scale per (k-group, block of `group` consecutive n) (swt = the block's
largest |scale| * 8 / 127), dy is rounded to int8 once per row and block (`quantize_activations`), the integer
sums per block are exact, and the blocks' sums are added in float32 (isum * sa * swt). Its reference
`int4_dyw_a8_reference` is here too. Embedding lookups, LoRA, norms,
attention, the loss and the optimizer stay float32; `Compute(int8_dx=False)` keeps dY W float32 too.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.half import cols, compute_weight, linear, matmul, to_compute
from toolchain.mesp.ops.int8da_int4w import Int4Constant, linear_8da4w

__all__ = ["QuantWeight", "quantize", "dequantize", "dense", "matmul_xwt", "matmul_dyw", "with_chunk_rows",
           "dense_rows", "dense_cols", "quant_rows", "quant_cols", "embedding_rows", "int4_linear_a8_reference",
           "int4_dyw_a8_reference", "int4_dyw_a8_acc_reference", "quantize_activations", "matmul_dyw_rows",
           "int4_group"]

QuantKind = Literal["int8", "int4"]


class QuantWeight(NamedTuple):
    q: Tensor        # int8 [o, i] (int8) or uint8 [o, i/2] (int4, packed)
    scale: Tensor    # [o, i/G] float
    bits: int        # 8 or 4 (static)
    chunk_rows: int = 0  # rows dequantized at once by the matmuls (0: all)
    # int4 dequantized by ExecuTorch's `quantized_decomposed::embedding_4bit` (static; True only where the
    # ExecuTorch methods are traced: the caller imports `executorch.exir.passes._quant_patterns_and_replacements`,
    # which defines the op; its kernel is ExecuTorch's quantized kernel library, `kernels_quantized` in the
    # apps, `runtime/executorch_runtime.load_quantized_kernels` here). The values are the same bits either way.
    executorch: bool = False


def quantize(w: Tensor, kind: QuantKind, group: int) -> QuantWeight:
    """Host-side quantization of a [o, i] weight (i must be a multiple of `group`)."""
    o, i = w.shape
    if i % group:
        raise ValueError(f"input dim {i} is not a multiple of the quantization group {group}")
    qmax = 127 if kind == "int8" else 7
    wg = w.reshape(o, i // group, group)
    scale = (wg.abs().amax(-1) / qmax).clamp(min=torch.finfo(w.dtype).tiny)        # [o, i/G]
    q = torch.round(wg / scale[..., None]).clamp(-qmax - (kind == "int4"), qmax).reshape(o, i)
    if kind == "int8":
        return QuantWeight(q.to(torch.int8), scale, 8)
    if i % 2:
        raise ValueError(f"int4 needs an even input dim, got {i}")
    u = (q + 8).to(torch.uint8)
    return QuantWeight(16 * u[:, 0::2] + u[:, 1::2], scale, 4)


def with_chunk_rows(qw: QuantWeight, max_elems: int) -> QuantWeight:
    """Choose chunk_rows: the fewest chunks of at most `max_elems` dequantized elements (at least one
    row), of equal size (but the last), so that no chunk is a small remainder."""
    o, i = qw.scale.shape[0], qw.q.shape[1] * (2 if qw.bits == 4 else 1)
    per_chunk = max(1, min(o, max_elems // i))
    n = -(-o // per_chunk)
    return qw._replace(chunk_rows=-(-o // n))


def int4_group(qw: QuantWeight) -> int:
    """The quantization group of an int4 W (its input width over its scales' columns)."""
    return 2 * qw.q.shape[1] // qw.scale.shape[1]


def _rows(qw: QuantWeight, start: int, stop: int) -> QuantWeight:
    return QuantWeight(qw.q[start:stop], qw.scale[start:stop], qw.bits, executorch=qw.executorch)


def quant_rows(w: Tensor | QuantWeight, start: int, stop: int) -> Tensor | QuantWeight:
    """Rows [start, stop) of W, still quantized (views; the LM head's vocabulary chunks)."""
    return _rows(w, start, stop) if isinstance(w, QuantWeight) else w[start:stop]


def quant_cols(w: Tensor | QuantWeight, start: int, stop: int) -> Tensor | QuantWeight:
    """Columns [start, stop) of W, still quantized (the MLP's down-projection chunks under int8 compute: views
    here, a copy of [o, (stop - start) / 2] bytes in an ExecuTorch program, whose slices are copies). Quantized:
    start and stop on group boundaries."""
    if not isinstance(w, QuantWeight):
        return w[:, start:stop]
    i = w.q.shape[1] * (2 if w.bits == 4 else 1)
    g = i // w.scale.shape[1]
    if start % g or (stop % g and stop != i):
        raise ValueError(f"column chunk [{start}, {stop}) does not align with the quantization group {g}")
    per = 2 if w.bits == 4 else 1
    return QuantWeight(w.q[:, start // per:stop // per], w.scale[:, start // g:-(-stop // g)], w.bits,
                       executorch=w.executorch)


def embedding_rows(w: Tensor | QuantWeight, ids: Tensor) -> Tensor:
    """Rows `ids` [T] of W as float [T, i] (an embedding lookup; quantized: only those rows dequantized,
    by ExecuTorch's `embedding_4bit` if `w.executorch`)."""
    if not isinstance(w, QuantWeight):
        return w[ids]
    if w.bits == 4 and w.executorch:
        return torch.ops.quantized_decomposed.embedding_4bit.default(w.q, w.scale, None, -8, 7, ids)
    return dequantize(QuantWeight(w.q[ids], w.scale[ids], w.bits, executorch=w.executorch))


def _chunks(qw: QuantWeight) -> list[tuple[int, int]]:
    o = qw.scale.shape[0]
    step = qw.chunk_rows or o
    return [(r, min(r + step, o)) for r in range(0, o, step)]


def matmul_xwt(x: Tensor, w: Tensor | QuantWeight, compute: Compute = FP32) -> Tensor:
    """x W^T for x [T, i], W [o, i] (dense, or quantized and dequantized chunk by chunk; with a fused `compute`
    an int4 W is one `toolchain::int4_linear_a8` call, W read in place).

    Computed as `linear(x, W)`: exporters keep `aten.linear` (ExecuTorch's `to_edge` is told to
    preserve it), whose optimized kernel reads W [o, i] in place. Any written-out transpose of W
    would be materialized (`permute_copy`: ExecuTorch tensors have no strides), a copy of the frozen
    weight (17 MB for a [4864, 896] matrix, 545 MB for the LM head).
    """
    if compute.half:                   # --compute fp16 (ops/half.py): float16 operands and products
        w, xh = compute_weight(w, compute), to_compute(x, compute)
        if not isinstance(w, QuantWeight):
            return linear(xh, w, compute)                                              # [T, o]
        return torch.cat([linear(xh, dequantize(_rows(w, a, b)), compute) for a, b in _chunks(w)], dim=1)
    if isinstance(w, Int4Constant):    # the XNNPACK generation variant (ops/int8da_int4w.py)
        return linear_8da4w(x, w)                                                      # [T, o]
    if not isinstance(w, QuantWeight):
        return F.linear(x, w)                                                          # [T, o]
    if (compute.fused or compute.int8) and w.bits == 4:
        return torch.ops.toolchain.int4_linear_a8(x, w.q, w.scale, int4_group(w))         # [T, o], W read in place
    return torch.cat([F.linear(x, dequantize(_rows(w, a, b))) for a, b in _chunks(w)], dim=1)  # [T, o]


def matmul_dyw(dy: Tensor, w: Tensor | QuantWeight, compute: Compute = FP32, acc: Tensor | None = None) -> Tensor:
    """dy W for dy [T, o], W [o, i] (plus `acc` [T, i] when given: acc + dy W). With fp16 `compute` each chunk's
    product is float16 (ops/half.py), summed in float32; with int8 `compute` (`int8_dx`) an int4 W is one
    `toolchain::int4_dyw_a8` call (dy's rows rounded to int8 once per block of `group` output rows, W^T requantized
    per call to int8 per (k-group, block), exact integer sums; the int4 W read in place), and with `acc` one
    `toolchain::int4_dyw_a8_acc` call (the kernel adds acc as it stores: no separate `add` in the program)."""
    if compute.int8_dyw and isinstance(w, QuantWeight) and w.bits == 4:
        if acc is not None:
            return torch.ops.toolchain.int4_dyw_a8_acc(dy, w.q, w.scale, int4_group(w), 0, acc)  # [T, i]
        return torch.ops.toolchain.int4_dyw_a8(dy, w.q, w.scale, int4_group(w))            # [T, i]
    if acc is not None:
        return acc + matmul_dyw(dy, w, compute)
    w, dy = compute_weight(w, compute), to_compute(dy, compute)
    if not isinstance(w, QuantWeight):
        return matmul(dy, w, compute)
    out = None
    for a, b in _chunks(w):
        part = matmul(cols(dy, a, b), dequantize(_rows(w, a, b)), compute)            # [T, i]
        out = part if out is None else out + part
    return out


def matmul_dyw_rows(dy: Tensor, w: QuantWeight, start: int, compute: Compute = FP32,
                    acc: Tensor | None = None) -> Tensor:
    """dy W[start : start + o] for dy [T, o] (plus `acc` [T, i] when given): `matmul_dyw` on rows of W; with int8
    `compute` and an int4 W one `toolchain::int4_dyw_a8_acc` call that reads those rows in place (an MLP chunk's
    gate / up rows: no copy of them in the program)."""
    if compute.int8_dyw and w.bits == 4:
        return torch.ops.toolchain.int4_dyw_a8_acc(dy, w.q, w.scale, int4_group(w), start, acc)   # [T, i]
    return matmul_dyw(dy, _rows(w, start, start + dy.shape[-1]), compute, acc)


def dequantize(qw: QuantWeight) -> Tensor:
    """[o, i] float weight (dtype of the scales)."""
    q, scale, bits = qw.q, qw.scale, qw.bits
    if bits == 8:
        vals = q.to(scale.dtype)
    elif qw.executorch:
        # (n - 0) * s per element with n = nibble - 8: the same float32 products as below
        if scale.dtype != torch.float32:   # --compute fp16 (ops/half.py): float16 scales, float16 chunk
            return torch.ops.quantized_decomposed.embedding_4bit.dtype(q, scale, None, -8, 7, torch.arange(q.shape[0]),
                                                                      dtype=scale.dtype)
        return torch.ops.quantized_decomposed.embedding_4bit.default(q, scale, None, -8, 7,
                                                                    torch.arange(q.shape[0]))
    else:
        vals = _unpack_int4(q, scale.dtype) - 8
    o, i = vals.shape
    g = scale.shape[1]
    return (vals.reshape(o, g, i // g) * scale[..., None]).reshape(o, i)


def quantize_activations(x: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """x [T, i] float32 -> (a [T, ng, group] int8 values as float32, zero-padded past i; sa [T, ng]):
    per row and group of `group` columns (the last may be partial) sa = max|x| / 127, a = round(x / sa)
    (ties to even) in [-127, 127], 0 where sa is 0 (and where x / sa is not a number)."""
    t, i = x.shape
    ng = -(-i // group)
    xg = F.pad(x, (0, ng * group - i)).reshape(t, ng, group)
    sa = xg.abs().amax(-1) / 127.0                                                      # [T, ng]
    a = torch.where(sa[..., None] > 0, torch.round(xg / sa[..., None]), 0.0)
    return torch.nan_to_num(a, nan=0.0).clamp(-127, 127), sa


def int4_linear_a8_reference(x: Tensor, qweight: Tensor, scales: Tensor, group: int) -> Tensor:
    """x W^T for int4 W (qweight [o, i/2], scales [o, ng], ng = ceil(i / group); the last group may be
    partial) with x quantized per row and group (`quantize_activations`): per group the exact integer
    sum isum = sum_k a_k (n_k - 8), then y = sum_g isum_g * (sw_g * sa_g) in float32. Returns [..., o].
    The native kernel computes the same integer sums and adds the groups in its own fixed order."""
    o, half = qweight.shape
    lead, i = x.shape[:-1], x.shape[-1]
    ng = scales.shape[1]
    a, sa = quantize_activations(x.reshape(-1, i).float(), group)                      # [T, ng, G], [T, ng]
    rows = []
    for r0 in range(0, o, 4096):                                                        # [<=4096, i] at a time
        n = _unpack_int4(qweight[r0:r0 + 4096], torch.float64) - 8
        n = F.pad(n, (0, ng * group - i)).reshape(-1, ng, group)                        # [o', ng, G]
        isum = torch.einsum("tgk,ogk->tog", a.double(), n).float()                      # exact integers
        rows.append((isum * (scales[r0:r0 + 4096][None] * sa[:, None, :])).sum(-1))     # [T, o']
    return torch.cat(rows, dim=1).reshape(*lead, o).to(x.dtype)


def int4_dyw_a8_reference(dy: Tensor, qweight: Tensor, scales: Tensor, group: int) -> Tensor:
    """dX = dy W for int4 W (qweight [o, i/2], scales [o, ng] as `int4_linear_a8_reference`) and dy [..., o]:
    the gradient of x W^T with int8 products. The reduction runs over W's output rows n, along which W's scales
    vary, so W^T is requantized to int8 with one scale per (k-group g, block b of `group` consecutive n):
    swt[g, b] = max_{n in b} |scales[n, g]| / 15.875 (= 8 / 127 of it, float32), e[n, g] = scales[n, g] / swt[g, b]
    (float32; 0 where swt is 0) and Wt8[n, k] = round_half_even(e[n, g] (nib[n, k] - 8)) in [-127, 127] (the
    product exact). dy is quantized once per row t and block b (`quantize_activations` with `group`: sa[t, b],
    a[t, n]; a block holding an infinity gets sa = NaN, as one holding a NaN), the integer sums
    isum[t, b, k] = sum_{n in b} a[t, n] Wt8[n, k] are exact, and dX[t, k] = sum_b isum[t, b, k] c[t, b, g] with
    c = sa[t, b] swt[g, b] (float32). Returns [..., i]. One block at a time (never a [T, nb, i] tensor). The
    native kernel computes the same integer sums and c and adds the blocks in increasing order by fused
    multiply-adds."""
    o, half = qweight.shape
    i, ng = 2 * half, scales.shape[1]
    lead = dy.shape[:-1]
    d = dy.reshape(-1, o).float()
    nb = -(-o // group)                                                                 # blocks along o
    sw = scales.float()
    m = F.pad(sw.abs(), (0, 0, 0, nb * group - o)).reshape(nb, group, ng).amax(1)      # [nb, ng]
    swt = m / 15.875                                                                    # [nb, ng]
    swt_n = swt.repeat_interleave(group, 0)[:o]                                         # [o, ng]
    e = torch.where(swt_n > 0, sw / swt_n, torch.zeros_like(sw))                        # [o, ng] float32
    a, sa = quantize_activations(d, group)                                              # [T, nb, G], [T, nb]
    inf = F.pad(d.isinf(), (0, nb * group - o)).reshape(-1, nb, group).any(-1)
    sa = torch.where(inf, torch.full_like(sa, float("nan")), sa)                        # an infinity: NaN (kernel)
    a = torch.where(inf[..., None], torch.zeros_like(a), a)
    kg = torch.arange(i) // group                                                       # k -> its k-group
    out = torch.zeros(d.shape[0], i, dtype=torch.float32)
    for b in range(nb):
        n0, n1 = b * group, min(o, (b + 1) * group)
        nib = _unpack_int4(qweight[n0:n1], torch.float64) - 8                           # [nb', i]
        wt8 = (e[n0:n1, kg].double() * nib).round().clamp(-127, 127)                    # exact products, ties to even
        isum = (a[:, b, :n1 - n0].double() @ wt8).float()                               # exact integers [T, i]
        out = out + isum * (sa[:, b, None] * swt[b, kg][None, :])                       # [T, i]
    return out.reshape(*lead, i).to(dy.dtype)


def int4_dyw_a8_acc_reference(dy: Tensor, qweight: Tensor, scales: Tensor, group: int, row0: int,
                              acc: Tensor | None) -> Tensor:
    """The definition of `toolchain::int4_dyw_a8_acc`: acc + `int4_dyw_a8_reference`(dy, rows row0 .. row0 + o - 1 of
    W) for dy [..., o], one float32 addition per element with acc its first operand (acc [..., i], the shape of
    dy W; None: no addition). The kernel reads those rows in place and adds as it stores its dX: its result is the
    bits of acc + its `int4_dyw_a8` result on a copy of the rows."""
    o = dy.shape[-1]
    if row0 < 0 or row0 + o > qweight.shape[0]:
        raise ValueError(f"rows [{row0}, {row0 + o}) outside W's {qweight.shape[0]}")
    dx = int4_dyw_a8_reference(dy, qweight[row0:row0 + o], scales[row0:row0 + o], group)
    return dx if acc is None else acc + dx


def _unpack_int4(q: Tensor, dtype: torch.dtype) -> Tensor:
    """[o, i/2] bytes -> [o, i] nibbles (0..15) as `dtype`: column 2j the high nibble of byte j, 2j + 1
    the low. Each half is cast before they are joined (Core ML's floor_div of an integer is a float, its
    `& 15` an integer), and they are joined as a cat of [o, i/2, 1] halves: `torch.stack(dim=2)` +
    reshape evaluates planar (hi..., lo...) after coremltools' conversion (coremltools 9)."""
    o, half = q.shape
    hi, lo = torch.div(q, 16, rounding_mode="floor").to(dtype), torch.bitwise_and(q, 15).to(dtype)
    return torch.cat((hi.unsqueeze(2), lo.unsqueeze(2)), dim=2).reshape(o, 2 * half)


def dense(w: Tensor | QuantWeight) -> Tensor:
    return dequantize(w) if isinstance(w, QuantWeight) else w


def dense_rows(w: Tensor | QuantWeight, start: int, stop: int) -> Tensor:
    """Rows [start, stop) of W as a float [stop - start, i] matrix (dequantized if quantized)."""
    return dequantize(_rows(w, start, stop)) if isinstance(w, QuantWeight) else w[start:stop]


def dense_cols(w: Tensor | QuantWeight, start: int, stop: int) -> Tensor:
    """Columns [start, stop) of W as a float [o, stop - start] matrix. Quantized: start and stop must
    be multiples of the group (for int4 whole bytes: the group is even)."""
    if not isinstance(w, QuantWeight):
        return w[:, start:stop]
    o, ng = w.scale.shape
    i = w.q.shape[1] * (2 if w.bits == 4 else 1)
    g = i // ng
    if start % g or (stop % g and stop != i):
        raise ValueError(f"column chunk [{start}, {stop}) does not align with the quantization group {g}")
    scale = w.scale[:, start // g:-(-stop // g)]
    if w.bits == 4:  # the group is even, so the columns are whole bytes
        return dequantize(QuantWeight(w.q[:, start // 2:stop // 2], scale, 4, executorch=w.executorch))
    vals = w.q[:, start:stop].to(w.scale.dtype)
    return (vals.reshape(o, -1, g) * scale[..., None]).reshape(o, stop - start)
