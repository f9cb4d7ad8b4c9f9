"""One decoder block: forward vs Hugging Face's Qwen2DecoderLayer, MeSP backward vs autograd."""

from __future__ import annotations

import pytest
import torch
from helpers import CASE_SEEDS, assert_grads_close, float64_faithful_hf, max_op_output_numel, random_case

from toolchain.baselines.autograd import grads_of, leaf_lora
from toolchain.mesp import BlockParams, block_backward, block_forward, block_params
from toolchain.mesp.ops import rope_tables

CASES = [pytest.param(seed, id=str(random_case(seed))) for seed in CASE_SEEDS[:6]]


def _decoder_layers(peft_model):
    return peft_model.base_model.model.model.layers


@pytest.mark.parametrize("seed", CASES)
def test_block_forward_matches_qwen2_decoder_layer(case_data, seed):
    """Each HF decoder layer's input and output, captured inside a full HF + PEFT forward."""
    d = case_data(seed)
    a = d.case.arch
    captured = {}

    def hook(i):
        def fn(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            out = output[0] if isinstance(output, tuple) else output
            captured[i] = (x[0].detach(), out[0].detach())
        return fn

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True)
               for i, layer in enumerate(_decoder_layers(d.peft_model))]
    try:
        with torch.no_grad(), float64_faithful_hf():
            d.peft_model(input_ids=d.input_ids[None])
    finally:
        for h in handles:
            h.remove()
    assert sorted(captured) == list(range(a.layers))
    rope = rope_tables(torch.arange(d.case.seq_len), a.head_dim, a.rope_theta, torch.float64)
    for i, (x, expected) in captured.items():
        p = block_params(a, d.weights, d.case.lora, d.lora, i)
        for mlp_chunk in (None, 3):
            torch.testing.assert_close(block_forward(x, p, rope, mlp_chunk), expected)


@pytest.mark.parametrize("mlp_chunk", [None, 1, 4, 1000])
@pytest.mark.parametrize("seed", CASES)
def test_block_backward_matches_autograd(case_data, seed, mlp_chunk):
    d = case_data(seed)
    a, cfg = d.case.arch, d.case.lora
    t = d.case.seq_len
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, a.hidden, generator=gen, dtype=torch.float64)
    dout = torch.randn(t, a.hidden, generator=gen, dtype=torch.float64)
    rope = rope_tables(torch.arange(t), a.head_dim, a.rope_theta, torch.float64)
    layer = a.layers - 1
    leaves = leaf_lora(d.lora)
    xr = x.clone().requires_grad_()
    out = block_forward(xr, block_params(a, d.weights, cfg, leaves, layer), rope)
    (dx_expected,) = torch.autograd.grad(out, xr, dout, retain_graph=True)
    out.backward(dout)
    expected = grads_of(leaves)[layer]

    dx, grads = block_backward(dout, x, block_params(a, d.weights, cfg, d.lora, layer), rope, mlp_chunk)
    torch.testing.assert_close(dx, dx_expected)
    assert list(grads) == list(cfg.targets)
    assert_grads_close({f"{k}.{w}": getattr(g, w) for k, g in grads.items() for w in "ab"},
                       {f"{k}.{w}": getattr(g, w) for k, g in expected.items() for w in "ab"})


def test_block_backward_without_lora_returns_dx_only(case_data):
    d = case_data(CASE_SEEDS[1])
    a = d.case.arch
    t = d.case.seq_len
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(t, a.hidden, generator=gen, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(t, a.hidden, generator=gen, dtype=torch.float64)
    rope = rope_tables(torch.arange(t), a.head_dim, a.rope_theta, torch.float64)
    p = BlockParams(d.weights.layers[0], {}, 1.0, a)
    (expected,) = torch.autograd.grad(block_forward(x, p, rope), x, dout)
    dx, grads = block_backward(dout, x.detach(), p, rope)
    assert grads == {}
    torch.testing.assert_close(dx, expected)


def test_block_backward_never_forms_full_mlp_tensors_with_chunks(case_data):
    """mlp_chunk C: the MLP's [T, C] tensors replace [T, f] ones in the whole block backward (no op
    output has f columns, and some have C), and no weight is copied whole."""
    d = case_data(CASE_SEEDS[2])
    a = d.case.arch
    t = d.case.seq_len
    rope = rope_tables(torch.arange(t), a.head_dim, a.rope_theta, torch.float64)
    x = torch.randn(t, a.hidden, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = block_params(a, d.weights, d.case.lora, d.lora, 0)
    c = 5
    assert c < a.intermediate
    _, shapes, _ = max_op_output_numel(block_backward, torch.ones_like(x), x, p, rope, c)
    two_d = [s for _, s in shapes if len(s) == 2]
    assert (t, c) in two_d
    r = d.case.lora.rank
    lora_shapes = {(r, a.intermediate), (a.intermediate, r)}   # down's dA and gate/up's dB: parameter-sized
    assert not [s for s in two_d if a.intermediate in s and s not in lora_shapes], "a [T, f] or [f, d] tensor was formed"
