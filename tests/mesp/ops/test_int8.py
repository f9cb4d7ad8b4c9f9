"""`--compute int8` (mesp/ops/quant.py, ops/compute.py): every int4 frozen-weight matmul of the step on int8
activations with exact integer sums (`toolchain::int4_linear_a8` for x W^T, `toolchain::int4_dyw_a8` for dy W),
everything else float32.

The bound the option states (docs/benchmarks.md "`--compute int8`"), against the float64 step on the same int4
weights (the fp32 oracle's math, without float32 rounding): LoRA gradient cosine >= 0.999 and relative L2 error
<= 5e-2, loss relative error <= 1e-2. Checked on random configs of every family (qwen2, qwen3, llama: tied and
untied, q/k/v biases, q/k norms, MQA / MHA / GQA, random LoRA targets; helpers.random_case) whose widths are
scaled to at least 64 with int4 group 16: the activations' rounding error of a dot product over n terms, relative
to the product, falls as 1/sqrt(n / group), so at the helpers' toy widths (hidden 4 to 40, one or two groups per
row) the same arithmetic misses the bound through the LM head's logits (seen: cosine 0.995 at hidden 4), while
Qwen2.5-0.5B (hidden 896, group 64) is 14 groups per row; docs/benchmarks.md gives the measured figures.
Both variants are held to the bound: int8 dX (the default) and `int8_dx=False` (dX float32).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers import flat_grads, lora_for, max_op_output_numel, our_weights, random_case, random_hf_model, random_labels

from toolchain.mesp import StepOptions, mesp_step
from toolchain.mesp.ops.compute import FP32, Compute
from toolchain.mesp.ops.quant import (QuantWeight, dequantize, int4_dyw_a8_reference, int4_linear_a8_reference,
                                      matmul_dyw, matmul_xwt, quant_cols, quant_rows, quantize, with_chunk_rows)
from toolchain.program.spec import QUANTIZED_FIELDS

COSINE_MIN = 0.999
REL_L2_MAX = 5e-2
LOSS_REL_MAX = 1e-2
GROUP = 16
FAMILIES = ("qwen2", "qwen3", "llama")


def wide_arch(arch):
    """`arch` with hidden, head_dim and intermediate scaled by the least m that makes hidden >= 64 and hidden and
    the query width multiples of GROUP (the intermediate rounded up to one): same heads, layers, vocab, tying."""
    m = next(m for m in range(1, 129) if arch.hidden * m >= 64 and arch.hidden * m % GROUP == 0
             and arch.q_dim * m % GROUP == 0)
    return dataclasses.replace(arch, hidden=arch.hidden * m, head_dim=arch.head_dim * m,
                               intermediate=-(-arch.intermediate * m // GROUP) * GROUP)


def int4_weights(weights, dtype: torch.dtype):
    """The projections, embedding and head in int4 (group GROUP), as an int4 program has them; the scales in
    `dtype` (the float64 oracle runs on the same int4 values)."""
    def q(w: torch.Tensor) -> QuantWeight:
        qw = with_chunk_rows(quantize(w.float(), "int4", GROUP), 256)
        return qw._replace(scale=qw.scale.to(dtype))

    layers = []
    for lw in weights.layers:
        d = lw._asdict()
        for name in QUANTIZED_FIELDS:
            d[name] = q(d[name])
        layers.append(type(lw)(**d))
    e = q(weights.embed)
    return weights._replace(layers=tuple(layers), embed=e, lm_head=e if weights.tied else q(weights.lm_head))


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1).double() for g in flat_grads(grads).values()])


def _case(family: str, seed: int):
    case = random_case(seed, family)
    arch = wide_arch(case.arch)
    gen = torch.Generator().manual_seed(seed)
    hf = random_hf_model(arch, gen, dtype=torch.float64)
    w64, w32 = (int4_weights(our_weights(arch, hf, dt), dt) for dt in (torch.float64, torch.float32))
    lora64, lora32 = (lora_for(arch, case.lora, seed=seed, dtype=dt) for dt in (torch.float64, torch.float32))
    ids = torch.randint(0, arch.vocab, (max(case.seq_len, 8),), generator=gen)
    return case, arch, w64, w32, lora64, lora32, ids, random_labels(ids, gen)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(6))
def test_int8_step_gradients_are_within_the_stated_bound_of_the_float64_step(family, seed):
    case, arch, w64, w32, lora64, lora32, ids, labels = _case(family, seed)
    opts = StepOptions(vocab_chunk=7, mlp_chunk=32) if seed % 2 else StepOptions()
    ref = mesp_step(arch, w64, case.lora, lora64, ids, labels, options=opts)
    a = _flat(ref.grads)
    for compute in (Compute("int8"), Compute("int8", int8_dx=False)):
        res = mesp_step(arch, w32, case.lora, lora32, ids, labels, options=opts, compute=compute)
        b = _flat(res.grads)
        cos = float(a @ b / (a.norm() * b.norm()))
        rel = float((b - a).norm() / a.norm())
        loss_rel = abs(float(res.loss) - float(ref.loss)) / abs(float(ref.loss))
        print(f"{family} {case} d{arch.hidden} int8_dx={compute.int8_dx}: cosine {cos:.6f}, rel L2 {rel:.2e}, "
              f"loss rel {loss_rel:.1e}")
        assert cos >= COSINE_MIN and rel <= REL_L2_MAX and loss_rel <= LOSS_REL_MAX
        assert res.loss.dtype == torch.float32
    fp32 = _flat(mesp_step(arch, w32, case.lora, lora32, ids, labels, options=opts).grads)
    assert float((fp32 - a).norm() / a.norm()) < 1e-4 < rel     # the int8 rounding shows; float32's does not


def test_the_cases_cover_every_family_feature():
    archs = [wide_arch(random_case(seed, f).arch) for f in FAMILIES for seed in range(6)]
    assert {a.tie_embeddings for a in archs} == {True, False}
    assert {a.family for a in archs if a.qk_norm} == {"qwen3"} and any(a.qkv_bias for a in archs)
    assert {(a.kv_heads == 1, a.kv_heads == a.heads) for a in archs} >= {(True, False), (False, True), (False, False)}
    assert all(a.hidden >= 64 and a.hidden % GROUP == 0 and a.intermediate % GROUP == 0 for a in archs)


def test_int8_matmuls_are_the_w4a8_ops_and_the_fp32_default_is_untouched():
    """x W^T and dy W of an int4 W under int8 compute are the two ops' references (W read whole, chunk_rows
    ignored); int8 weights and dense ones stay float32; Compute() is still the stock float32 computation."""
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(5, 48, generator=g), torch.randn(5, 20, generator=g)
    w = torch.randn(20, 48, generator=g)
    qw = with_chunk_rows(quantize(w, "int4", GROUP), 4 * 48)
    int8 = Compute("int8")
    assert int8.int8 and int8.int8_dyw and not Compute("int8", int8_dx=False).int8_dyw and not FP32.int8
    assert torch.equal(matmul_xwt(x, qw, int8), int4_linear_a8_reference(x, qw.q, qw.scale, GROUP))
    assert torch.equal(matmul_dyw(dy, qw, int8), int4_dyw_a8_reference(dy, qw.q, qw.scale, GROUP))
    dense_dx = matmul_dyw(dy, qw)
    assert torch.equal(matmul_dyw(dy, qw, Compute("int8", int8_dx=False)), dense_dx)
    assert not torch.equal(matmul_dyw(dy, qw, int8), dense_dx)
    q8 = quantize(w, "int8", GROUP)
    assert torch.equal(matmul_xwt(x, q8, int8), matmul_xwt(x, q8)) and torch.equal(matmul_xwt(x, w, int8), F.linear(x, w))
    assert torch.equal(matmul_xwt(x, qw), F.linear(x, dequantize(qw)))


def test_quant_cols_are_the_columns_still_quantized():
    w = torch.randn(6, 64)
    qw = quantize(w, "int4", GROUP)
    for a, b in ((0, 16), (16, 48), (48, 64)):
        assert torch.equal(dequantize(quant_cols(qw, a, b)), dequantize(qw)[:, a:b])
    assert torch.equal(dequantize(quant_rows(qw, 2, 5)), dequantize(qw)[2:5])
    with pytest.raises(ValueError, match="does not align"):
        quant_cols(qw, 8, 24)


def test_int8_chunks_still_bound_the_transients():
    """mlp_chunk and the vocabulary chunks bound the int8 step's tensors as they bound the float32 step's (no
    [T, f] or [T, V] tensor), and no weight is dequantized: the only int4 unpacking left is the embedding's
    lookup of T rows (and the head's target rows), the ops read the int4 bytes in place."""
    case = random_case(3)
    arch = dataclasses.replace(wide_arch(case.arch), intermediate=8 * GROUP, vocab=97)
    gen = torch.Generator().manual_seed(1)
    w32 = int4_weights(our_weights(arch, random_hf_model(arch, gen, dtype=torch.float32), torch.float32), torch.float32)
    lora32 = lora_for(arch, case.lora, seed=1, dtype=torch.float32)
    t = 40
    ids = torch.randint(0, arch.vocab, (t,), generator=gen)
    opts = StepOptions(vocab_chunk=16, mlp_chunk=GROUP)
    largest, shapes, _ = max_op_output_numel(mesp_step, arch, w32, case.lora, lora32, ids, ids, options=opts,
                                             compute=Compute("int8"))
    # the attention's gradients come out of `toolchain::attention_train_backward` stacked: dq, dk, dv [H + 2 Hk, T, D]
    assert largest <= max(t * arch.hidden, t * t, t * (arch.q_dim + 2 * arch.kv_dim)), \
        sorted(((op, s) for op, s in shapes if s), key=lambda s: -s[1][0])[:3]
    unpacked = [s for op, s in shapes if "bitwise_and" in op]
    assert unpacked and all(s[0] == t for s in unpacked), unpacked
    assert any("int4_dyw_a8" in op for op, _ in shapes) and any("int4_linear_a8" in op for op, _ in shapes)
