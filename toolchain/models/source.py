"""Where a model's frozen tensors come from, read one tensor (and one block of rows) at a time.

Export streams a model through `WeightSource.chunks` into the program's weights file and never holds the whole
model (program/weights_file.py); `materialize` builds the in-memory `ModelWeights` that the eager step, the
benchmarks and the tests use, from the same source, so both see the same numbers.

Tensors are named as the weights file names them (`model_tensor_names`): embed, final_norm, lm_head (untied
models only), layers.{i}.<LayerWeights field>.

Sources:
  `CheckpointSource`  a Hugging Face checkpoint directory (models/shards.py: shards read with pread, any float
                      dtype), every key, shape and dtype checked before the first tensor is read;
  `RandomSource`      seeded random weights of an architecture: each tensor is drawn from a generator of its
                      own (`numpy.random.SeedSequence(seed, spawn_key=(layer + 1, field))`, globals
                      `spawn_key=(0, k)`), so any layer can be generated alone, rows in any block size give the
                      same values, and the values depend only on (seed, tensor) and the pinned numpy;
  `InMemorySource`    a `ModelWeights` already in memory (tests, the demo).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from toolchain.errors import BadInput, MissingWeights, ShapeMismatch
from toolchain.models.arch import ModelArch
from toolchain.models.keys import GLOBAL_KEYS, LAYER_KEYS
from toolchain.models.shards import FLOAT_DTYPES, CheckpointShards
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["WeightSource", "CheckpointSource", "RandomSource", "InMemorySource", "model_tensor_names",
           "tensor_shape", "materialize", "empty_weights", "check_checkpoint_keys", "CHUNK_BYTES"]

# Rows of a tensor handed out at once: at most this many bytes of float32. Quantizing a block makes about nine
# temporaries of its size (measured peak above the resting RSS: 18 MiB with 1 MiB blocks, 54 with 4, 169 with
# 16), and smaller blocks cost nothing measurable: export's weights stage peaks at ~10x this, whatever the model.
CHUNK_BYTES = 4 << 20


def model_tensor_names(arch: ModelArch) -> list[str]:
    """Every frozen tensor of the model, in the weights file's order."""
    names = ["embed", "final_norm"] + ([] if arch.tie_embeddings else ["lm_head"])
    return names + [f"layers.{i}.{f}" for i in range(arch.layers) for f in arch.layer_shapes()]


def tensor_shape(arch: ModelArch, name: str) -> tuple[int, ...]:
    if name in ("embed", "lm_head"):
        return (arch.vocab, arch.hidden)
    if name == "final_norm":
        return (arch.hidden,)
    return arch.layer_shapes()[name.split(".", 2)[2]]


def _hf_key(name: str) -> str:
    if name.startswith("layers."):
        _, i, field = name.split(".", 2)
        return LAYER_KEYS[field].format(int(i))
    return GLOBAL_KEYS[name]


def _block_rows(shape: tuple[int, ...], chunk_bytes: int) -> int:
    width = 1
    for d in shape[1:]:
        width *= d
    return max(1, chunk_bytes // (4 * width))


class WeightSource:
    """A model's frozen tensors, one block of rows at a time (subclasses define `_rows` or `chunks`)."""

    arch: ModelArch

    def chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, Tensor]]:
        """(first row, rows) blocks of tensor `name` in float32, in order, each at most `chunk_bytes` (at least
        one row); a 1-d tensor comes as one block."""
        shape = tensor_shape(self.arch, name)
        if len(shape) == 1:
            yield 0, self._rows(name, 0, shape[0]).float()
            return
        step = _block_rows(shape, chunk_bytes)
        for start in range(0, shape[0], step):
            yield start, self._rows(name, start, min(shape[0], start + step)).float()

    def _rows(self, name: str, start: int, stop: int) -> Tensor:
        raise NotImplementedError

    def check_unchanged(self) -> None:
        """Raises BadInput when a file the tensors were read from changed since it was first opened (a checkpoint's
        shards: models/shards.py). Sources held in memory never change."""

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
        """The whole tensor `name` in `dtype` (converted from the source's own dtype: a float64 reference gets a
        bf16 checkpoint's values exactly)."""
        return self._rows(name, 0, tensor_shape(self.arch, name)[0]).to(dtype)


def check_checkpoint_keys(arch: ModelArch, shapes: dict[str, tuple[int, ...]]) -> None:
    """The checks of a Hugging Face state dict (HF key -> shape) against the architecture, before any tensor is
    read: every tensor the model needs is there with its shape, and nothing else is (a tied checkpoint may still
    carry lm_head.weight; old ones carry rotary buffers).

    Raises:
        MissingWeights: a required key is absent (named in the message).
        ShapeMismatch: a tensor's shape differs from the architecture's, or the checkpoint has tensors the
            architecture does not use (e.g. q/k/v biases under a config without them).
    """
    used = set()
    for name in model_tensor_names(arch):
        key, want = _hf_key(name), tensor_shape(arch, name)
        used.add(key)
        if key not in shapes:
            raise MissingWeights(f"checkpoint lacks {key!r}")
        if tuple(shapes[key]) != want:
            raise ShapeMismatch(f"{key!r} has shape {list(shapes[key])}, the config implies {list(want)}"
                                f"{_sizes_note(arch, shapes)}")
    unused = sorted(k for k in set(shapes) - used
                    if not k.endswith("rotary_emb.inv_freq") and not (arch.tie_embeddings and k == GLOBAL_KEYS["lm_head"]))
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise ShapeMismatch(f"checkpoint has tensors the {arch.family} config does not use: "
                            f"{', '.join(map(repr, unused[:3]))}{more}")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _sizes_note(arch: ModelArch, shapes: dict[str, tuple[int, ...]]) -> str:
    """When the shards hold another number of parameters than config.json describes (a config of one model
    size beside another size's shards): both counts, so the message says what is wrong with the directory."""
    want = sum(_numel(tensor_shape(arch, name)) for name in model_tensor_names(arch))
    have = sum(_numel(shape) for key, shape in shapes.items() if not key.endswith("rotary_emb.inv_freq")
               and not (arch.tie_embeddings and key == GLOBAL_KEYS["lm_head"]))
    if have == want:
        return ""
    return (f" (config.json describes {want / 1e9:.2f}B parameters, the shards hold {have / 1e9:.2f}B: they are "
            f"not the same model; put the config.json that came with these shards beside them)")


class CheckpointSource(WeightSource):
    """A Hugging Face checkpoint directory's tensors (config parsed by the caller into `arch`).

    Raises (at construction, before anything is read):
        MissingWeights / ShapeMismatch: see `check_checkpoint_keys`; a missing shard (models/shards.py).
        BadInput: a truncated or malformed shard, or a model tensor of a dtype other than F64/F32/F16/BF16.
    """

    def __init__(self, arch: ModelArch, root: Path) -> None:
        self.arch, self.root = arch, Path(root)
        self.shards = CheckpointShards(self.root)
        check_checkpoint_keys(arch, {k: t.shape for k, t in self.shards.tensors.items()})
        for name in model_tensor_names(arch):
            t = self.shards.tensors[_hf_key(name)]
            if t.dtype not in FLOAT_DTYPES:
                raise BadInput(f"tensor {t.name!r} in {t.path.name} has dtype {t.dtype}; model tensors must be one "
                               f"of {', '.join(FLOAT_DTYPES)}")

    def check_unchanged(self) -> None:
        self.shards.check_unchanged()

    def _rows(self, name: str, start: int, stop: int) -> Tensor:
        """Rows of one tensor, checked finite as they are read (a NaN or infinity is refused, naming the tensor,
        its shard and the first bad row)."""
        key = _hf_key(name)
        rows = self.shards.read_rows(key, start, stop)
        finite = torch.isfinite(rows)
        if not bool(finite.all()):
            bad = start + int((~finite).reshape(rows.shape[0], -1).any(1).nonzero()[0, 0]) if rows.dim() > 1 \
                else start + int((~finite).nonzero()[0, 0])
            raise BadInput(f"tensor {key!r} in {self.shards.tensors[key].path.name} holds NaN or infinity (row "
                           f"{bad}); the checkpoint is damaged: download it again")
        return rows


# LayerWeights field index of each layer tensor: a tensor's generator does not depend on which others exist.
_FIELD_INDEX = {f: k for k, f in enumerate(LayerWeights._fields)}
_GLOBAL_INDEX = {"embed": 0, "final_norm": 1, "lm_head": 2}


class RandomSource(WeightSource):
    """Seeded random weights: N(0, 0.02) matrices and biases (HF's `initializer_range`), norms N(1, 0.1), float32,
    each tensor from a generator of its own (see the module docstring)."""

    def __init__(self, arch: ModelArch, seed: int = 0) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.arch, self.seed = arch, seed

    def generator(self, name: str) -> np.random.Generator:
        if name.startswith("layers."):
            _, i, field = name.split(".", 2)
            key = (int(i) + 1, _FIELD_INDEX[field])
        else:
            key = (0, _GLOBAL_INDEX[name])
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=key)))

    def chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, Tensor]]:
        # draws are sequential in row-major order, so blocks of any size give the same values
        shape = tensor_shape(self.arch, name)
        mean, std = (1.0, 0.1) if name.endswith("norm") else (0.0, 0.02)
        gen = self.generator(name)
        step = shape[0] if len(shape) == 1 else _block_rows(shape, chunk_bytes)
        for start in range(0, shape[0], step):
            block = gen.standard_normal((min(step, shape[0] - start),) + shape[1:], dtype=np.float32)
            block *= np.float32(std)
            block += np.float32(mean)
            yield start, torch.from_numpy(block)

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
        parts = [rows.to(dtype) for _, rows in self.chunks(name)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class InMemorySource(WeightSource):
    """A `ModelWeights` already in memory, as a source (its tensors converted to float32 block by block)."""

    def __init__(self, arch: ModelArch, weights: ModelWeights) -> None:
        self.arch, self.weights = arch, weights

    def _rows(self, name: str, start: int, stop: int) -> Tensor:
        if name.startswith("layers."):
            _, i, field = name.split(".", 2)
            t = getattr(self.weights.layers[int(i)], field)
        else:
            t = getattr(self.weights, name)
        return t[start:stop]


def empty_weights(arch: ModelArch, dtype: torch.dtype = torch.float32, device: str = "meta") -> ModelWeights:
    """`ModelWeights` of the architecture's shapes, uninitialized (meta by default: shapes without memory, for
    tracing the step)."""
    shapes = arch.layer_shapes()
    new = lambda name: torch.empty(tensor_shape(arch, name), dtype=dtype, device=device)  # noqa: E731
    layers = tuple(LayerWeights(**{f: (new(f"layers.{i}.{f}") if f in shapes else None) for f in LayerWeights._fields})
                   for i in range(arch.layers))
    embed = new("embed")
    return ModelWeights(embed, layers, new("final_norm"), embed if arch.tie_embeddings else new("lm_head"))


def materialize(source: WeightSource, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """The whole model in memory as `ModelWeights` in `dtype` (tied models: `lm_head` is `embed`)."""
    arch, get = source.arch, lambda name: source.tensor(name, dtype)  # noqa: E731
    shapes = arch.layer_shapes()
    layers = tuple(LayerWeights(**{f: (get(f"layers.{i}.{f}") if f in shapes else None) for f in LayerWeights._fields})
                   for i in range(arch.layers))
    embed = get("embed")
    lm_head = embed if arch.tie_embeddings else get("lm_head")
    final_norm = get("final_norm")
    source.check_unchanged()
    return ModelWeights(embed, layers, final_norm, lm_head)
