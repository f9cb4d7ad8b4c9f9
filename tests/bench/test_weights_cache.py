"""The benchmark weights cache: shards round-trip exactly (tied and untied), the entry is complete only
once arch.json exists, and loading maps the weights: their pages are file-backed, not anonymous."""

from __future__ import annotations

import sys

import pytest
import torch

from toolchain.bench.weights_cache import (ARCH_FILE, ensure_quantized, ensure_weights_cache, load_mmap_weights,
                                           weights_cache_dir, write_weights_cache)
from toolchain.memory.measure import MIB, measure_peak
from toolchain.models import ModelArch, get_preset, random_weights


def _flat(weights) -> dict[str, torch.Tensor]:
    from toolchain.models import state_dict_from_weights

    return state_dict_from_weights(weights)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_round_trip_is_exact(tmp_path, tied):
    arch = ModelArch(hidden=16, layers=3, heads=2, kv_heads=1, intermediate=24, vocab=50, max_positions=64,
                      tie_embeddings=tied)
    weights = random_weights(arch, seed=4)
    path = write_weights_cache(tmp_path / "entry", arch, weights)
    assert sorted(p.name for p in path.iterdir()) == [ARCH_FILE, "globals.safetensors"] + [
        f"layer-{i:03d}.safetensors" for i in range(3)]
    arch2, loaded = load_mmap_weights(path)
    assert arch2 == arch and loaded.tied == tied
    expected, got = _flat(weights), _flat(loaded)
    assert sorted(expected) == sorted(got)
    for k in expected:
        assert torch.equal(expected[k], got[k]), k


def test_ensure_builds_once_and_keys_by_model_init_seed(tmp_path):
    path = ensure_weights_cache(tmp_path, "tiny", "random", 1)
    assert path == weights_cache_dir(tmp_path, "tiny", "random", 1) and (path / ARCH_FILE).is_file()
    stamp = (path / "globals.safetensors").stat().st_mtime_ns
    assert ensure_weights_cache(tmp_path, "tiny", "random", 1) == path
    assert (path / "globals.safetensors").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert weights_cache_dir(tmp_path, "tiny", "random", 2) != path
    _, loaded = load_mmap_weights(path)
    assert torch.equal(loaded.embed, random_weights(get_preset("tiny"), seed=1).embed)


def test_an_entry_with_its_quantized_program_weights_still_loads_its_float32_shards(tmp_path):
    """`bench memory --program` writes the quantized weights file into the entry; loading the entry again
    reads only the float32 shards (the quantized file's tensors are not the model's)."""
    path = ensure_weights_cache(tmp_path, "tiny", "random", 1)
    assert ensure_quantized(path, "int4", 16).parent == path
    _, loaded = load_mmap_weights(path)
    assert torch.equal(loaded.embed, random_weights(get_preset("tiny"), seed=1).embed)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
def test_loaded_weights_are_file_backed(tmp_path):
    arch = ModelArch(hidden=256, layers=1, heads=4, kv_heads=2, intermediate=512, vocab=40_000, max_positions=64)
    path = write_weights_cache(tmp_path / "entry", arch, random_weights(arch, seed=0))
    embed_mb = arch.vocab * arch.hidden * 4 / MIB                    # 39 MiB
    with measure_peak() as m:
        _, weights = load_mmap_weights(path)
        float(weights.embed.sum())                                   # touch every page of the embedding
    assert m.file_drift_bytes / MIB > embed_mb - 1                   # RssFile grew by the embedding...
    assert (m.peak_anon_bytes - m.anon_before_bytes) / MIB < embed_mb / 4  # ...RssAnon did not


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quantized_entry_streams_without_float32_shards_and_equals_the_cached_path(tmp_path, kind):
    """`bench memory --quant` on a model without a float32 entry (a 7B model: 30 GB of float32) writes only the
    quantized file, streamed from the source: the same bytes as quantizing the float32 entry, no float32 shard
    written, and the entry's architecture readable by the workers (load_quantized)."""
    from toolchain.bench.weights_cache import QUANT_ARCH_FILE, cache_arch, load_quantized, quantized_file

    streamed_dir = weights_cache_dir(tmp_path / "a", "tiny", "random", 3)
    streamed = ensure_quantized(streamed_dir, kind, 16, model="tiny", init="random", seed=3)
    assert sorted(p.name for p in streamed_dir.iterdir()) == sorted([QUANT_ARCH_FILE, streamed.name])
    assert streamed == quantized_file(streamed_dir, kind, 16)
    cached = ensure_quantized(ensure_weights_cache(tmp_path / "b", "tiny", "random", 3), kind, 16)
    assert streamed.read_bytes() == cached.read_bytes()
    assert cache_arch(streamed_dir) == get_preset("tiny")
    arch, weights = load_quantized(streamed_dir, kind, 16, 1 << 10)
    assert arch == get_preset("tiny") and len(weights.layers) == arch.layers
    other = ensure_quantized(weights_cache_dir(tmp_path / "a", "tiny", "random", 4), kind, 16, model="tiny",
                             init="random", seed=4)
    assert other.read_bytes() != streamed.read_bytes()          # the seed reaches the weights
