"""Generation with the live adapter: prefill, single-token decode with a KV cache, and the LM head on one
position. Forward only (no gradients), the same frozen weights and LoRA pairs as the training step.

Cache layout (one per layer, owned by the caller): k, v [Hk, S, D] float32, S = the program's seq_len,
k after RoPE (as attention uses it). Rows >= the current position are ignored (masked), so the caller
never has to clear them.

  block_kv(x [T, d])                   -> k [Hk, T, D], v [Hk, T, D]
      the layer's keys (after RoPE) and values of every position of the (padded) prompt, for block
      input x: the caller copies them into its cache. Prefill is `block_kv` + `block_forward` per layer
      (`block_prefill`; causal: a padded tail changes no earlier position). Exported programs reuse
      their training `block_forward` for it, so prefill costs one small method (an RMSNorm and two
      kv projections, ~2 kv_dim / (3d + 3f) of the block's FLOPs: 1.5% at Qwen2.5-0.5B), not a second
      block graph to export.
  block_decode(x [1, d], pos, k, v)    -> out [1, d], k_new [Hk, 1, D], v_new [Hk, 1, D]
      the block on the one token at position `pos`, attending to cache rows [0, pos) and to itself;
      the caller writes k_new / v_new into row `pos` of its cache. The cache goes in as it is and only
      the new rows come out (no [Hk, S, D] copy per token; an in-place cache update would need the
      cache inside the program, which the contract's runtimes cannot share with the app).
  head_logits(x [1, d])                -> logits [V]   final RMSNorm + LM head, vocabulary chunk by chunk

Decode attention, per kv head (G query heads q [G, D], c = 1/sqrt(D)), without concatenating the cache:
  s_c = c q K^T [G, S] (rows >= pos masked),  s_n = c q . k_new [G, 1],  m = max(rowmax s_c, s_n)
  o = (exp(s_c - m) V + exp(s_n - m) v_new) / (rowsum exp(s_c - m) + exp(s_n - m))
which is softmax attention over positions 0..pos (Qwen2's causal attention at the last position).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from toolchain.mesp.block import BlockParams, _mlp, block_forward
from toolchain.mesp.ops import RopeTables, linear_forward, rmsnorm_forward, rope_forward, rope_tables

__all__ = ["block_kv", "block_prefill", "block_decode", "head_logits", "decode_rope"]


def _heads(x: Tensor, n: int) -> Tensor:
    t = x.shape[0]
    return x.reshape(t, n, -1).transpose(0, 1)                        # [T, n*D] -> [n, T, D]


def block_kv(x: Tensor, p: BlockParams, rope: RopeTables) -> tuple[Tensor, Tensor]:
    """The layer's keys (after RoPE) and values [Hk, T, D] for block input x [T, d]."""
    w, arch = p.weights, p.arch
    n1, _ = rmsnorm_forward(x, w.input_norm, arch.rms_eps)
    k, _ = linear_forward(n1, w.k_proj, w.k_bias, p.lora.get("k_proj"), p.scale)
    v, _ = linear_forward(n1, w.v_proj, w.v_bias, p.lora.get("v_proj"), p.scale)
    return rope_forward(_heads(k, arch.kv_heads), rope), _heads(v, arch.kv_heads)


def block_prefill(x: Tensor, p: BlockParams, rope: RopeTables, mlp_chunk: int | None = None
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """`block_forward` over the (padded) prompt, plus the layer's k (after RoPE) and v [Hk, T, D]
    (`block_kv`: recomputed from x rather than taken out of `block_forward`, which keeps block.py's
    attention internals its own)."""
    k, v = block_kv(x, p, rope)
    return block_forward(x, p, rope, mlp_chunk), k, v


def decode_rope(pos: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> RopeTables:
    """cos/sin [1, D] at the position `pos` ([1] int64, a runtime input of the decode method)."""
    return rope_tables(pos.reshape(1), head_dim, theta, dtype)


def block_decode(x: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor, p: BlockParams, rope: RopeTables, *,
                 mlp_chunk: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One token through the block with its KV cache.

    Args:
        x: [1, d] the token's hidden state (block input).
        pos: [1] int64 its position (0-based); cache rows [0, pos) are attended to, the rest ignored.
        k_cache, v_cache: [Hk, S, D] this layer's cache (k after RoPE).
        rope: the tables at `pos` (`decode_rope`).

    Returns:
        out [1, d], and the token's k (after RoPE) and v [Hk, 1, D], to be written at row `pos`.
    """
    w, arch = p.weights, p.arch
    h, hk, dh = arch.heads, arch.kv_heads, arch.head_dim
    g = h // hk
    n1, _ = rmsnorm_forward(x, w.input_norm, arch.rms_eps)
    q, _ = linear_forward(n1, w.q_proj, w.q_bias, p.lora.get("q_proj"), p.scale)
    k, _ = linear_forward(n1, w.k_proj, w.k_bias, p.lora.get("k_proj"), p.scale)
    v, _ = linear_forward(n1, w.v_proj, w.v_bias, p.lora.get("v_proj"), p.scale)
    q = rope_forward(_heads(q, h), rope)                              # [H, 1, D]
    k = rope_forward(_heads(k, hk), rope)                             # [Hk, 1, D]
    v = _heads(v, hk)                                                 # [Hk, 1, D]
    c = dh ** -0.5
    s = k_cache.shape[1]
    ignored = torch.arange(s, device=x.device) >= pos.reshape(1)      # [S] rows not yet written
    outs = []
    for j in range(hk):
        qj = q[j * g:(j + 1) * g, 0]                                  # [G, D]
        sc = F.linear(qj, k_cache[j]) * c                             # [G, S] (the cache read in place)
        sc = sc.masked_fill(ignored, float("-inf"))
        sn = (qj * k[j]).sum(-1, keepdim=True) * c                    # [G, 1]
        m = torch.maximum(sc.amax(-1, keepdim=True), sn)              # finite: sn is
        pc = torch.exp(sc - m)                                        # [G, S]
        pn = torch.exp(sn - m)                                        # [G, 1]
        outs.append((pc @ v_cache[j] + pn * v[j]) / (pc.sum(-1, keepdim=True) + pn))  # [G, D]
    o = torch.cat(outs).reshape(1, h * dh)                            # heads in order: [1, H*D]
    ao, _ = linear_forward(o, w.o_proj, None, p.lora.get("o_proj"), p.scale)
    x1 = x + ao
    return x1 + _mlp(x1, p, mlp_chunk), k, v


def head_logits(x: Tensor, final_norm: Tensor, head_chunks: list[Tensor], eps: float) -> Tensor:
    """Logits [V] of one position x [1, d]: final RMSNorm, then the LM head chunk by chunk (each chunk
    E_j [Vc, d] read in place: `linear`), concatenated."""
    hn, _ = rmsnorm_forward(x, final_norm, eps)
    return torch.cat([F.linear(hn, e) for e in head_chunks], dim=1).reshape(-1)
