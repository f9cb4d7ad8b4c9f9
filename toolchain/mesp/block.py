"""One Qwen2 decoder block: forward, and MeSP backward that recomputes the block from its input.

Forward (x [T, d]):
  n1 = rmsnorm(x);  q, k, v = lin_q(n1), lin_k(n1), lin_v(n1)   (biases, optional LoRA)
  o  = attention(rope(q), rope(k), v);  x1 = x + lin_o(o)
  n2 = rmsnorm(x1); a = silu(lin_gate(n2)) * lin_up(n2);  out = x1 + lin_down(a)
Backward chains the primitives' backwards in reverse. Nothing of the forward is kept between the
forward pass and the backward pass but x (the per-layer checkpoint); the MLP (per token) is
recomputed and differentiated in token chunks so its [C, f] tensors replace [T, f] ones, and its
down projection is not recomputed at all (its backward needs its input, not its output: 1/3 of
the MLP's recompute FLOPs). Attention runs one kv group at a time ([H/Hk, T, T] scores).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.lora.weights import LoraPair
from toolchain.mesp.ops import (AttentionGrads, AttentionSaved, LinearSaved, RopeTables, attention_backward,
                                attention_forward, linear_backward, linear_forward,
                                rmsnorm_backward, rmsnorm_forward, rope_backward, rope_forward, swiglu_backward,
                                swiglu_forward)
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import LayerWeights

__all__ = ["BlockParams", "block_forward", "block_backward"]


class BlockParams(NamedTuple):
    """Everything a block needs besides its input: frozen weights, its LoRA pairs, static config."""

    weights: LayerWeights
    lora: dict[str, LoraPair]   # target -> pair; absent targets are not adapted
    scale: float
    arch: Qwen25Arch


def _heads(x: Tensor, n: int) -> Tensor:
    t = x.shape[0]
    return x.reshape(t, n, -1).transpose(0, 1)                        # [T, n*D] -> [n, T, D]


def _unheads(x: Tensor) -> Tensor:
    n, t, dh = x.shape
    return x.transpose(0, 1).reshape(t, n * dh)                       # [n, T, D] -> [T, n*D]


def _attention_by_group(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, AttentionSaved]:
    """attention_forward one kv head (and its query heads) at a time: same result, and the
    [G, T, T] score tensors of one group replace the [H, T, T] ones of all heads."""
    g = q.shape[0] // k.shape[0]
    o = torch.cat([attention_forward(q[j * g:(j + 1) * g], k[j:j + 1], v[j:j + 1])[0] for j in range(k.shape[0])])
    return o, AttentionSaved(q, k, v)                                 # o [H, T, D]


def _attention_backward_by_group(do: Tensor, saved: AttentionSaved) -> AttentionGrads:
    """attention_backward one kv group at a time (groups are independent: exact)."""
    q, k, v = saved
    g = q.shape[0] // k.shape[0]
    parts = [attention_backward(do[j * g:(j + 1) * g], AttentionSaved(q[j * g:(j + 1) * g], k[j:j + 1], v[j:j + 1]))
             for j in range(k.shape[0])]
    return AttentionGrads(*(torch.cat(grads) for grads in zip(*parts)))


def _attention_half(x: Tensor, p: BlockParams, rope: RopeTables):
    """x -> x1 = x + attn(x), returning the saved bundles the backward needs."""
    w, arch = p.weights, p.arch
    n1, s_n1 = rmsnorm_forward(x, w.input_norm, arch.rms_eps)
    q, s_q = linear_forward(n1, w.q_proj, w.q_bias, p.lora.get("q_proj"), p.scale)
    k, s_k = linear_forward(n1, w.k_proj, w.k_bias, p.lora.get("k_proj"), p.scale)
    v, s_v = linear_forward(n1, w.v_proj, w.v_bias, p.lora.get("v_proj"), p.scale)
    o, s_att = _attention_by_group(rope_forward(_heads(q, arch.heads), rope),
                                   rope_forward(_heads(k, arch.kv_heads), rope), _heads(v, arch.kv_heads))
    ao, s_o = linear_forward(_unheads(o), w.o_proj, None, p.lora.get("o_proj"), p.scale)
    return x + ao, (s_n1, s_q, s_k, s_v, s_att, s_o)


def _mlp(x1: Tensor, p: BlockParams) -> Tensor:
    w = p.weights
    n2, _ = rmsnorm_forward(x1, w.post_norm, p.arch.rms_eps)
    g, _ = linear_forward(n2, w.gate_proj, None, p.lora.get("gate_proj"), p.scale)
    u, _ = linear_forward(n2, w.up_proj, None, p.lora.get("up_proj"), p.scale)
    a, _ = swiglu_forward(g, u)
    return linear_forward(a, w.down_proj, None, p.lora.get("down_proj"), p.scale)[0]


def block_forward(x: Tensor, p: BlockParams, rope: RopeTables, mlp_chunk: int | None = None) -> Tensor:
    """Args: x [T, d]; mlp_chunk: tokens per MLP chunk (None: all at once; the MLP is per token,
    so chunking bounds its [C, f] tensors without changing the result). Returns the output [T, d]."""
    x1 = _attention_half(x, p, rope)[0]                              # the saved bundles are dropped at once
    t = x1.shape[0]
    step = t if mlp_chunk is None else mlp_chunk
    if step >= t:
        return x1 + _mlp(x1, p)
    return torch.cat([x1[i:i + step] + _mlp(x1[i:i + step], p) for i in range(0, t, step)])


def _add_grad(acc: dict[str, LoraPair], target: str, g: LoraPair | None) -> None:
    if g is None:
        return
    acc[target] = g if target not in acc else LoraPair(acc[target].a + g.a, acc[target].b + g.b)


def _mlp_backward(dout: Tensor, x1: Tensor, p: BlockParams, grads: dict[str, LoraPair]) -> Tensor:
    """Recompute the MLP on x1 [C, d] and return d(x1 + mlp(x1)) / dx1 applied to dout [C, d]."""
    w = p.weights
    n2, s_n2 = rmsnorm_forward(x1, w.post_norm, p.arch.rms_eps)
    g, s_g = linear_forward(n2, w.gate_proj, None, p.lora.get("gate_proj"), p.scale)
    u, s_u = linear_forward(n2, w.up_proj, None, p.lora.get("up_proj"), p.scale)
    a, s_sw = swiglu_forward(g, u)
    del g, u
    # The down projection's output is not needed, only its input: save without recomputing the
    # [C, f] x [f, d] product (what linear_forward would save for these arguments).
    s_d = LinearSaved(a, w.down_proj, p.lora.get("down_proj"), p.scale)
    del a                                    # s_d holds `a` until the down projection's backward
    gd = linear_backward(dout, s_d)
    del s_d
    _add_grad(grads, "down_proj", gd.lora)
    sw = swiglu_backward(gd.dx, s_sw)
    del gd, s_sw
    gg = linear_backward(sw.dg, s_g)
    gu = linear_backward(sw.du, s_u)
    _add_grad(grads, "gate_proj", gg.lora)
    _add_grad(grads, "up_proj", gu.lora)
    return dout + rmsnorm_backward(gg.dx + gu.dx, s_n2)


def block_backward(dout: Tensor, x: Tensor, p: BlockParams, rope: RopeTables,
                   mlp_chunk: int | None = None) -> tuple[Tensor, dict[str, LoraPair]]:
    """MeSP backward of one block from its checkpointed input.

    Args:
        dout: [T, d] gradient of the loss with respect to the block output.
        x: [T, d] the block input (the per-layer checkpoint).
        mlp_chunk: tokens per MLP recompute/backward chunk (None: all tokens at once).

    Returns:
        dx [T, d] and the LoRA gradients of this block, keyed like `p.lora`.
    """
    grads: dict[str, LoraPair] = {}
    x1, (s_n1, s_q, s_k, s_v, s_att, s_o) = _attention_half(x, p, rope)
    t = x.shape[0]
    step = t if mlp_chunk is None else mlp_chunk
    dx1 = torch.cat([_mlp_backward(dout[i:i + step], x1[i:i + step], p, grads) for i in range(0, t, step)])
    del x1
    arch = p.arch
    go = linear_backward(dx1, s_o)
    _add_grad(grads, "o_proj", go.lora)
    ga = _attention_backward_by_group(_heads(go.dx, arch.heads), s_att)
    del go, s_att
    gq = linear_backward(_unheads(rope_backward(ga.dq, rope)), s_q)
    gk = linear_backward(_unheads(rope_backward(ga.dk, rope)), s_k)
    gv = linear_backward(_unheads(ga.dv), s_v)
    for name, g in (("q_proj", gq), ("k_proj", gk), ("v_proj", gv)):
        _add_grad(grads, name, g.lora)
    dx = dx1 + rmsnorm_backward(gq.dx + gk.dx + gv.dx, s_n1)
    return dx, {t_: grads[t_] for t_ in p.lora}
