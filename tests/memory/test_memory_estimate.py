"""The analytic peak of a training step equals the exact peak of live tensors of the real step
(counted by storage with a dispatch mode, see live_tensors.py), overall and per phase (forward, loss,
backward), on configurations chosen so that different candidates win (online-softmax and token-chunked
loss, MLP column chunks (even, uneven, whole f), attention backward, the q/k/v tail, accumulated or per-layer
grads, an LCSB selection);
the same for the MeBP and autograd baselines as `bench memory` runs them; plus the API's invariants.

The block's working set is the step's own (toolchain/memory/timeline.py traces it on meta tensors), so a
change inside a block needs nothing here. If this fails after a change to the step's layer walk, the loss
or the final norm (toolchain/mesp/step.py, ops/ce_*.py) or to bench/steps.py, the step now keeps
different tensors alive: update the closed forms in toolchain/memory/estimate*.py (the failure prints
the parts) rather than the tolerance."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from live_tensors import LiveTensorPeak

from toolchain.bench.steps import prepare_lora, sgd_hook, train_step
from toolchain.errors import BadInput
from toolchain.lora import LoraConfig, init_lora
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak, largest_fitting
from toolchain.mesp import mesp_step
from toolchain.mesp.block import block_backward
from toolchain.mesp.ops import rope_tables
from toolchain.mesp.step import StepOptions, block_params
from toolchain.models import PRESETS, ModelArch, random_weights

WIDE = ModelArch(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=704, vocab=4096, max_positions=4096)
FAT_MLP = ModelArch(hidden=128, layers=3, heads=2, kv_heads=1, intermediate=2048, vocab=512, max_positions=4096)
BIG_VOCAB = ModelArch(hidden=128, layers=3, heads=4, kv_heads=1, intermediate=352, vocab=8192, max_positions=4096)
DEEP = ModelArch(hidden=96, layers=7, heads=3, kv_heads=1, intermediate=200, vocab=700, max_positions=4096)
MANY_HEADS = ModelArch(hidden=64, layers=2, heads=8, kv_heads=2, intermediate=128, vocab=256, max_positions=4096)


@dataclasses.dataclass(frozen=True)
class Case:
    arch: ModelArch
    seq_len: int
    rank: int
    mlp_chunk: int | None
    loss_chunk: int
    vocab_chunk: int | None = 1000          # not a divisor of any vocab here: a short last block
    targets: tuple[str, ...] | None = None
    backward_layers: tuple[int, ...] | None = None
    grads: str = "layer"
    phase: str | None = None                # expected phase of the peak
    layers_per_checkpoint: int = 1

    def __str__(self) -> str:
        return (f"d{self.arch.hidden}-T{self.seq_len}-r{self.rank}-mc{self.mlp_chunk}-lc{self.loss_chunk}"
                f"-vc{self.vocab_chunk}-{self.grads}-{self.phase}-lpc{self.layers_per_checkpoint}")


CASES = [
    Case(WIDE, 128, 8, None, 32, grads="all", phase="backward"),     # MLP backward, all grads kept
    Case(WIDE, 128, 8, None, 32, phase="backward"),                   # per-layer grads
    Case(WIDE, 128, 8, 16, 32, vocab_chunk=None, grads="all", phase="backward"),  # chunked MLP: attention wins
    Case(WIDE, 200, 8, 48, 24, phase="backward"),                     # uneven chunks
    Case(WIDE, 64, 8, 16, 64, grads="all", phase="backward"),         # short: the q/k/v tail
    Case(WIDE, 64, 8, 16, 64, vocab_chunk=None, phase="loss"),        # [64, V] logits of ce_chunked
    Case(WIDE, 128, 4, None, 32, targets=("q_proj", "v_proj"), phase="backward"),
    Case(WIDE, 128, 8, 16, 32, backward_layers=(2, 1), phase="backward"),   # LCSB selection
    Case(FAT_MLP, 64, 4, None, 8, backward_layers=(0,), phase="backward"),  # unchunked MLP
    Case(FAT_MLP, 64, 4, 8, 8, targets=("q_proj", "k_proj"), backward_layers=(0,)),
    Case(FAT_MLP, 64, 4, 1500, 8, targets=("down_proj",), backward_layers=(0,)),  # MLP chunks 1500 + 548
    Case(FAT_MLP, 64, 4, 700, 8, targets=("gate_proj", "o_proj")),   # 700, 700, 648 columns
    Case(BIG_VOCAB, 96, 2, 32, 64, vocab_chunk=None, grads="all", phase="loss"),   # uneven loss chunks
    Case(BIG_VOCAB, 96, 2, 32, 64, vocab_chunk=4096, phase="loss"),   # online softmax, [64, 4096] blocks
    Case(MANY_HEADS, 64, 4, 8, 8, phase="backward"),
    Case(MANY_HEADS, 7, 1, None, 3, grads="all"),                     # odd, tiny: whatever wins must be exact
    Case(MANY_HEADS, 7, 1, None, 3, vocab_chunk=100),
    # checkpoint groups: the forward keeps one input per group, the backward reruns each group's forward
    Case(DEEP, 96, 4, 16, 32, layers_per_checkpoint=3, phase="backward"),
    Case(DEEP, 96, 4, 16, 32, layers_per_checkpoint=2, grads="all"),
    Case(DEEP, 96, 4, 16, 32, layers_per_checkpoint=2, backward_layers=(6, 5, 3, 1, 0)),
    Case(DEEP, 64, 4, None, 64, vocab_chunk=None, layers_per_checkpoint=7),
]
PHASES = {"_forward_checkpoints": "forward", "_loss_and_dh": "loss", "block_backward": "backward",
          "block_forward": "recompute"}  # outermost wins: block_forward in the first forward is "forward"


def _setup(arch, seq_len, rank, targets):
    weights = random_weights(arch, seed=0, dtype=torch.float32)
    cfg = LoraConfig(rank=rank, alpha=2.0 * rank, **({"targets": targets} if targets else {}))
    lora = init_lora(arch, cfg, seed=0, zero_b=False)
    ids = torch.randint(0, arch.vocab, (seq_len,), generator=torch.Generator().manual_seed(0))
    return weights, cfg, lora, ids


def _measure(c: Case) -> tuple[LiveTensorPeak, StepShape]:
    weights, cfg, lora, ids = _setup(c.arch, c.seq_len, c.rank, c.targets)
    options = StepOptions(loss_chunk=c.loss_chunk, vocab_chunk=c.vocab_chunk, mlp_chunk=c.mlp_chunk)
    per_layer = {"on_layer_grads": sgd_hook(lora, 1e-4), "keep_grads": False} if c.grads == "layer" else {}
    tracker = LiveTensorPeak(phases=PHASES)
    with torch.no_grad(), tracker:
        mesp_step(c.arch, weights, cfg, lora, ids, ids, options=options, backward_layers=c.backward_layers,
                  layers_per_checkpoint=c.layers_per_checkpoint, **per_layer)
    shape = StepShape(c.arch, c.seq_len, c.rank, targets=cfg.targets, loss_chunk=c.loss_chunk,
                      vocab_chunk=c.vocab_chunk, mlp_chunk=c.mlp_chunk, backward_layers=c.backward_layers,
                      grads=c.grads, layers_per_checkpoint=c.layers_per_checkpoint)
    return tracker, shape


def _activations(est, phase_mb: float) -> float:
    """Bytes of the tensors the tracker sees: not the LoRA params (created before the step)."""
    return (phase_mb - est.parts_mb.get("lora_params", 0.0)) * BYTES_PER_MB


@pytest.mark.parametrize("case", CASES, ids=str)
def test_estimate_equals_the_live_tensor_peak(case):
    tracker, shape = _measure(case)
    est = estimate_peak(shape)
    # Not modelled: the loss scalars of ce_chunked and [T, r] transients: under 0.2% here.
    assert _activations(est, est.peak_mb) == pytest.approx(tracker.peak_bytes, rel=2e-3), est.parts_mb
    reruns = any(len(g) > 1 for g in shape.groups())
    assert set(tracker.phase_peak_bytes) == {"forward", "loss", "backward"} | ({"recompute"} if reruns else set())
    for name, measured in tracker.phase_peak_bytes.items():
        assert _activations(est, est.phases_mb[name]) == pytest.approx(measured, rel=2e-3), name
    if case.phase is not None:
        assert est.phase == case.phase


# (method, arch, seq_len, rank, targets): the LM head's 3 [T, V] win, as for every Qwen2.5 preset
BASELINE_CASES = [
    (method, *rest) for method in ("mebp", "autograd") for rest in [
        (WIDE, 128, 8, None), (BIG_VOCAB, 96, 2, None), (WIDE, 128, 4, ("q_proj", "v_proj")),
        (BIG_VOCAB, 7, 1, ("o_proj", "down_proj")), (WIDE, 64, 2, ("k_proj", "up_proj"))]
]


@pytest.mark.parametrize("case", BASELINE_CASES, ids=lambda c: f"{c[0]}-d{c[1].hidden}-T{c[2]}-r{c[3]}-{c[4]}")
def test_baseline_estimate_equals_the_live_tensor_peak(case):
    """The step `bench memory` runs for mebp/autograd; the tracker sees the backward's tensors too."""
    method, arch, seq_len, rank, targets = case
    weights, cfg, lora, ids = _setup(arch, seq_len, rank, targets)
    lora = prepare_lora(method, lora)
    tracker = LiveTensorPeak()
    with tracker:
        train_step(arch, weights, cfg, lora, ids, ids, mode=method, hook=sgd_hook(lora, 1e-4))
    est = estimate_peak(StepShape(arch, seq_len, rank, targets=cfg.targets, method=method))
    assert est.phase == "loss"
    assert _activations(est, est.peak_mb) == pytest.approx(tracker.peak_bytes, rel=2e-3), est.parts_mb


def test_baseline_block_backward_is_a_lower_bound():
    """Where the vocabulary is tiny a block's backward wins; its transients are not modelled."""
    weights, cfg, lora, ids = _setup(MANY_HEADS, 9, 3, None)
    lora = prepare_lora("mebp", lora)
    tracker = LiveTensorPeak()
    with tracker:
        train_step(MANY_HEADS, weights, cfg, lora, ids, ids, mode="mebp", hook=sgd_hook(lora, 1e-4))
    est = estimate_peak(StepShape(MANY_HEADS, 9, 3, method="mebp"))
    assert _activations(est, est.phases_mb["backward (saved only)"]) < tracker.peak_bytes


def test_parts_add_up_and_overhead_is_its_own_part():
    shape = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8)
    bare, calibrated = estimate_peak(shape), estimate_peak(shape, overhead_mb=40.0)
    assert bare.peak_mb == pytest.approx(sum(bare.parts_mb.values()))
    assert calibrated.parts_mb["runtime_overhead"] == 40.0
    assert calibrated.peak_mb == pytest.approx(bare.peak_mb + 40.0)
    assert set(bare.phases_mb) == {"forward", "loss", "final_norm", "backward"}
    assert set(estimate_peak(dataclasses.replace(shape, grads="all")).phases_mb) == set(bare.phases_mb) | {"end"}
    assert max(bare.phases_mb.values()) == bare.peak_mb


def _block_backward_live_peak(arch, seq_len: int, rank: int, mlp_chunk: int | None) -> int:
    """The live-tensor peak of one real `block_backward` of `arch` (float32 CPU tensors), above its inputs."""
    one = dataclasses.replace(arch, layers=1, vocab=64)
    weights, cfg, lora, _ = _setup(one, seq_len, rank, None)
    params = block_params(one, weights, cfg, lora, 0)
    rope = rope_tables(torch.arange(seq_len), one.head_dim, one.rope_theta, torch.float32)
    x, dout = torch.randn(seq_len, one.hidden), torch.randn(seq_len, one.hidden)
    tracker = LiveTensorPeak()
    with torch.no_grad(), tracker:
        block_backward(dout, x, params, rope, mlp_chunk)
    return tracker.peak_bytes


def test_known_parts_of_qwen_0_5b():
    """Hand-computed from the shapes: checkpoints 24 x [256, 896] fp32; LoRA r8 on 7 projections: 4,399,104
    parameters; dout [256, 896]. With StepOptions' defaults (loss chunk 256, vocab chunk 1024, MLP chunk 256
    columns) the peak is layer 23's backward, whose working set is what the real block_backward holds at its
    peak (measured here on real tensors, at the full 0.5B shapes). MLP chunks of 512 columns peak at the
    same place and size; without MLP chunks the MLP's [256, 4864] tensors win (8 of them at swiglu's
    backward). One [256, 16384] logits block in the loss; MeBP: 3 [256, 151936] in the loss backward and 25
    [256, 896] block inputs/outputs."""
    arch = PRESETS["qwen2.5-0.5b"]
    mb = 4 / BYTES_PER_MB
    est = estimate_peak(StepShape(arch, 256, 8))
    assert est.phase == "backward" and est.layer == 23
    assert est.parts_mb["checkpoints"] == 24 * 256 * 896 * mb
    assert est.parts_mb["lora_params"] == 4_399_104 * mb
    assert est.parts_mb["hidden_grads"] == 256 * 896 * mb

    def block_mb(e) -> float:
        return sum(v for k, v in e.parts_mb.items() if k.startswith("block_"))

    assert block_mb(est) * BYTES_PER_MB == _block_backward_live_peak(arch, 256, 8, 256)
    wide = estimate_peak(StepShape(arch, 256, 8, mlp_chunk=512))
    assert wide.phase == "backward" and wide.layer == 23 and wide.peak_mb == est.peak_mb
    whole = estimate_peak(StepShape(arch, 256, 8, mlp_chunk=None))
    assert whole.phase == "backward" and block_mb(whole) * BYTES_PER_MB == _block_backward_live_peak(arch, 256, 8, None)
    assert whole.parts_mb["block_mlp"] + whole.parts_mb["block_swiglu"] >= 8 * 256 * 4864 * mb
    rows = estimate_peak(StepShape(arch, 256, 8, vocab_chunk=None))
    assert rows.phase == "loss" and rows.parts_mb["loss_logits"] == 256 * 151936 * 4 / BYTES_PER_MB
    online = estimate_peak(StepShape(arch, 256, 8, mlp_chunk=8, loss_chunk=512, vocab_chunk=16384))
    assert online.phase == "loss" and online.parts_mb["loss_logits"] == 256 * 16384 * 4 / BYTES_PER_MB
    mebp = estimate_peak(StepShape(arch, 256, 8, method="mebp"))
    assert mebp.parts_mb["loss_logits"] == 3 * 256 * 151936 * 4 / BYTES_PER_MB
    assert mebp.parts_mb["checkpoints"] == pytest.approx((25 * 256 * 896 + 256) * 4 / BYTES_PER_MB)


@pytest.mark.parametrize("method", ["mesp", "mebp", "autograd"])
@pytest.mark.parametrize("knob, values", [("seq_len", [64, 128, 256, 512, 1024, 2048]), ("rank", [1, 4, 16, 64])])
def test_peak_grows_with_seq_len_and_rank(method, knob, values):
    shape = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8, method=method)
    peaks = [estimate_peak(dataclasses.replace(shape, **{knob: v})).peak_mb for v in values]
    assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks)


def test_methods_order_and_optimizer_and_grads_modes():
    base = StepShape(PRESETS["qwen2.5-0.5b"], 256, 32)
    peaks = [estimate_peak(dataclasses.replace(base, method=m)).peak_mb for m in ("mesp", "mebp", "autograd")]
    assert peaks == sorted(peaks)
    adamw = estimate_peak(dataclasses.replace(base, optimizer="adamw"))
    assert adamw.parts_mb["optimizer_state"] == 2 * adamw.parts_mb["lora_params"]
    kept = estimate_peak(dataclasses.replace(base, grads="all"))
    assert estimate_peak(base).peak_mb < kept.peak_mb      # all layers' grads coexist
    # LCSB: fewer layers' gradients are kept, so never more memory
    assert estimate_peak(dataclasses.replace(base, grads="all", lcsb_k=6)).peak_mb <= kept.peak_mb


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
    with pytest.raises(BadInput, match="vocab_chunk"):
        StepShape(arch, 8, 8, vocab_chunk=0)
    with pytest.raises(BadInput, match="unknown method"):
        StepShape(arch, 8, 8, method="mezo")
    with pytest.raises(BadInput, match="mesp only"):
        StepShape(arch, 8, 8, method="mebp", lcsb_k=2)
    with pytest.raises(BadInput, match="dtype_bytes"):
        StepShape(arch, 8, 8, dtype_bytes=3)


def test_lcsb_holds_k_of_l_checkpoints():
    """Under LCSB the forward keeps only the selected layers' inputs: at the loss, k of L checkpoints (3B,
    T = 1024, k = 6 of 36), and never more than that plus the current layer's input anywhere."""
    arch = PRESETS["qwen2.5-3b"]
    one = 1024 * arch.hidden * 4 / BYTES_PER_MB
    est = estimate_peak(StepShape(arch, 1024, 8, lcsb_k=6))
    full = estimate_peak(StepShape(arch, 1024, 8))
    phases = {p: e for p, e in est.phases_mb.items()}
    assert max(v for k, v in est.parts_mb.items() if k == "checkpoints") <= 7 * one
    assert full.parts_mb["checkpoints"] >= 30 * one
    assert est.peak_mb < full.peak_mb - 29 * one * 0.99
    assert phases
