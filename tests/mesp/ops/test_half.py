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
from toolchain.mesp.ops import half
from toolchain.mesp.ops.half import REDUCTION_CHUNK, HalfOperand, compute_weight, linear, matmul, to_compute
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
    assert to_compute(x, FP32) is x and compute_weight(w, FP32) is w and compute_weight(qw, FP32) is qw
    assert torch.equal(linear(x, w, FP32), F.linear(x, w)) and torch.equal(matmul(x, w.T, FP32), x @ w.T)
    assert torch.equal(matmul_xwt(x, qw), F.linear(x, dequantize(qw)))


def _row_scale(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().amax(dim=1, keepdim=True)
    return torch.where(amax > 0, amax, torch.ones_like(amax))


def _fp16_product(x: torch.Tensor, w16: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
    """The definition in ops/half.py, written out: rows scaled by s (default: to max |x| = 1), float16
    products over slices of REDUCTION_CHUNK columns, each cast to float32, summed in float32, times s."""
    s = _row_scale(x) if s is None else s
    xh = (x / s).half()
    out = torch.zeros(x.shape[0], w16.shape[0])
    for a in range(0, x.shape[1], REDUCTION_CHUNK):
        out = out + (xh[:, a:a + REDUCTION_CHUNK] @ w16[:, a:a + REDUCTION_CHUNK].T).float()
    return out * s


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("width", [16, 2 * REDUCTION_CHUNK + 48])
def test_with_fp16_compute_products_are_scaled_float16_slices_summed_in_float32(kind, width):
    """matmul_xwt = the scaled, sliced float16 product per row chunk of W; matmul_dyw sums each row chunk's
    product in float32; the weight chunk is q * s in float16 (s cast to float16)."""
    g = torch.Generator().manual_seed(0)
    x, dy, w = torch.randn(7, width, generator=g), torch.randn(7, 12, generator=g), torch.randn(12, width, generator=g)
    x[2] = 0.0                                                # an all-zero row keeps scale 1 (no 0 / 0)
    qw = with_chunk_rows(quantize(w, kind, 8), 5 * width)    # at most 5 rows a chunk: 3 chunks of 4
    assert qw.chunk_rows == 4
    half_w = dequantize(qw._replace(scale=qw.scale.half()))
    assert half_w.dtype == torch.float16
    fp16 = Compute("fp16")
    assert fp16.half
    y, dx = matmul_xwt(x, qw, fp16), matmul_dyw(dy, qw, fp16)
    assert y.dtype == dx.dtype == torch.float32
    assert torch.equal(y, _fp16_product(x, half_w)) and bool((y[2] == 0).all())
    want = sum(_fp16_product(dy[:, a:b], half_w[a:b].T.contiguous(), _row_scale(dy)) for a, b in ((0, 4), (4, 8), (8, 12)))
    assert torch.equal(dx, want)
    assert not torch.equal(y, F.linear(x, dequantize(qw)))   # float32 would differ
    ref = x.double() @ half_w.double().T                      # exact products of the float16 weight
    assert float((y - ref).norm() / ref.norm()) < 2e-3         # input roundings only: torch accumulates in float32


def test_fp16_products_do_not_depend_on_a_rows_magnitude():
    """A gradient row of 1e-9 gives the bits of the same row at 1 times 2^-30: the scale is per row, so
    magnitudes below float16's range (6e-8) keep their digits; the plain float16 cast loses them."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 40, generator=g), torch.randn(6, 40, generator=g).half()
    fp16 = Compute("fp16")
    tiny = x * 2.0 ** -30
    assert torch.equal(linear(to_compute(tiny, fp16), w, fp16), linear(to_compute(x, fp16), w, fp16) * 2.0 ** -30)
    assert torch.equal(matmul(to_compute(tiny, fp16), w.T, fp16), matmul(to_compute(x, fp16), w.T, fp16) * 2.0 ** -30)
    assert bool((tiny.half() == 0).all())                     # what the unscaled cast would multiply
    op = to_compute(x, fp16)
    assert isinstance(op, HalfOperand) and float(op.x.abs().amax()) == 1.0


def _fp16_fz_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [T, K] @ b [K, N] as XNNPACK's f16 GEMM computes it on an ARMv8.2 FP16 CPU: float16 operands and
    accumulator, one fused multiply-add per k in increasing k (rounded to float16 once), float16 subnormals
    (below 2^-14) flushed to zero in the inputs and in every result (FPCR.FZ16)."""
    tiny = 2.0 ** -14
    flush = lambda t: torch.where(t.abs() < tiny, torch.zeros_like(t), t)  # noqa: E731
    a, b = flush(a.half()).double(), flush(b.half()).double()
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for k in range(a.shape[1]):
        acc = flush((acc + a[:, k:k + 1] * b[k:k + 1, :]).half().double())
    return acc.half()


class _PhoneTorch:
    """torch with `mm` replaced by the phone's float16 GEMM (`_fp16_fz_gemm`), for ops/half.py's products."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def mm(a, b):
        return _fp16_fz_gemm(a, b) if a.dtype == torch.float16 else torch.mm(a, b)


def _phone_linear(x, w):
    return _fp16_fz_gemm(x, w.T) if x.dtype == torch.float16 else F.linear(x, w)


@pytest.fixture
def phone_gemm(monkeypatch):
    """ops/half.py's float16 products (its `F.linear` and `torch.mm` on float16) on the emulated phone GEMM."""
    monkeypatch.setattr(half, "torch", _PhoneTorch())
    monkeypatch.setattr(half, "F", type("F", (), {"linear": staticmethod(_phone_linear)}))


def test_on_the_phones_float16_gemm_gradient_sized_products_keep_their_digits(phone_gemm):
    """The defect ops/half.py fixes: gradient-sized operands (1e-6) on a float16 GEMM that accumulates in float16
    and flushes subnormals come out as zeros when cast as they are, and within the input roundings when scaled."""
    g = torch.Generator().manual_seed(2)
    dy = torch.randn(6, 64, generator=g) * 1e-6
    w = (torch.randn(64, 48, generator=g) * 0.05).half()
    ref = dy.double() @ w.double()
    plain = _fp16_fz_gemm(dy.half(), w).double()             # the old formulation: cast, multiply
    assert bool((plain == 0).all())
    got = matmul(to_compute(dy, Compute("fp16")), w, Compute("fp16")).double()
    assert float((got - ref).norm() / ref.norm()) < 3e-3


def test_phone_gemm_slices_bound_the_float16_accumulation(phone_gemm):
    """Over K = 4 slices the float16 accumulation error is one slice's, not the whole width's (ops/half.py)."""
    g = torch.Generator().manual_seed(3)
    k = 4 * REDUCTION_CHUNK
    x = torch.randn(4, k, generator=g)
    w = (torch.randn(16, k, generator=g) * 0.05).half()
    ref = x.double() @ w.double().T
    err = lambda y: float((y.double() - ref).norm() / ref.norm())  # noqa: E731
    whole = err(_fp16_fz_gemm(x / x.abs().amax(1, keepdim=True), w.T) * x.abs().amax(1, keepdim=True))
    sliced = err(linear(to_compute(x, Compute("fp16")), w, Compute("fp16")))
    assert sliced < 0.6 * whole, (sliced, whole)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fp16_step_on_the_phones_float16_gemm_is_within_the_stated_bound(seed, phone_gemm):
    """The whole fp16 step with every float16 product on the emulated ARMv8.2 GEMM (float16 accumulation,
    subnormals flushed): the same gradient bound as on torch's float32-accumulating CPU matmul."""
    case = random_case(seed)
    arch = dataclasses.replace(case.arch, intermediate=case.arch.intermediate + case.arch.intermediate % 2)
    gen = torch.Generator().manual_seed(seed)
    hf = random_hf_model(arch, gen, dtype=torch.float32)
    weights = _quantized(our_weights(arch, hf, torch.float32), "int4", 2, chunk_elems=64, head=seed % 2 == 0)
    lora = lora_for(arch, case.lora, seed=seed, dtype=torch.float32)
    ids = torch.randint(0, arch.vocab, (max(case.seq_len, 8),), generator=gen)
    labels = random_labels(ids, gen)
    r32 = mesp_step(arch, weights, case.lora, lora, ids, labels)
    r16 = mesp_step(arch, weights, case.lora, lora, ids, labels, compute=Compute("fp16"))
    a, b = _flat(r32.grads), _flat(r16.grads)
    cos = float(a @ b / (a.norm() * b.norm()))
    rel = float((b - a).norm() / a.norm())
    print(f"{case}: phone GEMM cosine {cos:.7f}, rel L2 {rel:.2e}")
    assert cos >= COSINE_MIN and rel <= REL_L2_MAX


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
