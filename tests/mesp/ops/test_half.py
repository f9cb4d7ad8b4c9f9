"""`--compute fp16` (mesp/ops/half.py): the frozen-weight matmuls in float16, everything else float32.

The bound the option states (docs/benchmarks.md "`--compute fp16`"): on the same quantized weights, the LoRA
gradients of the float16 step against the float32 step have cosine >= 0.9999 and relative L2 error <= 1e-2,
and the losses agree to 1e-3 relative. Checked on random Qwen2.5-shaped configs (helpers.random_case,
widths made multiples of the quantization group) with int4 and int8 bases, quantized heads and not.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers import flat_grads, lora_for, our_weights, random_case, random_hf_model, random_labels

from toolchain.mesp import StepOptions, mesp_step
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.half import compute_weight, from_compute, to_compute
from toolchain.mesp.ops.quant import dequantize, matmul_dyw, matmul_xwt, quantize, with_chunk_rows
from toolchain.program.spec import QUANTIZED_FIELDS

COSINE_MIN = 0.9999
REL_L2_MAX = 1e-2
LOSS_REL_MAX = 1e-3


def _quantized(weights, kind: str, group: int, chunk_elems: int, head: bool):
    layers = []
    for lw in weights.layers:
        d = lw._asdict()
        for name in QUANTIZED_FIELDS:
            d[name] = with_chunk_rows(quantize(d[name].float(), kind, group), chunk_elems)
        layers.append(type(lw)(**d))
    w = weights._replace(layers=tuple(layers))
    if head:   # the int4 programs' quantized embedding / head
        e = quantize(weights.embed.float(), "int4", group)
        lm = e if weights.tied else quantize(weights.lm_head.float(), "int4", group)
        w = w._replace(embed=e, lm_head=lm)
    return w


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1).double() for g in flat_grads(grads).values()])


@pytest.mark.parametrize("seed", range(8))
def test_fp16_step_gradients_are_within_the_stated_bound_of_fp32(seed):
    case = random_case(seed)
    group = 2
    arch = dataclasses.replace(case.arch, intermediate=case.arch.intermediate + case.arch.intermediate % 2)
    gen = torch.Generator().manual_seed(seed)
    hf = random_hf_model(arch, gen, dtype=torch.float32)
    kind = "int4" if seed % 2 == 0 else "int8"
    weights = _quantized(our_weights(arch, hf, torch.float32), kind, group, chunk_elems=64, head=seed % 4 == 0)
    lora = lora_for(arch, case.lora, seed=seed, dtype=torch.float32)
    # at least 8 tokens: with 2 (seed 6) the only target is position 0's, whose prediction does not depend on
    # q or k, so the q/k LoRA gradients are zero in float64 and both float32 and float16 return rounding noise
    ids = torch.randint(0, arch.vocab, (max(case.seq_len, 8),), generator=gen)
    labels = random_labels(ids, gen)
    opts = StepOptions(vocab_chunk=7, mlp_chunk=4) if seed % 3 else StepOptions()
    r32 = mesp_step(arch, weights, case.lora, lora, ids, labels, options=opts)
    r16 = mesp_step(arch, weights, case.lora, lora, ids, labels, options=opts, compute=Compute("fp16"))
    a, b = _flat(r32.grads), _flat(r16.grads)
    cos = float(a @ b / (a.norm() * b.norm()))
    rel = float((b - a).norm() / a.norm())
    loss_rel = abs(float(r16.loss) - float(r32.loss)) / abs(float(r32.loss))
    print(f"{case}: cosine {cos:.7f}, rel L2 {rel:.2e}, loss rel {loss_rel:.1e}")
    assert cos >= COSINE_MIN and rel <= REL_L2_MAX and loss_rel <= LOSS_REL_MAX
    assert not torch.equal(a, b)          # the float16 path did run (its rounding shows)
    assert r16.loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in flat_grads(r16.grads).values())


def test_with_fp32_compute_every_helper_is_the_identity():
    x, w = torch.randn(5, 8), torch.randn(6, 8)
    qw = quantize(w, "int4", 4)
    assert not FP32.half
    assert (to_compute(x, FP32) is x and from_compute(x, FP32) is x and compute_weight(w, FP32) is w
            and compute_weight(qw, FP32) is qw)
    assert torch.equal(matmul_xwt(x, qw), F.linear(x, dequantize(qw)))


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_with_fp16_compute_products_are_float16_products_summed_in_float32(kind):
    """matmul_xwt = cast(float16 x @ float16 chunk^T) per chunk; matmul_dyw sums each chunk's float16 product in
    float32; the weight chunk is q * s in float16 (s cast to float16)."""
    g = torch.Generator().manual_seed(0)
    x, dy, w = torch.randn(7, 16, generator=g), torch.randn(7, 12, generator=g), torch.randn(12, 16, generator=g)
    qw = with_chunk_rows(quantize(w, kind, 8), 5 * 16)       # at most 5 rows a chunk: 3 chunks of 4
    assert qw.chunk_rows == 4
    half_w = dequantize(qw._replace(scale=qw.scale.half()))
    assert half_w.dtype == torch.float16
    fp16 = Compute("fp16")
    assert fp16.half
    y, dx = matmul_xwt(x, qw, fp16), matmul_dyw(dy, qw, fp16)
    assert y.dtype == dx.dtype == torch.float32
    assert torch.equal(y, F.linear(x.half(), half_w).float())
    want = sum((dy[:, a:b].half() @ half_w[a:b]).float() for a, b in ((0, 4), (4, 8), (8, 12)))
    assert torch.equal(dx, want)
    assert not torch.equal(y, F.linear(x, dequantize(qw)))   # float32 would differ


def test_compute_is_a_value_not_a_setting():
    """Precision travels as an argument: a Compute is immutable, checked, and nothing is left behind by a call."""
    fp16 = Compute("fp16", fused=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fp16.precision = "fp32"
    with pytest.raises(ValueError, match="unknown compute precision"):
        Compute("bf16")
    x = torch.randn(3, 8)
    qw = quantize(torch.randn(4, 8), "int8", 4)
    assert matmul_xwt(x, qw, fp16).dtype == torch.float32
    assert torch.equal(matmul_xwt(x, qw), F.linear(x, dequantize(qw)))   # the default after an fp16 call
