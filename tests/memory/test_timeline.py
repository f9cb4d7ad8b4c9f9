"""The estimator's block timeline (toolchain/memory/timeline.py) against independent live measurements:
the meta-tensor counter (toolchain/memory/live.py) against the tests' own real-tensor counter
(live_tensors.py) on a whole step, and the solved (T, r) table against real `block_forward` /
`block_backward` runs at shapes it was not traced at; the whole estimate against the whole real step of
Qwen2.5-0.5B (and 3B, slow) on meta tensors; and it refuses what it cannot model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from live_tensors import LiveTensorPeak
from test_memory_estimate import MANY_HEADS, WIDE, _block_backward_live_peak, _setup

from toolchain.bench.steps import sgd_hook
from toolchain.lora import LoraConfig, init_lora
from toolchain.lora.config import ALL_TARGETS
from toolchain.memory.estimate import BYTES_PER_MB, StepShape, estimate_peak
from toolchain.memory.live import LiveTensors
from toolchain.memory.timeline import SENTINEL, BlockTimeline, TimelineError, _monomial, _trace, block_timeline
from toolchain.mesp import mesp_step
from toolchain.mesp.block import block_forward
from toolchain.mesp.ops import rope_tables
from toolchain.mesp.step import StepOptions, block_params
from toolchain.models import PRESETS, ModelArch, random_weights
from toolchain.models.source import empty_weights

ODD = ModelArch(hidden=96, layers=2, heads=6, kv_heads=3, intermediate=200, vocab=300, max_positions=4096)


def test_meta_counter_equals_the_real_tensor_counter_on_a_whole_step():
    arch, t = WIDE, 96
    options = StepOptions(loss_chunk=32, vocab_chunk=1000, mlp_chunk=48)
    weights, cfg, lora, ids = _setup(arch, t, 4, None)
    real = LiveTensorPeak()
    with torch.no_grad(), real:
        mesp_step(arch, weights, cfg, lora, ids, ids, options=options, on_layer_grads=sgd_hook(lora, 1e-4),
                  keep_grads=False)
    with torch.device("meta"):
        weights, lora = empty_weights(arch), init_lora(arch, cfg)
        ids = torch.zeros(t, dtype=torch.long)
    meta = LiveTensors()
    with torch.no_grad(), torch.device("meta"), meta:
        mesp_step(arch, weights, cfg, lora, ids, ids, options=options, on_layer_grads=lambda i, g: None,
                  keep_grads=False)
    assert meta.peak_bytes == real.peak_bytes > 0


def _block_forward_live_peak(arch, seq_len: int, rank: int, mlp_chunk: int | None, targets) -> int:
    one = dataclasses.replace(arch, layers=1, vocab=64)
    weights, cfg, lora, _ = _setup(one, seq_len, rank, targets)
    rope = rope_tables(torch.arange(seq_len), one.head_dim, one.rope_theta, torch.float32)
    x = torch.randn(seq_len, one.hidden)
    tracker = LiveTensorPeak()
    with torch.no_grad(), tracker:
        block_forward(x, block_params(one, weights, cfg, lora, 0), rope, mlp_chunk)
    return tracker.peak_bytes


@pytest.mark.parametrize("arch, mlp_chunk, targets", [(ODD, 64, None), (ODD, None, ("q_proj", "down_proj")),
                                                      (MANY_HEADS, 8, ("k_proj", "up_proj"))], ids=str)
@pytest.mark.parametrize("seq_len, rank", [(2, 1), (64, 8), (257, 5)])
def test_solved_table_equals_the_real_block(arch, mlp_chunk, targets, seq_len, rank):
    timeline = block_timeline(arch, targets or ALL_TARGETS, mlp_chunk)
    assert timeline.peak("forward", seq_len, rank).bytes == _block_forward_live_peak(arch, seq_len, rank, mlp_chunk,
                                                                                    targets)
    if targets is None:
        assert timeline.peak("backward", seq_len, rank).bytes == _block_backward_live_peak(arch, seq_len, rank,
                                                                                           mlp_chunk)


def test_parts_add_up_to_the_peak():
    peak = block_timeline(ODD, ALL_TARGETS, 64).peak("backward", 100, 4)
    assert sum(peak.parts.values()) == pytest.approx(peak.bytes)
    assert {"block_attention", "block_mlp"} <= set(block_timeline(ODD, ALL_TARGETS, None).part_names)


def test_a_table_that_does_not_reproduce_the_step_is_refused():
    table = BlockTimeline(_trace(ODD, ALL_TARGETS, 64, torch.float32, *SENTINEL))
    for point in [(7, 4), (300, 1)]:
        table.check(_trace(ODD, ALL_TARGETS, 64, torch.float32, *point), point)
    with pytest.raises(TimelineError, match="does not reproduce"):
        table.check(_trace(ODD, ALL_TARGETS, 64, torch.float32, 9, 4), (7, 4))
    with pytest.raises(TimelineError, match="does not reproduce"):    # another MLP chunking: other allocations
        table.check(_trace(ODD, ALL_TARGETS, 32, torch.float32, 7, 4), (7, 4))


def test_dimensions_are_constants_or_multiples_of_t_and_r():
    t, r = SENTINEL
    assert _monomial((3, 2 * t, r), SENTINEL) == (6, 1, 1)
    assert _monomial((t * r, 5), SENTINEL) == (5, 1, 1)
    assert _monomial((t, t, 64), SENTINEL) == (64, 2, 0)
    for shape in [(t - 1,), (r - 1, 8), (t * t,)]:
        with pytest.raises(TimelineError):
            _monomial(shape, SENTINEL)
    assert _monomial((29568, t), SENTINEL) == (29568, 1, 0)     # Qwen2.5-72B's MLP width is still a constant


def test_bf16_table_equals_the_real_bf16_block():
    """dtype_bytes 2: the trace runs in bfloat16 (the bool causal mask stays 1 byte per element)."""
    one = dataclasses.replace(ODD, layers=1, vocab=64)
    weights = random_weights(one, dtype=torch.bfloat16)
    cfg = LoraConfig(rank=4, alpha=8.0)
    lora = init_lora(one, cfg, dtype=torch.bfloat16, zero_b=False)
    rope = rope_tables(torch.arange(40), one.head_dim, one.rope_theta, torch.bfloat16)
    x = torch.randn(40, one.hidden, dtype=torch.bfloat16)
    tracker = LiveTensorPeak()
    with torch.no_grad(), tracker:
        block_forward(x, block_params(one, weights, cfg, lora, 0), rope, 64)
    assert block_timeline(ODD, ALL_TARGETS, 64, 2).peak("forward", 40, 4).bytes == tracker.peak_bytes


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen3-0.6b", "llama3.2-1b",
                                    pytest.param("qwen2.5-3b", marks=pytest.mark.slow)])
def test_estimate_equals_the_whole_real_step_on_meta_tensors_at_full_size(preset):
    """The whole `mesp_step` of a real preset (every layer, the real vocabulary; StepOptions' defaults, each
    layer's update right after its backward) on meta tensors: the estimate's tensors (all but the LoRA
    parameters, made before the step) are its live peak to the byte. Tracing the whole step like this takes
    ~10 s (0.5B) / ~25 s (3B) of CPU, which is why the estimator traces one block and counts the layers."""
    arch = PRESETS[preset]
    cfg = LoraConfig(rank=8, alpha=16.0)
    with torch.device("meta"):
        weights, lora = empty_weights(arch), init_lora(arch, cfg)
        ids = torch.zeros(256, dtype=torch.long)
    mode = LiveTensors()
    with torch.no_grad(), torch.device("meta"), mode:
        mesp_step(arch, weights, cfg, lora, ids, ids, on_layer_grads=lambda i, g: None, keep_grads=False)
    est = estimate_peak(StepShape(arch, 256, 8))
    assert (est.peak_mb - est.parts_mb["lora_params"]) * BYTES_PER_MB == mode.peak_bytes
