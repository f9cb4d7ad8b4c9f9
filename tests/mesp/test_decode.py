"""mesp/decode.py (chunked prefill, KV-cache decode, one-position head) against Hugging Face Qwen2 + PEFT in
float64, on random configs (GQA regimes, biases, tied and untied heads), and against block_forward."""

from __future__ import annotations

import pytest
import torch
from helpers import float64_faithful_hf, lora_for, our_weights, peft_wrap, random_arch, random_hf_model

from toolchain.lora import LoraConfig
from toolchain.mesp.block import BlockParams, block_forward
from toolchain.mesp.decode import block_decode, decode_rope, head_logits
from toolchain.mesp.ops import rmsnorm_forward, rope_tables
from toolchain.mesp.ops.compute import Compute
from toolchain.mesp.ops.quant import dequantize, quant_rows, quantize, quantize_activations, with_chunk_rows
from toolchain.models.weights import LayerWeights

CFG = LoraConfig(rank=3, alpha=5.0)


def _generate_logits(arch, weights, lora, ids: torch.Tensor, prompt_len: int, cache_len: int, chunk: int):
    """Logits at positions prompt_len-1 .. len(ids)-1: prefill of ids[:prompt_len] in chunks of `chunk`
    (the last padded with zeros), then one decode per further token (teacher forcing)."""
    dt = weights.final_norm.dtype
    arch_p = [BlockParams(weights.layers[i], lora[i], CFG.scale, arch) for i in range(arch.layers)]
    caches = [[torch.zeros(arch.kv_heads, cache_len, arch.head_dim, dtype=dt) for _ in range(2)] for _ in arch_p]

    def step(tokens: torch.Tensor, pos: int) -> torch.Tensor:
        x = weights.embed[tokens]
        pos_t = torch.tensor([pos])
        rope = decode_rope(pos_t, tokens.shape[0], arch.head_dim, arch.rope_theta, dt)
        for p, cache in zip(arch_p, caches):
            x, k, v = block_decode(x, pos_t, cache[0], cache[1], p, rope)
            n = min(tokens.shape[0], cache_len - pos)
            cache[0][:, pos:pos + n], cache[1][:, pos:pos + n] = k[:, :n], v[:, :n]
        return x

    chunks = list(weights.lm_head.split(7))
    for start in range(0, prompt_len, chunk):
        tokens = torch.zeros(chunk, dtype=torch.int64)
        tokens[:min(chunk, prompt_len - start)] = ids[start:min(start + chunk, prompt_len)]
        x = step(tokens, start)
    last = (prompt_len - 1) % chunk
    out = [head_logits(x[last:last + 1], weights.final_norm, chunks, arch.rms_eps)]
    for pos in range(prompt_len, ids.shape[0]):
        out.append(head_logits(step(ids[pos:pos + 1], pos), weights.final_norm, chunks, arch.rms_eps))
    return torch.stack(out), caches


@pytest.mark.parametrize("seed,chunk", [(0, 1), (1, 2), (2, 3), (3, 5), (4, 8), (5, 16)])
def test_chunked_prefill_and_decode_equal_hf_peft_logits(seed, chunk):
    arch = random_arch(seed)
    gen = torch.Generator().manual_seed(seed)
    hf = random_hf_model(arch, gen)
    weights = our_weights(arch, hf, torch.float64)
    lora = lora_for(arch, CFG, seed)
    model = peft_wrap(hf, CFG, lora)
    n, prompt_len, cache_len = 12, 7, 16
    ids = torch.randint(0, arch.vocab, (n,), generator=gen)
    ours, caches = _generate_logits(arch, weights, lora, ids, prompt_len, cache_len, chunk)
    with torch.no_grad(), float64_faithful_hf():
        out = model(input_ids=ids[None], use_cache=True)
    ref = out.logits[0, prompt_len - 1:]
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 1e-11, (str(arch), chunk, err)
    # the cache rows written so far are HF's keys (after RoPE) and values
    pkv = out.past_key_values
    for i, (k, v) in enumerate(caches):
        hk, hv = pkv.layers[i].keys[0], pkv.layers[i].values[0]          # [Hk, n, D]
        assert torch.allclose(k[:, :n - 1], hk[:, :n - 1], rtol=0, atol=1e-11 * float(hk.abs().max()))
        assert torch.allclose(v[:, :n - 1], hv[:, :n - 1], rtol=0, atol=1e-11 * float(hv.abs().max()))


def test_a_chunk_equals_block_forward_and_ignores_cache_rows_from_pos():
    arch = random_arch(2)
    gen = torch.Generator().manual_seed(2)
    weights = our_weights(arch, random_hf_model(arch, gen), torch.float64)
    lora = lora_for(arch, CFG, 2)
    p = BlockParams(weights.layers[0], lora[0], CFG.scale, arch)
    x = torch.randn(10, arch.hidden, generator=gen, dtype=torch.float64)
    rope = rope_tables(torch.arange(10), arch.head_dim, arch.rope_theta, torch.float64)
    empty = torch.zeros(arch.kv_heads, 12, arch.head_dim, dtype=torch.float64)
    pos0 = torch.tensor([0])
    out, k, v = block_decode(x, pos0, empty, empty, p, decode_rope(pos0, 10, arch.head_dim, arch.rope_theta,
                                                                    torch.float64))
    assert torch.allclose(out, block_forward(x, p, rope, 4), rtol=0, atol=1e-12)  # the whole prompt as one chunk
    assert k.shape == v.shape == (arch.kv_heads, 10, arch.head_dim)
    cache_k, cache_v = empty.clone(), empty.clone()
    cache_k[:, :10], cache_v[:, :10] = k, v
    # a chunk at position 6 ignores cache rows >= 6, whatever they hold, and equals the prefill's rows 6..9
    junk_k, junk_v = cache_k.clone(), cache_v.clone()
    junk_k[:, 6:] = 1e3
    junk_v[:, 6:] = -1e3
    pos = torch.tensor([6])
    r4 = decode_rope(pos, 4, arch.head_dim, arch.rope_theta, torch.float64)
    a = block_decode(x[6:10], pos, cache_k, cache_v, p, r4)
    b = block_decode(x[6:10], pos, junk_k, junk_v, p, r4)
    assert all(torch.equal(s, t) for s, t in zip(a, b))
    assert torch.allclose(a[0], out[6:10], rtol=0, atol=1e-12)
    assert torch.allclose(a[1], k[:, 6:10], rtol=0, atol=1e-12) and torch.allclose(a[2], v[:, 6:10], rtol=0, atol=1e-12)


def _quantized_layer(lw: LayerWeights, group: int) -> tuple[LayerWeights, LayerWeights]:
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    quantized = {n: with_chunk_rows(quantize(getattr(lw, n), "int4", group), 64) for n in names}
    qlw = lw._replace(**quantized)
    dlw = lw._replace(**{n: dequantize(q) for n, q in quantized.items()})
    return qlw, dlw


@pytest.mark.parametrize("chunk", [1, 3])
def test_decode_with_int4_weights_stock_and_fused_match_dequantized(chunk):
    """The int4 block through the stock ops (row-chunk dequantization) equals the block on the dequantized
    float weights; with a fused `Compute` (the custom ops' PyTorch implementations: W4A8 projections and the
    attention op) it differs from it only by the activations' int8 rounding (bounded exactly per projection
    in tests/mesp/ops/test_quant.py; here the whole block stays within 2% of its largest output)."""
    arch = random_arch(5)
    gen = torch.Generator().manual_seed(5)
    weights = our_weights(arch, random_hf_model(arch, gen), torch.float32)
    group = next(g for g in (8, 4, 2) if arch.hidden % g == 0 and arch.intermediate % g == 0)
    qlw, dlw = _quantized_layer(weights.layers[0], group)
    lora = lora_for(arch, CFG, 5, torch.float32)
    x = torch.randn(chunk, arch.hidden, generator=gen)
    k = torch.randn(arch.kv_heads, 8, arch.head_dim, generator=gen)
    v = torch.randn(arch.kv_heads, 8, arch.head_dim, generator=gen)
    pos = torch.tensor([3])
    r = decode_rope(pos, chunk, arch.head_dim, arch.rope_theta, torch.float32)
    ref = block_decode(x, pos, k, v, BlockParams(dlw, lora[0], CFG.scale, arch), r)
    stock = block_decode(x, pos, k, v, BlockParams(qlw, lora[0], CFG.scale, arch), r)
    fused = block_decode(x, pos, k, v, BlockParams(qlw, lora[0], CFG.scale, arch, Compute(fused=True)), r)
    for s, f, t in zip(stock, fused, ref):
        torch.testing.assert_close(s, t)
        assert not torch.equal(f, s)                                       # the activations were rounded
        torch.testing.assert_close(f, t, rtol=0, atol=0.02 * float(t.abs().max()))


def test_head_logits_of_an_int4_head_in_chunks_or_fused_equal_the_dequantized_head():
    gen = torch.Generator().manual_seed(9)
    vocab, d = 37, 16
    head = quantize(torch.randn(vocab, d, generator=gen), "int4", 4)
    x, norm = torch.randn(1, d, generator=gen), torch.rand(d, generator=gen) + 0.5
    ref = head_logits(x, norm, [dequantize(head)], 1e-6)
    chunks = [quant_rows(head, s, min(vocab, s + 10)) for s in range(0, vocab, 10)]
    torch.testing.assert_close(head_logits(x, norm, chunks, 1e-6), ref)
    fused = head_logits(x, norm, [head], 1e-6, Compute(fused=True))
    # W4A8: the normed x rounded to int8 per group moves each logit by at most sum_g sa_g / 2 * sum |w| there
    hn, _ = rmsnorm_forward(x, norm, 1e-6)
    _, sa = quantize_activations(hn, 4)
    w_abs = dequantize(head).double().abs().reshape(vocab, -1, 4).sum(-1)                       # [V, ng]
    bound = (sa.double() / 2 * (1 + 2 ** -20)) @ w_abs.T + 1e-6 * float(ref.abs().max())        # [1, V]
    assert bool(((fused.double() - ref.double()).abs() <= bound.reshape(-1)).all())
    assert not torch.equal(fused, ref)
