"""Frozen weights for benchmarks: written once as float32 safetensors shards, then memory-mapped.

Phones map their frozen weights from flash and the OS does not charge the app for those clean
pages; every benchmark mode must get the same treatment, eager PyTorch included. So the weights
are saved once (random init or a converted checkpoint) and each benchmark process maps them with
safetensors (`safe_open(...).get_tensor` returns tensors over a private file mapping: their
pages show up in RssFile, not RssAnon). One shard per layer keeps the writer's transient copy to
one layer (safetensors serializes a whole file in memory).

With `--quant int8|int4` every mode runs on the program's weights file (`quantized_file`), never on the float32
shards: when the float32 shards are absent, that file is written straight from the model's source one block of
rows at a time (`toolchain export`'s `write_weights_streamed`: the same bytes), so a 7B model is benchmarked
without its 30 GB of float32 on disk nor in memory; the entry's architecture is then in `QUANT_ARCH_FILE`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch

from toolchain.atomic import atomic_dir
from toolchain.models import PRESETS, ModelWeights, ModelArch, load_model, state_dict_from_weights
from toolchain.models import weights_from_state_dict

__all__ = ["ARCH_FILE", "QUANT_ARCH_FILE", "cache_arch", "default_cache_dir",
           "weights_cache_dir", "ensure_weights_cache", "write_weights_cache",
           "load_mmap_weights", "quantized_file", "ensure_quantized", "load_quantized"]

ARCH_FILE = "arch.json"  # written last: its presence marks a complete cache entry
# An entry holding only quantized weights files (no float32 shards): the architecture, written after the first one.
QUANT_ARCH_FILE = "arch-quantized.json"


def default_cache_dir() -> Path:
    """$TOOLCHAIN_CACHE_DIR, else $XDG_CACHE_HOME/toolchain, else ~/.cache/toolchain."""
    if os.environ.get("TOOLCHAIN_CACHE_DIR"):
        return Path(os.environ["TOOLCHAIN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolchain"


def weights_cache_dir(cache_dir: Path, model: str, init: str, seed: int) -> Path:
    """Where the float32 shards of (model, init, seed) live; checkpoint paths are keyed by a hash."""
    if model in PRESETS:
        name = model
    else:
        name = "ckpt-" + hashlib.sha256(str(Path(model).resolve()).encode()).hexdigest()[:12]
    suffix = f"-seed{seed}" if init == "random" else ""
    return Path(cache_dir) / "bench-weights" / f"{name}-{init}{suffix}-float32"


def _shards(arch: ModelArch, sd: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    shards: dict[str, dict[str, torch.Tensor]] = {f"layer-{i:03d}.safetensors": {} for i in range(arch.layers)}
    shards["globals.safetensors"] = {}
    for key, t in sd.items():
        parts = key.split(".")
        name = f"layer-{int(parts[2]):03d}.safetensors" if parts[:2] == ["model", "layers"] else "globals.safetensors"
        shards[name][key] = t.contiguous()
    return shards


def write_weights_cache(path: Path, arch: ModelArch, weights: ModelWeights) -> Path:
    """Write `weights` (float32) as per-layer safetensors shards plus arch.json, atomically."""
    from safetensors.torch import save_file

    with atomic_dir(Path(path)) as tmp:
        for name, tensors in _shards(arch, state_dict_from_weights(weights.to(torch.float32))).items():
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
        (tmp / ARCH_FILE).write_text(json.dumps(dataclasses.asdict(arch), indent=2, sort_keys=True))
    return Path(path)


def ensure_weights_cache(cache_dir: Path, model: str, init: str, seed: int) -> Path:
    """The cache entry of (model, init, seed), built now if absent (needs the weights in RAM once)."""
    path = weights_cache_dir(cache_dir, model, init, seed)
    if (path / ARCH_FILE).is_file():
        return path
    arch, weights = load_model(model, init=init, seed=seed, dtype=torch.float32)
    write_weights_cache(path, arch, weights)
    return path


def load_mmap_weights(path: Path) -> tuple[ModelArch, ModelWeights]:
    """Map a cache entry: tensors are views of private file mappings (no anonymous copy)."""
    from safetensors import safe_open

    path = Path(path)
    arch = ModelArch.from_dict(json.loads((path / ARCH_FILE).read_text()))
    sd: dict[str, torch.Tensor] = {}
    # the float32 shards only: the entry also holds the quantized program weights files (quantized_file)
    for shard in [*sorted(path.glob("layer-*.safetensors")), path / "globals.safetensors"]:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                sd[key] = f.get_tensor(key)
    return arch, weights_from_state_dict(arch, sd, dtype=torch.float32)


def quantized_file(path: Path, kind: str, group: int, head: bool = True) -> Path:
    """The cache entry's weights in a program's weights-file format (program/weights_file.py), quantized."""
    packing = "-interleaved" if kind == "int4" else ""   # the int4 byte layout (mesp/ops/quant.py)
    head_part = "-head4" if kind == "int4" and head else ""   # int4 embedding and LM head (QuantSpec.head)
    return Path(path) / f"program-weights-{kind}-g{group}{packing}{head_part}.safetensors"


def cache_arch(path: Path) -> ModelArch:
    """The architecture of a cache entry (float32 shards' `ARCH_FILE`, else a quantized-only entry's)."""
    path = Path(path)
    arch_file = path / ARCH_FILE if (path / ARCH_FILE).is_file() else path / QUANT_ARCH_FILE
    return ModelArch.from_dict(json.loads(arch_file.read_text()))


def ensure_quantized(path: Path, kind: str, group: int, head: bool = True, *, model: str | None = None,
                     init: str = "random", seed: int = 0) -> Path:
    """Write the quantized weights file of a cache entry once (the same bytes `toolchain export` writes): from
    the entry's float32 shards when they exist, else (`model` given) streamed from the model's source without
    holding the model (`write_weights_streamed`; peak ~10 x `models.source.CHUNK_BYTES`)."""
    from toolchain.program.spec import QuantSpec
    from toolchain.program.weights_file import weight_tensors, write_weights, write_weights_streamed

    path = Path(path)
    out = quantized_file(path, kind, group, head)
    if out.is_file():
        return out
    tmp = out.with_suffix(".tmp")
    if (path / ARCH_FILE).is_file() or model is None:
        _, weights = load_mmap_weights(path)
        write_weights(tmp, weight_tensors(weights, QuantSpec(kind, group, head=head)))
    else:
        from toolchain.models.load import model_source

        arch, source = model_source(model, init=init, seed=seed)
        path.mkdir(parents=True, exist_ok=True)
        write_weights_streamed(tmp, source, QuantSpec(kind, group, head=head))
        source.check_unchanged()
        if not (path / QUANT_ARCH_FILE).is_file():
            arch_tmp = path / (QUANT_ARCH_FILE + ".tmp")
            arch_tmp.write_text(json.dumps(dataclasses.asdict(arch), indent=2, sort_keys=True))
            os.replace(arch_tmp, path / QUANT_ARCH_FILE)
    os.replace(tmp, out)
    return out


def load_quantized(path: Path, kind: str, group: int, chunk_elems: int, head: bool = True
                   ) -> tuple[ModelArch, ModelWeights]:
    """Map the quantized weights file (no copy); projections (and an int4 head) as QuantWeight, dequantized
    per chunk on use."""
    from toolchain.program.spec import QuantSpec
    from toolchain.program.weights_file import map_weights, model_weights

    arch = cache_arch(path)
    tensors = map_weights(ensure_quantized(path, kind, group, head))
    return arch, model_weights(tensors, arch, QuantSpec(kind, group, chunk_elems, head=head))
