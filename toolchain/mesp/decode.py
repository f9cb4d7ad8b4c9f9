"""Generation with the live adapter: the block on a chunk of new tokens with a KV cache (prefill chunks and
single-token decode are the same function), and the LM head on one position. Forward only (no gradients),
the same frozen weights and LoRA pairs as the training step.

Cache layout (one per layer, owned by the caller): k, v [Hk, S, D] float32, S = the program's seq_len,
k after RoPE (as attention uses it). Rows >= the current position are ignored (masked), so the caller
never has to clear them.

  block_decode(x [C, d], pos, k, v)    -> out [C, d], k_new [Hk, C, D], v_new [Hk, C, D]
      the block on C tokens at positions pos .. pos + C - 1, each attending to cache rows [0, pos) and
      causally to the chunk (itself and the chunk's earlier tokens); the caller writes k_new / v_new at
      rows pos .. pos + C - 1 of its cache (those < S). C = 1 is decode; a prompt of n tokens is
      ceil(n / C) chunks of C = the program's prefill chunk, the last one padded (causal: padding changes no
      earlier row, and its cache rows are >= n, overwritten by decode before they are read). So prefill
      costs the prompt's length rounded up to C, not seq_len. The cache goes in as it is and only the new
      rows come out (no [Hk, S, D] copy per call: an in-place cache update would need the cache inside the
      program, which the contract's runtimes cannot share with the app).
  head_logits(x [1, d])                -> logits [V]   final RMSNorm + LM head (vocabulary chunks, or
      one fused int4 call)

Attention, per kv head (G query heads q [G, C, D], c = 1/sqrt(D)), without concatenating the cache:
  s_c = c q K^T [G, C, S] (cache rows >= pos masked),  s_n = c q k_new^T [G, C, C] (future tokens masked)
  m = max(rowmax s_c, rowmax s_n)   (finite: the diagonal of s_n is never masked)
  o = (exp(s_c - m) V + exp(s_n - m) v_new) / (rowsum exp(s_c - m) + rowsum exp(s_n - m))
which is Qwen2's causal softmax attention at positions pos .. pos + C - 1 (`attention_with_cache`, the reference
of the native kernel `toolchain::attention_decode`). Projections go through `linear_forward` whole (no MLP
chunks: C rows are small).

With a fused `Compute` (ops/compute.py, `BlockParams.compute`: the fused methods of int4 programs) the block is
14 operator calls instead of ~170 portable ops: each projection with its bias, LoRA pair and residual add one
`toolchain::lora_linear_a8` (the packed int4 weight read once, x rounded to int8 per group), RMSNorm, SwiGLU and
RoPE with the heads' split one call each (`decode_ops.py`, the RoPE tables computed in the call from `pos`), and
the attention one `toolchain::attention_decode`; the head's RMSNorm one `toolchain::rms_norm`. The ops are those
of the native kernels' table (mesp/kernels.py, which registers them with PyTorch when `toolchain.mesp` is
imported).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.lora.weights import LoraPair
from toolchain.mesp.block import BlockParams
from toolchain.mesp.ops import RopeTables, linear_forward, rmsnorm_forward, rope_forward, rope_tables, swiglu_forward
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.quant import QuantWeight, int4_group, matmul_xwt

__all__ = ["block_decode", "head_logits", "decode_rope", "attention_with_cache"]


def _heads(x: Tensor, n: int) -> Tensor:
    t = x.shape[0]
    return x.reshape(t, n, -1).transpose(0, 1)                        # [T, n*D] -> [n, T, D]


def decode_rope(pos: Tensor, chunk: int, head_dim: int, theta: float, dtype: torch.dtype,
                inv_freq: Tensor | None = None) -> RopeTables:
    """cos/sin [C, D] at positions pos .. pos + C - 1 (`pos` [1] int64, a runtime input of the method);
    `inv_freq`: scaled frequencies (`ModelArch.rope_inv_freq`), None for plain RoPE."""
    return rope_tables(pos.reshape(1) + torch.arange(chunk), head_dim, theta, dtype, inv_freq)


def _qk_heads(x: Tensor, n: int, norm: Tensor | None, eps: float, rope: RopeTables) -> Tensor:
    """A q or k projection [C, n*D] -> heads [n, C, D], per-head RMSNorm'd (`norm` [D], qk_norm) and rotated."""
    x = _heads(x, n)
    if norm is not None:
        x = rmsnorm_forward(x, norm, eps)[0]                          # one row per (head, token): ops/head_norm.py
    return rope_forward(x, rope)


def _mlp(x1: Tensor, p: BlockParams) -> Tensor:
    w, s, c = p.weights, p.scale, p.compute
    n2, _ = rmsnorm_forward(x1, w.post_norm, p.arch.rms_eps)
    g, _ = linear_forward(n2, w.gate_proj, None, p.lora.get("gate_proj"), s, c)  # [C, f]
    u, _ = linear_forward(n2, w.up_proj, None, p.lora.get("up_proj"), s, c)      # [C, f]
    down, _ = linear_forward(swiglu_forward(g, u)[0], w.down_proj, None, p.lora.get("down_proj"), s, c)
    return down                                                                  # [C, d]


def _proj(x: Tensor, w: QuantWeight, bias: Tensor | None, lora: LoraPair | None, scale: float,
          residual: Tensor | None = None) -> Tensor:
    """residual + `linear_forward(x, w, bias, lora, scale)` as one `toolchain::lora_linear_a8` call."""
    a, b = (None, None) if lora is None else lora
    return torch.ops.toolchain.lora_linear_a8(x, w.q, w.scale, int4_group(w), bias, a, b, scale, residual)


def _fused_qk_heads(x: Tensor, n: int, norm: Tensor | None, pos: Tensor, p: BlockParams, rope: RopeTables
                    ) -> Tensor:
    """`_qk_heads` with the fused ops: the q/k norm is `toolchain::rms_norm` on the [C*n, D] view (it normalizes
    the last dim: one row per token and head), the heads' split with plain RoPE one `toolchain::rope_heads`;
    scaled RoPE (its frequencies are not `rope_heads`'s theta^(-2i/D)) is the stock split + `rope_forward` of
    the tables `rope`."""
    arch, ops = p.arch, torch.ops.toolchain
    c = x.shape[0]
    if norm is not None:
        x = ops.rms_norm(x.reshape(c * n, arch.head_dim), norm, arch.rms_eps).reshape(c, n * arch.head_dim)
    if arch.rope_scaling is not None:
        return rope_forward(_heads(x, n), rope)
    return ops.rope_heads(x, pos, n, arch.rope_theta)


def _block_decode_fused(x: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor, p: BlockParams,
                        rope: RopeTables) -> tuple[Tensor, Tensor, Tensor]:
    """`block_decode` in 14 operator calls, 13 of them native (decode_ops.py; toolchain/native/kernels.cpp; one
    `permute_copy` splits v into heads): the same graph with
    each projection, its bias, LoRA pair and residual add one call, RMSNorm, SwiGLU, and the heads' split with
    RoPE one call each; the RoPE tables are computed in the call from `pos` (plain RoPE: `rope` is then
    unused). q/k norms add two `toolchain::rms_norm` calls; scaled RoPE runs as stock ops (`_fused_qk_heads`)."""
    w, arch, lora, s = p.weights, p.arch, p.lora, p.scale
    hk, dh = arch.kv_heads, arch.head_dim
    ops = torch.ops.toolchain
    n1 = ops.rms_norm(x, w.input_norm, arch.rms_eps)
    q = _fused_qk_heads(_proj(n1, w.q_proj, w.q_bias, lora.get("q_proj"), s), arch.heads, w.q_norm, pos, p, rope)
    k = _fused_qk_heads(_proj(n1, w.k_proj, w.k_bias, lora.get("k_proj"), s), hk, w.k_norm, pos, p, rope)
    v = _heads(_proj(n1, w.v_proj, w.v_bias, lora.get("v_proj"), s), hk)                     # [Hk, C, D]
    o = ops.attention_decode(q, k, v, k_cache, v_cache, pos, dh ** -0.5)                               # [C, H*D]
    x1 = _proj(o, w.o_proj, None, lora.get("o_proj"), s, residual=x)
    n2 = ops.rms_norm(x1, w.post_norm, arch.rms_eps)
    g = _proj(n2, w.gate_proj, None, lora.get("gate_proj"), s)
    u = _proj(n2, w.up_proj, None, lora.get("up_proj"), s)
    return _proj(ops.swiglu(g, u), w.down_proj, None, lora.get("down_proj"), s, residual=x1), k, v


def block_decode(x: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor, p: BlockParams, rope: RopeTables
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """C tokens through the block with its KV cache.

    Args:
        x: [C, d] the tokens' hidden states (block input).
        pos: [1] int64 the first token's position (0-based); cache rows [0, pos) are attended to.
        k_cache, v_cache: [Hk, S, D] this layer's cache (k after RoPE).
        rope: the tables at pos .. pos + C - 1 (`decode_rope`).

    Returns:
        out [C, d], and the tokens' k (after RoPE) and v [Hk, C, D], to be written at rows pos .. pos + C - 1.
    """
    if p.compute.fused and isinstance(p.weights.q_proj, QuantWeight) and p.weights.q_proj.bits == 4:
        return _block_decode_fused(x, pos, k_cache, v_cache, p, rope)
    w, arch = p.weights, p.arch
    h, hk, dh = arch.heads, arch.kv_heads, arch.head_dim
    c = dh ** -0.5
    n1, _ = rmsnorm_forward(x, w.input_norm, arch.rms_eps)
    q, _ = linear_forward(n1, w.q_proj, w.q_bias, p.lora.get("q_proj"), p.scale, p.compute)
    k, _ = linear_forward(n1, w.k_proj, w.k_bias, p.lora.get("k_proj"), p.scale, p.compute)
    v, _ = linear_forward(n1, w.v_proj, w.v_bias, p.lora.get("v_proj"), p.scale, p.compute)
    q = _qk_heads(q, h, w.q_norm, arch.rms_eps, rope)                 # [H, C, D]
    k = _qk_heads(k, hk, w.k_norm, arch.rms_eps, rope)                # [Hk, C, D]
    v = _heads(v, hk)                                                 # [Hk, C, D]
    o = attention_with_cache(q, k, v, k_cache, v_cache, pos, c)       # [C, H*D]
    ao, _ = linear_forward(o, w.o_proj, None, p.lora.get("o_proj"), p.scale, p.compute)
    x1 = x + ao
    return x1 + _mlp(x1, p), k, v


def attention_with_cache(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor,
                         scale: float) -> Tensor:
    """Softmax attention of C tokens q [H, C, D] (after RoPE) at positions pos .. pos + C - 1 over cache rows
    [0, pos) and, causally, the chunk's own k, v [Hk, C, D] (see the module docstring). Returns [C, H*D], the
    heads in order. The reference of `toolchain::attention_decode`, the fused methods' native kernel."""
    hk, n, dh = k.shape
    g, s = q.shape[0] // hk, k_cache.shape[1]
    ignored = torch.arange(s, device=q.device) >= pos.reshape(1)      # [S] cache rows not yet written
    idx = torch.arange(n, device=q.device)
    future = idx[None, :] > idx[:, None]                              # [C, C] later tokens of the chunk
    outs = []
    for j in range(hk):
        qj = q[j * g:(j + 1) * g].reshape(g * n, dh)                  # [G*C, D]
        sc = (F.linear(qj, k_cache[j]) * scale).reshape(g, n, s)      # [G, C, S] (the cache read in place)
        sc = sc.masked_fill(ignored, float("-inf"))
        sn = (F.linear(qj, k[j]) * scale).reshape(g, n, n)            # [G, C, C]
        sn = sn.masked_fill(future, float("-inf"))
        m = torch.maximum(sc.amax(-1, keepdim=True), sn.amax(-1, keepdim=True))  # [G, C, 1]
        pc = torch.exp(sc - m)
        pn = torch.exp(sn - m)
        o = (pc @ v_cache[j] + pn @ v[j]) / (pc.sum(-1, keepdim=True) + pn.sum(-1, keepdim=True))  # [G, C, D]
        outs.append(o)
    return torch.cat(outs).transpose(0, 1).reshape(n, -1)             # heads in order: [C, H*D]


def head_logits(x: Tensor, final_norm: Tensor, head_chunks: list[Tensor | QuantWeight], eps: float,
                compute: Compute = FP32) -> Tensor:
    """Logits [V] of one position x [1, d]: final RMSNorm, then the LM head chunk by chunk (each chunk
    E_j [Vc, d] read in place: `linear`, or int4 `matmul_xwt`), concatenated. A fused `compute`: the norm is
    `toolchain::rms_norm`, an int4 chunk `toolchain::int4_linear_a8`."""
    hn = torch.ops.toolchain.rms_norm(x, final_norm, eps) if compute.fused else rmsnorm_forward(x, final_norm, eps)[0]
    return torch.cat([matmul_xwt(hn, e, compute) for e in head_chunks], dim=1).reshape(-1)
