"""bench.flops: the FLOPs counted from the MeSP step's own ops equal the closed form derived by hand from
the architecture (forward + recompute + backward matmuls), and the matmul-shape recorder sees the same
matmuls as torch's FlopCounterMode. Nothing here is timed (the rate is a benchmark figure)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from helpers import random_case
from toolchain.bench.flops import GemmShape, MatmulRate, StepFlops, count_step_flops, flops_fields, matmul_rate
from toolchain.lora import init_lora
from toolchain.mesp import StepOptions, mesp_step
from toolchain.models import random_weights

# (i, o) of each LoRA target for hidden d, heads H, kv heads Hk, head dim D, intermediate f
def _shapes(a) -> dict[str, tuple[int, int]]:
    d, qd, kvd, f = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.intermediate
    return {"q_proj": (d, qd), "k_proj": (d, kvd), "v_proj": (d, kvd), "o_proj": (qd, d),
            "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}


def mesp_step_flops(a, targets: tuple[str, ...], r: int, t: int, selected: int) -> int:
    """The closed form, from mesp/block.py's derivation (2 m k n per [m, k] x [k, n] product):

    a projection [i -> o], adapted with rank r (r = 0: not adapted):
      forward      x W^T, h = x A^T, h B^T                      2T(io + ir + ro)
      backward     dx = dy W, h again, dh = dy B, dh A, dA = dh^T x, dB = dy^T h    2T(io + 3ir + 2or)
    attention, per query head: forward Q K^T, P V: 4 T^2 D; backward recomputes P (2 T^2 D) and
      computes dV, dP, dQ, dK: 10 T^2 D
    a selected layer's backward recomputes the attention half's forward (q, k, v, o, attention), but not
      the MLP's output: gate/up recompute their forward (sharing h = n2 A^T with their backward: minus
      2Tdr each), down only its backward
    head (online CE): logits h E^T and dh = P E: 4 T d V
    step = L * forward + selected * backward + head
    """
    rank = {name: (r if name in targets else 0) for name in _shapes(a)}
    fwd = {n: 2 * t * (i * o + i * rank[n] + rank[n] * o) for n, (i, o) in _shapes(a).items()}
    bwd = {n: 2 * t * (i * o + 3 * i * rank[n] + 2 * o * rank[n]) for n, (i, o) in _shapes(a).items()}
    att_f, att_b = 4 * a.heads * t * t * a.head_dim, 10 * a.heads * t * t * a.head_dim
    forward = sum(fwd.values()) + att_f
    backward = (sum(fwd[n] + bwd[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")) + att_f + att_b
                + sum(fwd[n] + bwd[n] - 2 * t * a.hidden * rank[n] for n in ("gate_proj", "up_proj"))
                + bwd["down_proj"])
    return a.layers * forward + selected * backward + 4 * t * a.hidden * a.vocab


def forward_flops(a, targets: tuple[str, ...], r: int, t: int) -> int:
    """A forward alone (the loss; MeZO runs two): L * forward + the logits h E^T (2 T d V)."""
    with_backward = mesp_step_flops(a, targets, r, t, selected=0)
    return with_backward - 2 * t * a.hidden * a.vocab


CASES = [random_case(seed) for seed in range(8)]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("options", [StepOptions(), StepOptions(loss_chunk=7, vocab_chunk=5, mlp_chunk=4)],
                         ids=["default-chunks", "small-chunks"])
def test_mesp_step_flops_equal_the_closed_form(case, options):
    a, cfg, t = case.arch, case.lora, case.seq_len
    weights = random_weights(a, seed=case.seed)
    lora = init_lora(a, cfg, seed=case.seed, zero_b=False)
    ids = torch.randint(0, a.vocab, (t,), generator=torch.Generator().manual_seed(case.seed))
    with torch.no_grad():
        flops = count_step_flops(lambda: mesp_step(a, weights, cfg, lora, ids, ids, options=options))
    assert flops.total == mesp_step_flops(a, cfg.targets, cfg.rank, t, selected=a.layers)
    # the shape recorder saw the same matmuls as FlopCounterMode (MeSP runs only mm and bmm)
    assert sum(g.flops * n for g, n in flops.gemms.items()) == flops.total
    assert set(flops.by_op) <= {"aten.mm", "aten.bmm"}


@pytest.mark.parametrize("case", CASES[:4], ids=str)
def test_lcsb_step_flops_drop_the_unselected_layers_backward(case):
    a, cfg, t = case.arch, case.lora, case.seq_len
    weights = random_weights(a, seed=case.seed)
    lora = init_lora(a, cfg, seed=case.seed, zero_b=False)
    ids = torch.randint(0, a.vocab, (t,), generator=torch.Generator().manual_seed(case.seed))
    selected = {a.layers - 1}
    with torch.no_grad():
        flops = count_step_flops(lambda: mesp_step(a, weights, cfg, lora, ids, ids, backward_layers=selected))
    assert flops.total == mesp_step_flops(a, cfg.targets, cfg.rank, t, selected=1)


def test_rate_weights_each_shape_by_its_calls_and_fields_follow_from_it():
    gemms = Counter({GemmShape(1, 16, 32, 8, False, True): 3, GemmShape(2, 4, 8, 4, False, False): 1})
    rate = matmul_rate(gemms, min_s_per_shape=0.0)
    assert rate.shapes == 2 and 0 < rate.gflop_per_s <= rate.peak_gflop_per_s
    flops = StepFlops(total=4_000_000_000, by_op={}, gemms=gemms)
    fields = flops_fields(flops, MatmulRate(80.0, 120.0, 2), step_s=0.5, step_cpu_s=0.25, counted_from="mesp")
    assert fields == {"step_gflop": 4.0, "gflop_per_s": 8.0, "gflop_per_cpu_s": 16.0, "matmul_gflop_per_s": 80.0,
                      "matmul_peak_gflop_per_s": 120.0, "utilisation": 0.1, "utilisation_cpu": 0.2,
                      "flops_counted_from": "mesp"}
    with pytest.raises(ValueError, match="no matmul"):
        matmul_rate(Counter())
