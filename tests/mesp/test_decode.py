"""mesp/decode.py (prefill, KV-cache decode, one-position head) against Hugging Face Qwen2 + PEFT in
float64, on random configs (GQA regimes, biases, tied and untied heads), and against block_forward."""

from __future__ import annotations

import pytest
import torch
from helpers import float64_faithful_hf, lora_for, our_weights, peft_wrap, random_arch, random_hf_model

from toolchain.lora import LoraConfig
from toolchain.mesp.block import BlockParams, block_forward
from toolchain.mesp.decode import block_decode, block_prefill, decode_rope, head_logits
from toolchain.mesp.ops import rope_tables
from toolchain.mesp.ops.quant import quantize, with_chunk_rows
from toolchain.models.weights import LayerWeights

CFG = LoraConfig(rank=3, alpha=5.0)


def _generate_logits(arch, weights, lora, ids: torch.Tensor, prompt_len: int, cache_len: int, mlp_chunk=None):
    """Logits at positions prompt_len-1 .. len(ids)-1: prefill over ids[:prompt_len] padded to cache_len,
    then one decode per further token (teacher forcing)."""
    dt = weights.embed.dtype
    arch_p = [BlockParams(weights.layers[i], lora[i], CFG.scale, arch) for i in range(arch.layers)]
    padded = torch.zeros(cache_len, dtype=torch.int64)
    padded[:prompt_len] = ids[:prompt_len]
    x = weights.embed[padded]
    rope = rope_tables(torch.arange(cache_len), arch.head_dim, arch.rope_theta, dt)
    caches = []
    for p in arch_p:
        x, k, v = block_prefill(x, p, rope, mlp_chunk)
        caches.append([k.clone(), v.clone()])
    chunks = list(weights.lm_head.split(7))
    out = [head_logits(x[prompt_len - 1:prompt_len], weights.final_norm, chunks, arch.rms_eps)]
    for pos in range(prompt_len, ids.shape[0]):
        x = weights.embed[ids[pos:pos + 1]]
        pos_t = torch.tensor([pos])
        rope1 = decode_rope(pos_t, arch.head_dim, arch.rope_theta, dt)
        for p, cache in zip(arch_p, caches):
            x, k, v = block_decode(x, pos_t, cache[0], cache[1], p, rope1, mlp_chunk=mlp_chunk)
            cache[0][:, pos:pos + 1] = k
            cache[1][:, pos:pos + 1] = v
        out.append(head_logits(x, weights.final_norm, chunks, arch.rms_eps))
    return torch.stack(out), caches


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_prefill_and_decode_equal_hf_peft_logits(seed):
    arch = random_arch(seed)
    gen = torch.Generator().manual_seed(seed)
    hf = random_hf_model(arch, gen)
    weights = our_weights(arch, hf, torch.float64)
    lora = lora_for(arch, CFG, seed)
    model = peft_wrap(hf, CFG, lora)
    n, prompt_len, cache_len = 12, 5, 16
    ids = torch.randint(0, arch.vocab, (n,), generator=gen)
    ours, caches = _generate_logits(arch, weights, lora, ids, prompt_len, cache_len, mlp_chunk=5)
    with torch.no_grad(), float64_faithful_hf():
        out = model(input_ids=ids[None], use_cache=True)
    ref = out.logits[0, prompt_len - 1:]
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 1e-11, (str(arch), err)
    # the cache rows written so far are HF's keys (after RoPE) and values
    pkv = out.past_key_values
    for i, (k, v) in enumerate(caches):
        hk, hv = pkv.layers[i].keys[0], pkv.layers[i].values[0]          # [Hk, n, D]
        assert torch.allclose(k[:, :n - 1], hk[:, :n - 1], rtol=0, atol=1e-11 * float(hk.abs().max()))
        assert torch.allclose(v[:, :n - 1], hv[:, :n - 1], rtol=0, atol=1e-11 * float(hv.abs().max()))


def test_prefill_output_is_block_forward_and_padding_does_not_leak():
    arch = random_arch(2)
    gen = torch.Generator().manual_seed(2)
    weights = our_weights(arch, random_hf_model(arch, gen), torch.float64)
    lora = lora_for(arch, CFG, 2)
    p = BlockParams(weights.layers[0], lora[0], CFG.scale, arch)
    x = torch.randn(10, arch.hidden, generator=gen, dtype=torch.float64)
    rope = rope_tables(torch.arange(10), arch.head_dim, arch.rope_theta, torch.float64)
    out, k, v = block_prefill(x, p, rope, 4)
    assert torch.equal(out, block_forward(x, p, rope, 4))
    assert k.shape == v.shape == (arch.kv_heads, 10, arch.head_dim)
    # decode at position 6 ignores cache rows >= 6, whatever they hold
    junk_k, junk_v = k.clone(), v.clone()
    junk_k[:, 6:] = 1e3
    junk_v[:, 6:] = -1e3
    pos = torch.tensor([6])
    r1 = decode_rope(pos, arch.head_dim, arch.rope_theta, torch.float64)
    a = block_decode(x[6:7], pos, k, v, p, r1, mlp_chunk=4)
    b = block_decode(x[6:7], pos, junk_k, junk_v, p, r1, mlp_chunk=4)
    assert all(torch.equal(s, t) for s, t in zip(a, b))
    # and equals the prefill's row 6 (same math, another order of summation)
    assert torch.allclose(a[0], out[6:7], rtol=0, atol=1e-12)
    assert torch.allclose(a[1], k[:, 6:7], rtol=0, atol=1e-12) and torch.allclose(a[2], v[:, 6:7], rtol=0, atol=1e-12)


def test_decode_with_quantized_weights_matches_dequantized():
    arch = random_arch(5)
    gen = torch.Generator().manual_seed(5)
    weights = our_weights(arch, random_hf_model(arch, gen), torch.float32)
    lw = weights.layers[0]
    group = 2
    quantized = {}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        w = getattr(lw, name)
        if w.shape[1] % group:
            pytest.skip("odd width")
        quantized[name] = with_chunk_rows(quantize(w, "int4", group), 64)
    from toolchain.mesp.ops.quant import dequantize

    qlw = lw._replace(**quantized)
    dlw = LayerWeights(**{f: dequantize(getattr(qlw, f)) if f in quantized else getattr(qlw, f)
                          for f in LayerWeights._fields})
    lora = lora_for(arch, CFG, 5, torch.float32)
    x = torch.randn(1, arch.hidden, generator=gen)
    k = torch.randn(arch.kv_heads, 8, arch.head_dim, generator=gen)
    v = torch.randn(arch.kv_heads, 8, arch.head_dim, generator=gen)
    pos = torch.tensor([3])
    r1 = decode_rope(pos, arch.head_dim, arch.rope_theta, torch.float32)
    a = block_decode(x, pos, k, v, BlockParams(qlw, lora[0], CFG.scale, arch), r1, mlp_chunk=4)
    b = block_decode(x, pos, k, v, BlockParams(dlw, lora[0], CFG.scale, arch), r1, mlp_chunk=None)
    for s, t in zip(a, b):
        assert torch.allclose(s, t, rtol=1e-5, atol=1e-5)
