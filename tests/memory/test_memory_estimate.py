"""The analytic peak of a MeSP step equals the exact peak of live tensors of `mesp_step` (counted by
storage with a dispatch mode, see live_tensors.py), overall and per phase (forward, loss, backward),
on configurations chosen so that different candidates win (loss chunk, backward MLP chunk, attention
backward, accumulated grads, an LCSB selection); plus the API's invariants.

If this fails after a change to toolchain/mesp, the step now keeps different tensors alive: update
the counts in toolchain/memory/estimate.py (the failure prints the parts) rather than the tolerance."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from live_tensors import LiveTensorPeak

from toolchain.errors import BadInput
from toolchain.lora import LoraConfig, init_lora
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak, largest_fitting
from toolchain.mesp import mesp_step
from toolchain.mesp.step import StepOptions
from toolchain.models import PRESETS, Qwen25Arch, random_weights

WIDE = Qwen25Arch(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=704, vocab=4096, max_positions=4096)
FAT_MLP = Qwen25Arch(hidden=128, layers=3, heads=2, kv_heads=1, intermediate=2048, vocab=512, max_positions=4096)
BIG_VOCAB = Qwen25Arch(hidden=128, layers=3, heads=4, kv_heads=1, intermediate=352, vocab=8192, max_positions=4096)
MANY_HEADS = Qwen25Arch(hidden=64, layers=2, heads=8, kv_heads=2, intermediate=128, vocab=256, max_positions=4096)

# (arch, seq_len, rank, mlp_chunk, loss_chunk, targets, backward_layers, expected phase of the peak)
CASES = [
    (WIDE, 128, 8, None, 32, None, None, "backward"),          # MLP backward, all grads kept -> layer 0
    (WIDE, 128, 8, 16, 32, None, None, "backward"),            # chunked MLP: attention backward wins
    (WIDE, 200, 8, 48, 24, None, None, "backward"),            # uneven chunks
    (WIDE, 64, 8, 16, 64, None, None, "backward"),           # short: the q/k/v tail of the backward
    (WIDE, 128, 4, None, 32, ("q_proj", "v_proj"), None, "backward"),
    (WIDE, 128, 8, 16, 32, None, (2, 1), "backward"),          # LCSB selection
    (FAT_MLP, 64, 4, None, 8, None, (0,), "backward"),         # unchunked MLP
    (FAT_MLP, 64, 4, 8, 8, ("q_proj", "k_proj"), (0,), None),
    (BIG_VOCAB, 96, 2, 32, 64, None, None, "loss"),            # uneven loss chunks
    (MANY_HEADS, 64, 4, 8, 8, None, None, "backward"),
    (MANY_HEADS, 7, 1, None, 3, None, None, None),             # odd, tiny: whatever wins must be exact
]
PHASES = {"_forward_checkpoints": "forward", "ce_chunked_forward_backward": "loss", "block_backward": "backward"}


def _measure(arch, seq_len, rank, mlp_chunk, loss_chunk, targets, backward_layers) -> tuple[LiveTensorPeak, StepShape]:
    weights = random_weights(arch, seed=0, dtype=torch.float32)
    cfg = LoraConfig(rank=rank, alpha=2.0 * rank, **({"targets": targets} if targets else {}))
    lora = init_lora(arch, cfg, seed=0, zero_b=False)
    ids = torch.randint(0, arch.vocab, (seq_len,), generator=torch.Generator().manual_seed(0))
    tracker = LiveTensorPeak(phases=PHASES)
    with torch.no_grad(), tracker:
        mesp_step(arch, weights, lora, cfg, ids, ids, options=StepOptions(loss_chunk=loss_chunk, vocab_chunk=None, mlp_chunk=mlp_chunk),
                  backward_layers=backward_layers)
    shape = StepShape(arch, seq_len, rank, targets=cfg.targets, loss_chunk=loss_chunk, mlp_chunk=mlp_chunk,
                      backward_layers=backward_layers)
    return tracker, shape


@pytest.mark.xfail(strict=False, reason="KNOWN DEFECT (open in issue 7): the MeSP step's liveness changed after the "
                   "estimate was counted (MLP chunking in the forward, online-softmax loss); 5 of 11 cases now "
                   "over-predict by up to one checkpoint. Recount estimate.py; do not widen the tolerance.")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0].hidden}-T{c[1]}-r{c[2]}-mc{c[3]}-lc{c[4]}-{c[7]}")
def test_estimate_equals_the_live_tensor_peak(case):
    """The estimate models the token-chunked loss (`ce_chunked`, vocab_chunk=None); the online-softmax
    vocabulary-chunked loss that became the step's default later is not modelled yet."""
    *config, phase = case
    tracker, shape = _measure(*config)
    est = estimate_peak(shape)
    # The tracker sees tensors created inside the step: not the LoRA params (nor optimizer state).
    params_mb = est.parts_mb.get("lora_params", 0.0)
    activations = (est.peak_mb - params_mb) * BYTES_PER_MB
    # Not modelled: [T] int64 labels, [C]/[T, r] vectors, the loss scalar: under 0.2% here.
    assert activations == pytest.approx(tracker.peak_bytes, rel=2e-3), est.parts_mb
    for name, measured in tracker.phase_peak_bytes.items():
        assert (est.phases_mb[name] - params_mb) * BYTES_PER_MB == pytest.approx(measured, rel=2e-3), name
    if phase is not None:
        assert est.phase == phase


def test_parts_add_up_and_overhead_is_its_own_part():
    shape = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8)
    bare, calibrated = estimate_peak(shape), estimate_peak(shape, overhead_mb=40.0)
    assert bare.peak_mb == pytest.approx(sum(bare.parts_mb.values()))
    assert calibrated.parts_mb["runtime_overhead"] == 40.0
    assert calibrated.peak_mb == pytest.approx(bare.peak_mb + 40.0)
    assert set(bare.phases_mb) == {"forward", "loss", "final_norm", "backward", "end"}
    assert max(bare.phases_mb.values()) == bare.peak_mb


def test_known_parts_of_qwen_0_5b():
    """Hand-computed from DESIGN.md's shapes: checkpoints 24 x [256, 896] fp32; one [32, 151936] logits
    chunk; LoRA r8 on 7 projections: 4,399,104 parameters; 8 [256, 4864] MLP tensors in backward."""
    est = estimate_peak(StepShape(PRESETS["qwen2.5-0.5b"], 256, 8))
    assert est.phase == "backward" and est.layer == 23
    assert est.parts_mb["checkpoints"] == 24 * 256 * 896 * 4 / BYTES_PER_MB
    assert est.parts_mb["mlp_working_set"] == (8 * 256 * 4864 + 2 * 256 * 896) * 4 / BYTES_PER_MB
    assert est.parts_mb["lora_params"] == 4_399_104 * 4 / BYTES_PER_MB
    loss = estimate_peak(StepShape(PRESETS["qwen2.5-0.5b"], 256, 8, mlp_chunk=32))
    assert loss.phase == "loss" and loss.parts_mb["loss_logits"] == 32 * 151936 * 4 / BYTES_PER_MB


@pytest.mark.parametrize("knob, values", [("seq_len", [64, 128, 256, 512, 1024, 2048]), ("rank", [1, 4, 16, 64])])
def test_peak_grows_with_seq_len_and_rank(knob, values):
    shape = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8)
    peaks = [estimate_peak(dataclasses.replace(shape, **{knob: v})).peak_mb for v in values]
    assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks)


def test_optimizer_and_grads_modes():
    base = StepShape(PRESETS["qwen2.5-0.5b"], 256, 32)
    adamw = estimate_peak(dataclasses.replace(base, optimizer="adamw"))
    assert adamw.parts_mb["optimizer_state"] == 2 * adamw.parts_mb["lora_params"]
    per_layer = estimate_peak(dataclasses.replace(base, grads="layer"))
    assert per_layer.peak_mb < estimate_peak(base).peak_mb      # all layers' grads no longer coexist
    # LCSB: fewer layers' gradients are kept, so never more memory
    assert estimate_peak(dataclasses.replace(base, lcsb_k=6)).peak_mb <= estimate_peak(base).peak_mb


@pytest.mark.parametrize("knob, hi", [("seq_len", 32768), ("rank", 128)])
@pytest.mark.parametrize("budget_mb", [120.0, 400.0, 2000.0])
def test_largest_fitting_is_the_boundary(knob, hi, budget_mb):
    shape = StepShape(PRESETS["qwen2.5-1.5b"], 256, 8)
    best = largest_fitting(shape, budget_mb, knob, hi)
    peak = lambda v: estimate_peak(dataclasses.replace(shape, **{knob: v})).peak_mb  # noqa: E731
    if best is None:
        assert peak(1) > budget_mb
        return
    assert peak(best) <= budget_mb
    assert best == hi or peak(best + 1) > budget_mb


def test_bad_shapes_are_refused():
    arch = PRESETS["tiny"]
    with pytest.raises(BadInput, match="seq_len"):
        StepShape(arch, 0, 8)
    with pytest.raises(BadInput, match="lcsb_k"):
        StepShape(arch, 8, 8, lcsb_k=arch.layers + 1)
    with pytest.raises(BadInput, match="backward_layers"):
        StepShape(arch, 8, 8, backward_layers=(arch.layers,))
    with pytest.raises(BadInput, match="unknown LoRA target"):
        StepShape(arch, 8, 8, targets=("qkv",))
