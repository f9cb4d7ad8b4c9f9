"""Qwen3 and Llama 3 through the MeSP step, the block and the decode path, against Hugging Face
`Qwen3ForCausalLM` / `LlamaForCausalLM` + PEFT autograd in float64, on seeded random configs: head_dim !=
hidden / heads, q/k norms (qwen3), llama3 rope scaling with random factors (llama), tied and untied heads, MQA /
MHA / GQA, odd head counts, random subsets of the LoRA targets (helpers.random_family_arch / random_case)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_grads_close, assert_rel_close, build_case, random_case

from toolchain.mesp import StepOptions, block_forward, block_params, mesp_step, model_loss
from toolchain.mesp.block import block_rope
from toolchain.mesp.decode import block_decode, decode_rope

FAMILIES = ["qwen3", "llama"]
SEEDS = list(range(8))      # seed % 2: tied / untied; seed % 3: MQA, MHA, GQA (random_arch)
CASES = [pytest.param(family, seed, id=f"{family}-{random_case(seed, family)}") for family in FAMILIES for seed in SEEDS]
_STORE: dict = {}


def _case(family: str, seed: int):
    if (family, seed) not in _STORE:
        _STORE[family, seed] = build_case(seed, family)
    return _STORE[family, seed]


def test_the_cases_cover_what_the_families_add():
    archs = [random_case(seed, family).arch for family in FAMILIES for seed in SEEDS]
    assert all(a.head_dim * a.heads != a.hidden for a in archs)
    assert {a.tie_embeddings for a in archs} == {True, False}
    assert {(a.kv_heads == 1, a.kv_heads == a.heads) for a in archs} >= {(True, False), (False, True), (False, False)}
    assert any(a.heads % 2 for a in archs)
    for a in archs:
        assert a.qk_norm == (a.family == "qwen3") and not a.qkv_bias
        assert (a.rope_scaling is not None) == (a.family == "llama")


@pytest.mark.parametrize("options", [StepOptions(), StepOptions(loss_chunk=3, mlp_chunk=5)], ids=["default", "chunks"])
@pytest.mark.parametrize(("family", "seed"), CASES)
def test_mesp_step_matches_hf_peft_float64(family, seed, options):
    d = _case(family, seed)
    assert type(d.hf_model).__name__ == {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[family]
    if family == "qwen3":
        assert all(lw.q_norm is not None and lw.k_norm is not None and lw.q_bias is None for lw in d.weights.layers)
    res = mesp_step(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels, options=options)
    torch.testing.assert_close(res.loss, d.ref.loss)
    assert_grads_close(res.grads, d.ref.grads)
    assert_rel_close(res.grads, d.ref.grads, max_rel=1e-5)


@pytest.mark.parametrize(("family", "seed"), CASES[::2])
def test_model_loss_equals_hf(family, seed):
    d = _case(family, seed)
    loss = model_loss(d.case.arch, d.weights, d.case.lora, d.lora, d.input_ids, d.labels)
    torch.testing.assert_close(loss, d.ref.loss)


@pytest.mark.parametrize(("family", "seed"), CASES[::2])
def test_block_decode_in_chunks_equals_block_forward(family, seed):
    """The generation block (stock path) with a KV cache, the prompt in chunks of 3 and then token by token,
    gives block_forward's rows: q/k norms and scaled rope included."""
    d = _case(family, seed)
    a, t = d.case.arch, d.case.seq_len
    p = block_params(a, d.weights, d.case.lora, d.lora, 0)
    x = torch.randn(t, a.hidden, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = block_forward(x, p, block_rope(a, torch.arange(t), torch.float64))
    k_cache = torch.zeros(a.kv_heads, t, a.head_dim, dtype=torch.float64)
    v_cache = torch.zeros_like(k_cache)
    rows, pos = [], 0
    while pos < t:
        c = min(3, t - pos) if pos < t // 2 else 1
        pos_t = torch.tensor([pos])
        out, k, v = block_decode(x[pos:pos + c], pos_t, k_cache, v_cache, p,
                                 decode_rope(pos_t, c, a.head_dim, a.rope_theta, torch.float64, a.rope_inv_freq()))
        k_cache[:, pos:pos + c], v_cache[:, pos:pos + c] = k, v
        rows.append(out)
        pos += c
    torch.testing.assert_close(torch.cat(rows), expected)
