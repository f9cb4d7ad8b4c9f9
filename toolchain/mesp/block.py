"""One decoder block (Qwen2, Qwen3, Llama: the architecture's flags): forward, and MeSP backward that
recomputes the block from its input.

Forward (x [T, d]):
  n1 = rmsnorm(x);  q, k, v = lin_q(n1), lin_k(n1), lin_v(n1)   (biases if qkv_bias, optional LoRA)
  q, k = head_norm(q), head_norm(k)                             (qk_norm: per head, frozen weights [D])
  o  = attention(rope(q), rope(k), v);  x1 = x + lin_o(o)
  n2 = rmsnorm(x1); a = silu(lin_gate(n2)) * lin_up(n2);  out = x1 + lin_down(a)
Backward chains the primitives' backwards in reverse (the MLP first, then the attention half, whose input
norm is recomputed after the MLP rather than held through it). Nothing of the forward is kept between the
forward pass and the backward pass but x (the per-layer checkpoint). Attention runs one query head at a
time ([T, T] scores). With q/k norms the backward chains rope_backward, head_norm_backward, linear_backward;
the pre-norm q, k heads are held from the recompute to the norms' backward (with the post-rope ones).
`--compute int8` (`Compute.train_kernels`) runs the same math through native ops on the thread pool: attention
as one call each way, SwiGLU (with its backward in one pass), each int4 projection with its bias, LoRA and
residual, each projection's LoRA backward, the MLP chunks' LoRA rows, the two RMSNorms and their backwards (with the
residual and the q, k, v gradients' sums), and RoPE without q/k norms (forward and backward; ops/compute.py); the
MLP chunks' gate / up rows are read in place (`toolchain::lora_linear_a8_rows`, `int4_dyw_a8_acc`'s row0) and dn2,
da accumulate in the dX kernel (`toolchain::int4_dyw_a8_acc`: acc + dy W, no separate add).

The MLP is cut along its intermediate dimension f (it is a sum over f: lin_down(a) = sum_c a_c Wd[:, c]^T
with a_c = silu(n2 Wg[c]^T) * (n2 Wu[c]^T) for column chunks c of size C): its [T, C] tensors replace
[T, f] ones, and every MLP weight is read (dequantized, when quantized) once per pass: once in forward,
once in backward, where the chunk's recompute and its gradient share the dequantized rows. The down
projection's output is not recomputed in backward at all (its backward needs its input only). LoRA on
the MLP splits the same way: h = x A^T is computed once per pass; B's rows (gate, up) and A's columns
(down) are sliced per chunk; the [T, r] sums are accumulated over the chunks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.lora.weights import LoraPair
import torch.nn.functional as F

from toolchain.mesp.ops import (AttentionGrads, AttentionSaved, LinearSaved, RmsNormSaved, RopeTables, SwigluGrads,
                                SwigluSaved, attention_backward, attention_forward, causal_mask, head_norm_backward,
                                head_norm_forward, linear_backward, linear_forward, rmsnorm_backward,
                                rmsnorm_forward, rope_backward, rope_forward, rope_tables, swiglu_backward,
                                swiglu_forward)
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.half import compute_weight, linear, matmul, to_compute
from toolchain.mesp.ops.quant import (QuantWeight, dense_cols, dense_rows, int4_group, matmul_dyw, matmul_dyw_rows,
                                      matmul_xwt, quant_cols, quant_rows)
from toolchain.models.presets import ModelArch
from toolchain.models.weights import LayerWeights

__all__ = ["BlockParams", "block_forward", "block_backward", "block_rope", "attention_half"]


class BlockParams(NamedTuple):
    """Everything a block needs besides its input: frozen weights, its LoRA pairs, static config, and how its
    frozen-weight matmuls compute (ops/compute.py: fp16, int8, or the fused generation ops)."""

    weights: LayerWeights
    lora: dict[str, LoraPair]   # target -> pair; absent targets are not adapted
    scale: float
    arch: ModelArch
    compute: Compute = FP32


def block_rope(arch: ModelArch, positions: Tensor, dtype: torch.dtype) -> RopeTables:
    """The rotary tables of `arch` at `positions` [T] (scaled frequencies when the arch has rope scaling)."""
    return rope_tables(positions, arch.head_dim, arch.rope_theta, dtype, inv_freq=arch.rope_inv_freq())


def _rmsnorm(x: Tensor, w: Tensor, eps: float, compute: Compute) -> tuple[Tensor, RmsNormSaved]:
    """rmsnorm_forward; with `compute.train_kernels` the norm is `toolchain::rms_norm` (its reference is
    rmsnorm_forward's value; rows on the pool). Its backward recomputes from the saved input either way."""
    if compute.train_kernels:
        return torch.ops.toolchain.rms_norm(x, w, eps), RmsNormSaved(x, w, eps)
    return rmsnorm_forward(x, w, eps)


def _heads(x: Tensor, n: int) -> Tensor:
    t = x.shape[0]
    return x.reshape(t, n, -1).transpose(0, 1)                        # [T, n*D] -> [n, T, D]


def _unheads(x: Tensor) -> Tensor:
    n, t, dh = x.shape
    return x.transpose(0, 1).reshape(t, n * dh)                       # [n, T, D] -> [T, n*D]


def _attention_by_head(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """attention_forward one query head (with its kv head) at a time: the same result, and the [T, T]
    scores of one head replace the [H/Hk, T, T] ones of a kv group (at T = 1024 and 7 heads per group:
    4 MB instead of 29 MB per score-sized tensor). Returns o [H, T, D]."""
    g = q.shape[0] // k.shape[0]
    return torch.cat([attention_forward(q[h:h + 1], k[h // g:h // g + 1], v[h // g:h // g + 1], mask)[0]
                      for h in range(q.shape[0])])


def _attention_backward_by_head(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor,
                                mask: Tensor) -> AttentionGrads:
    """attention_backward one query head at a time (heads are independent given q, k, v: exact); the
    gradients of a shared kv head are summed over its query heads. o: the attention output [T, H*D] (the
    o projection's input, held anyway): head h is its columns [h*D, (h+1)*D)."""
    g, dh = q.shape[0] // k.shape[0], q.shape[2]
    dq, dk, dv = [], [None] * k.shape[0], [None] * k.shape[0]
    for h in range(q.shape[0]):
        j = h // g
        saved = AttentionSaved(q[h:h + 1], k[j:j + 1], v[j:j + 1], o[:, h * dh:(h + 1) * dh].unsqueeze(0))
        ga = attention_backward(do[h:h + 1], saved, mask)
        dq.append(ga.dq)
        dk[j] = ga.dk if dk[j] is None else dk[j] + ga.dk
        dv[j] = ga.dv if dv[j] is None else dv[j] + ga.dv
    return AttentionGrads(torch.cat(dq), torch.cat(dk), torch.cat(dv))


class _AttentionKept(NamedTuple):
    """What the attention half's backward needs besides n1 (which it recomputes from x: the MLP's backward
    runs in between, without it): q, k post-rope [H | Hk, T, D], v [Hk, T, D], o [T, H*D], the mask; with q/k
    norms the norms' saved inputs (pre-norm heads), else None."""
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    mask: Tensor
    q_norm: RmsNormSaved | None
    k_norm: RmsNormSaved | None


def attention_half(x: Tensor, p: BlockParams, rope: RopeTables) -> tuple[Tensor, _AttentionKept]:
    """x -> x1 = x + attn(x), and what its backward needs."""
    w, arch = p.weights, p.arch
    mask = causal_mask(x.shape[0], x.device)
    n1, _ = _rmsnorm(x, w.input_norm, arch.rms_eps, p.compute)
    q = linear_forward(n1, w.q_proj, w.q_bias, p.lora.get("q_proj"), p.scale, p.compute)[0]
    k = linear_forward(n1, w.k_proj, w.k_bias, p.lora.get("k_proj"), p.scale, p.compute)[0]
    v = linear_forward(n1, w.v_proj, w.v_bias, p.lora.get("v_proj"), p.scale, p.compute)[0]
    del n1
    if _native_rope(p):                                           # split into heads and rotated: one native op each
        q = torch.ops.toolchain.rope_train(q, rope.cos, rope.sin, arch.heads)
        k = torch.ops.toolchain.rope_train(k, rope.cos, rope.sin, arch.kv_heads)
        sq = sk = None
    else:
        q, sq = _qk_heads(q, arch.heads, w.q_norm, arch.rms_eps, rope)  # [H, T, D] post-rope; the norm's saved
        k, sk = _qk_heads(k, arch.kv_heads, w.k_norm, arch.rms_eps, rope)  # [Hk, T, D]
    v = _heads(v, arch.kv_heads)
    if p.compute.train_kernels:                                   # one native op (ops/compute.py)
        o = torch.ops.toolchain.attention_train(q, k, v, arch.head_dim ** -0.5)
    else:
        o = _unheads(_attention_by_head(q, k, v, mask))
    x1 = linear_forward(o, w.o_proj, None, p.lora.get("o_proj"), p.scale, p.compute, residual=x)[0]  # x + o_proj(o)
    return x1, _AttentionKept(q, k, v, o, mask, sq, sk)


def _native_rope(p: BlockParams) -> bool:
    """`compute.train_kernels` without q/k norms: RoPE (forward, and backward from the attention backward's stacked
    gradients) through `toolchain::rope_train` / `rope_train_backward` (ops/rope.py's references); with q/k norms the
    per-head norms sit between the heads and the rotation, and RoPE stays the stock graph."""
    return p.compute.train_kernels and p.weights.q_norm is None and p.weights.k_norm is None


def _qk_heads(x: Tensor, n: int, norm: Tensor | None, eps: float, rope: RopeTables
              ) -> tuple[Tensor, RmsNormSaved | None]:
    """A q or k projection [T, n*D] -> heads [n, T, D], per-head RMSNorm'd (when `norm` [D] is given), rotated;
    and the norm's saved input (None without it)."""
    x = _heads(x, n)
    saved = None
    if norm is not None:
        x, saved = head_norm_forward(x, norm, eps)
    return rope_forward(x, rope), saved


def _f_chunks(p: BlockParams, mlp_chunk: int | None) -> list[tuple[int, int]]:
    """Column chunks [a, b) of the intermediate dimension; with a quantized down projection, chunk
    boundaries fall on its quantization groups (rounded up to a multiple of the group)."""
    f = p.arch.intermediate
    step = f if mlp_chunk is None else min(f, mlp_chunk)
    wd = p.weights.down_proj
    if isinstance(wd, QuantWeight):
        group = f // wd.scale.shape[1]
        step = -(-step // group) * group
    return [(a, min(a + step, f)) for a in range(0, f, step)]


def _int8(p: BlockParams) -> bool:
    """--compute int8 with an int4 MLP: its chunks multiply through the W4A8 ops (ops/quant.py), never dequantized
    (dY W too unless `int8_dx` is off: then `matmul_dyw` dequantizes the chunk)."""
    w = p.weights
    return p.compute.int8 and all(isinstance(m, QuantWeight) and m.bits == 4
                                  for m in (w.gate_proj, w.up_proj, w.down_proj))


def _lora_h(x: Tensor, pair) -> Tensor | None:
    return None if pair is None else F.linear(x, pair.a)             # [T, r] h = x A^T


def _gate_up_rows(n2: Tensor, wg: QuantWeight, wu: QuantWeight, lg, lu, a: int, b: int, p: BlockParams
                  ) -> tuple[Tensor, Tensor]:
    """--compute int8 with the training kernels: the MLP chunk's g, u [T, C] = n2 W[a:b]^T + s (n2 A^T) B[a:b]^T (wg,
    wu the whole int4 gate / up weights), each one `toolchain::lora_linear_a8_rows` call: W's and B's rows [a, b)
    read in place (no copy of the chunk's rows in the program; it recomputes its [T, r] n2 A^T)."""
    return tuple(torch.ops.toolchain.lora_linear_a8_rows(n2, w.q, w.scale, int4_group(w), a, b - a,
                                                         None if pair is None else pair.a,
                                                         None if pair is None else pair.b, p.scale)
                 for w, pair in ((wg, lg), (wu, lu)))


def _mlp(x1: Tensor, p: BlockParams, mlp_chunk: int | None) -> Tensor:
    """lin_down(silu(lin_gate(n2)) * lin_up(n2)) for n2 = rmsnorm(x1), chunk by chunk over f."""
    w, s = p.weights, p.scale
    lg, lu, ld = p.lora.get("gate_proj"), p.lora.get("up_proj"), p.lora.get("down_proj")
    n2, _ = _rmsnorm(x1, w.post_norm, p.arch.rms_eps, p.compute)
    c = p.compute
    int8 = _int8(p)
    # [T, r] n2 A^T (the fused gate / up calls compute their own)
    hg, hu = (None, None) if int8 and c.train_kernels else (_lora_h(n2, lg), _lora_h(n2, lu))
    # --compute fp16 (ops/half.py): float16 weight chunks and matmul operands; identities otherwise
    n2c = to_compute(n2, c)
    wg, wu, wd = compute_weight(w.gate_proj, c), compute_weight(w.up_proj, c), compute_weight(w.down_proj, c)
    out, hd = None, None
    for a, b in _f_chunks(p, mlp_chunk):
        if int8 and c.train_kernels:                                 # one native call each (ops/compute.py)
            g, u = _gate_up_rows(n2, wg, wu, lg, lu, a, b, p)
        else:
            if int8:                                                 # --compute int8: the int4 chunks in place
                g, u = matmul_xwt(n2, quant_rows(wg, a, b), c), matmul_xwt(n2, quant_rows(wu, a, b), c)
            else:
                g = linear(n2c, dense_rows(wg, a, b), c)             # [T, C]
                u = linear(n2c, dense_rows(wu, a, b), c)             # [T, C]
            if lg is not None:
                g = g + s * F.linear(hg, lg.b[a:b])
            if lu is not None:
                u = u + s * F.linear(hu, lu.b[a:b])
        if c.train_kernels:                                          # one native op (ops/compute.py)
            act = torch.ops.toolchain.swiglu(g, u)
        else:
            act = swiglu_forward(g, u)[0]                            # [T, C] (its saved g, u not kept)
        del g, u
        if int8 and c.train_kernels:                                 # out + act Wd[:, c]^T in one native call
            out = linear_forward(act, quant_cols(wd, a, b), None, None, s, c, residual=out)[0]
        else:
            if int8:
                part = matmul_xwt(act, quant_cols(wd, a, b), c)      # [T, d]
            else:
                part = linear(to_compute(act, c), dense_cols(wd, a, b), c)  # [T, d]
            out = part if out is None else out + part
            del part
        if ld is not None:
            h_c = F.linear(act, ld.a[:, a:b])                        # [T, r]
            hd = h_c if hd is None else hd + h_c
    if ld is not None:
        out = out + s * F.linear(hd, ld.b)
    return out


def block_forward(x: Tensor, p: BlockParams, rope: RopeTables, mlp_chunk: int | None = None) -> Tensor:
    """Args: x [T, d]; mlp_chunk: intermediate columns per MLP chunk (None: all at once; the MLP is a
    sum over them, so chunking bounds its [T, C] tensors without changing the result). Returns [T, d]."""
    x1 = attention_half(x, p, rope)[0]                              # the saved bundles are dropped at once
    return x1 + _mlp(x1, p, mlp_chunk)


def _add_grad(acc: dict[str, LoraPair], target: str, g: LoraPair | None) -> None:
    if g is None:
        return
    acc[target] = g if target not in acc else LoraPair(acc[target].a + g.a, acc[target].b + g.b)


def _mlp_backward(dout: Tensor, x1: Tensor, p: BlockParams, mlp_chunk: int | None,
                  grads: dict[str, LoraPair]) -> Tensor:
    """Recompute the MLP on x1 [T, d] chunk by chunk and return d(x1 + mlp(x1)) / dx1 applied to dout
    [T, d]; adds the MLP's LoRA gradients to `grads`. Per chunk c (linear_backward's formulas, split over f):
      da_c = dout Wd[:, c] + dhd Ad[:, c]    dhd = s dout Bd       dAd[:, c] = dhd^T a_c
      hd  += a_c Ad[:, c]^T  (dBd = s dout^T hd after the loop)
      dg_c, du_c = swiglu_backward(da_c);    dn2 += dg_c Wg[c] + du_c Wu[c]
      dBg[c] = s dg_c^T hg;  dhg += s dg_c Bg[c]  (dAg = dhg^T n2, dn2 += dhg Ag after the loop); up alike
    """
    w, s = p.weights, p.scale
    lg, lu, ld = p.lora.get("gate_proj"), p.lora.get("up_proj"), p.lora.get("down_proj")
    n2, s_n2 = _rmsnorm(x1, w.post_norm, p.arch.rms_eps, p.compute)
    hg, hu = _lora_h(n2, lg), _lora_h(n2, lu)                        # [T, r]
    dhd = None if ld is None else s * (dout @ ld.b)                  # [T, r]
    dn2, hd, dhg, dhu = None, None, None, None
    dbg, dbu, dad = [], [], []
    # --compute fp16 (ops/half.py): float16 weight chunks and matmul operands; identities otherwise
    cp = p.compute
    int8 = _int8(p)
    n2c, doutc = to_compute(n2, cp), to_compute(dout, cp)
    wgq, wuq, wdq = compute_weight(w.gate_proj, cp), compute_weight(w.up_proj, cp), compute_weight(w.down_proj, cp)
    adt = None if ld is None or not cp.train_kernels else ld.a.T.contiguous()   # [f, r]: Ad's columns as rows
    for a, b in _f_chunks(p, mlp_chunk):
        if int8:                                                     # --compute int8: the int4 chunks in place,
            ad = None if ld is None else ld.a[:, a:b]                # [r, C]; dhd Ad[:, c] + dout Wd[:, c] in one
            da = matmul_dyw(dout, quant_cols(wdq, a, b), cp,         # toolchain::int4_dyw_a8_acc call (no add)
                            acc=None if ad is None else dhd @ ad)    # [T, C]
        else:
            da = matmul(doutc, dense_cols(wdq, a, b), cp)            # [T, C]: Wd's chunk dies before Wg's, Wu's
            if ld is not None:
                ad = ld.a[:, a:b]                                    # [r, C]
                da = da + dhd @ ad
        if int8:                                                     # the chunk's int4 rows read in place
            wg, wu = None, None
        else:
            wg, wu = dense_rows(wgq, a, b), dense_rows(wuq, a, b)    # [C, d], read once for both uses
        if int8 and cp.train_kernels:
            g, u = _gate_up_rows(n2, wgq, wuq, lg, lu, a, b, p)      # [T, C] recomputed
        else:
            if int8:
                g, u = matmul_xwt(n2, quant_rows(wgq, a, b), cp), matmul_xwt(n2, quant_rows(wuq, a, b), cp)
            else:
                g, u = linear(n2c, wg, cp), linear(n2c, wu, cp)      # [T, C] recomputed
            if lg is not None:
                g = g + s * F.linear(hg, lg.b[a:b])
            if lu is not None:
                u = u + s * F.linear(hu, lu.b[a:b])
        if cp.train_kernels:                                         # a, dg, du in one native op (ops/compute.py)
            fused = torch.ops.toolchain.swiglu_train(g, u, da)
            act, sw = fused[0], SwigluGrads(fused[1], fused[2])
        else:
            act, sw = swiglu_forward(g, u)[0], None
        if ld is not None:
            if cp.train_kernels:                                     # (act^T dhd, act Ad[:, c]^T): one native op
                rows = torch.ops.toolchain.lora_rows_backward(act, dhd, adt[a:b], 1.0)
                dad.append(rows[:b - a])                             # [C, r]: dAd's columns, transposed
                h_c = rows[b - a:]
            else:
                dad.append(dhd.T @ act)                              # [r, C]
                h_c = F.linear(act, ad)
            hd = h_c if hd is None else hd + h_c
        del act
        if sw is None:
            sw = swiglu_backward(da, SwigluSaved(g, u))
        del g, u, da
        if int8:   # dn2 chained through both products, the rows in place (toolchain::int4_dyw_a8_acc: the kernel
            #        adds as it stores)
            dn2 = matmul_dyw_rows(sw.du, wuq, a, cp, acc=matmul_dyw_rows(sw.dg, wgq, a, cp, acc=dn2))   # [T, d]
        else:
            part = matmul(to_compute(sw.dg, cp), wg, cp) + matmul(to_compute(sw.du, cp), wu, cp)  # [T, d]
            dn2 = part if dn2 is None else dn2 + part
            del part
        del wg, wu
        if cp.train_kernels:                                         # (s dg^T hg, s dg Bg[c]): one native op each
            for pair, dyc, h, db, dh in ((lg, sw.dg, hg, dbg, "g"), (lu, sw.du, hu, dbu, "u")):
                if pair is not None:
                    rows = torch.ops.toolchain.lora_rows_backward(dyc, h, pair.b[a:b], s)
                    db.append(rows[:b - a])                          # [C, r]
                    c = rows[b - a:]                                 # [T, r]
                    if dh == "g":
                        dhg = c if dhg is None else dhg + c
                    else:
                        dhu = c if dhu is None else dhu + c
        else:
            if lg is not None:
                dbg.append(s * (sw.dg.T @ hg))                       # [C, r]
                c = s * (sw.dg @ lg.b[a:b])
                dhg = c if dhg is None else dhg + c
            if lu is not None:
                dbu.append(s * (sw.du.T @ hu))
                c = s * (sw.du @ lu.b[a:b])
                dhu = c if dhu is None else dhu + c
        del sw
    if ld is not None:
        dad_all = torch.cat(dad, dim=0).T if cp.train_kernels else torch.cat(dad, dim=1)   # [r, f]
        _add_grad(grads, "down_proj", LoraPair(dad_all, s * (dout.T @ hd)))
    for name, pair, dh, db in (("gate_proj", lg, dhg, dbg), ("up_proj", lu, dhu, dbu)):
        if pair is not None:
            dn2 = dn2 + dh @ pair.a
            _add_grad(grads, name, LoraPair(dh.T @ n2, torch.cat(db, dim=0)))
    if cp.train_kernels:                                             # dout + the norm's backward: one native op
        return torch.ops.toolchain.rms_norm_backward(x1, w.post_norm, p.arch.rms_eps, dn2, None, None, dout)
    return dout + rmsnorm_backward(dn2, s_n2)


def block_backward(dout: Tensor, x: Tensor, p: BlockParams, rope: RopeTables,
                   mlp_chunk: int | None = None) -> tuple[Tensor, dict[str, LoraPair]]:
    """MeSP backward of one block from its checkpointed input.

    Args:
        dout: [T, d] gradient of the loss with respect to the block output.
        x: [T, d] the block input (the per-layer checkpoint).
        mlp_chunk: intermediate columns per MLP recompute/backward chunk (None: all at once).

    Returns:
        dx [T, d] and the LoRA gradients of this block, keyed like `p.lora`.
    """
    grads: dict[str, LoraPair] = {}
    w, arch = p.weights, p.arch
    x1, kept = attention_half(x, p, rope)
    dx1 = _mlp_backward(dout, x1, p, mlp_chunk, grads)
    del x1
    go = linear_backward(dx1, LinearSaved(kept.o, w.o_proj, p.lora.get("o_proj"), p.scale), p.compute)
    _add_grad(grads, "o_proj", go.lora)
    h_, hk_ = arch.heads, arch.kv_heads
    if p.compute.train_kernels:                                   # dq, dk, dv stacked [H + 2 Hk, T, D]
        stacked = torch.ops.toolchain.attention_train_backward(go.dx, kept.q, kept.k, kept.v, kept.o,
                                                               arch.head_dim ** -0.5)
        ga = AttentionGrads(stacked[:h_], stacked[h_:h_ + hk_], stacked[h_ + hk_:])
    else:
        ga = _attention_backward_by_head(_heads(go.dx, h_), kept.q, kept.k, kept.v, kept.o, kept.mask)
    norms = {"q": kept.q_norm, "k": kept.k_norm}                                  # None without q/k norms
    del go, kept
    n1, s_n1 = _rmsnorm(x, w.input_norm, arch.rms_eps, p.compute)   # recomputed: not held through the MLP
    def saved(name: str, weight) -> LinearSaved:
        return LinearSaved(n1, weight, p.lora.get(name), p.scale)

    def dproj(which: str) -> Tensor:                                # d(projection output) [T, n*D]
        if _native_rope(p):                                         # from the stacked gradients: one native op
            start, n = (0, h_) if which == "q" else (h_, hk_)
            return torch.ops.toolchain.rope_train_backward(stacked, rope.cos, rope.sin, start, n)
        dy = rope_backward(ga.dq if which == "q" else ga.dk, rope)  # [n, T, D]
        return _unheads(dy if norms[which] is None else head_norm_backward(dy, norms[which]))

    gq = linear_backward(dproj("q"), saved("q_proj", w.q_proj), p.compute)
    gk = linear_backward(dproj("k"), saved("k_proj", w.k_proj), p.compute)
    gv = linear_backward(_unheads(ga.dv), saved("v_proj", w.v_proj), p.compute)
    del ga
    for name, g in (("q_proj", gq), ("k_proj", gk), ("v_proj", gv)):
        _add_grad(grads, name, g.lora)
    if p.compute.train_kernels:                                     # dx1 + the norm's backward of the sum: one op
        dx = torch.ops.toolchain.rms_norm_backward(x, w.input_norm, arch.rms_eps, gq.dx, gk.dx, gv.dx, dx1)
    else:
        dx = dx1 + rmsnorm_backward(gq.dx + gk.dx + gv.dx, s_n1)
    return dx, {t_: grads[t_] for t_ in p.lora}
