"""The one frozen-weights file of a program (`weights.safetensors`), shared by every target.

Keys (Hugging Face layouts, `weight` [out, in]):
  embed [V, d], final_norm [d], lm_head [V, d] (untied models only; tied models use `embed`); in int4
      programs (`QuantSpec.head_quantized`) embed.qweight / embed.scales (and lm_head.*) instead
  layers.{i}.input_norm, .post_norm [d]; .q_bias [q], .k_bias, .v_bias [kv] (qkv_bias); .q_norm, .k_norm
      [head_dim] (qk_norm)
  layers.{i}.<proj> [out, in] float32, or, quantized (<proj> in QUANTIZED_FIELDS):
      layers.{i}.<proj>.qweight  int8 [out, in] / uint8 [out, in/2] (int4, interleaved nibbles: mesp/ops/quant.py)
      layers.{i}.<proj>.scales   float32 [out, in/group]
Apps memory-map the file and hand each tensor to the methods without copying (clean file-backed
pages: not counted by the phones' footprint metrics). Every tensor's data starts at a multiple of 64
bytes from the start of the file (checked at write time), so a direct buffer over the map is aligned
for its dtype.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from toolchain.errors import BadInput, ShapeMismatch
from toolchain.mesp.ops.quant import QuantWeight, quantize, with_chunk_rows
from toolchain.models.presets import ModelArch
from toolchain.models.shards import read_safetensors_header
from toolchain.models.source import CHUNK_BYTES, WeightSource, model_tensor_names, tensor_shape
from toolchain.models.weights import LayerWeights, ModelWeights
from toolchain.program.spec import QUANTIZED_FIELDS, QuantSpec

__all__ = ["weight_entries", "weight_tensors", "file_layout", "weights_file_size", "write_weights",
           "write_weights_streamed", "read_header", "map_weights", "model_weights", "ALIGN"]

ALIGN = 64
_NP = {"F32": np.float32, "I8": np.int8, "U8": np.uint8, "I64": np.int64}


def _matrix_kind(name: str, quant: QuantSpec) -> str:
    """How tensor `name` (models/source.py names) is stored: "none" (float32), "int8" or "int4"."""
    if name in ("embed", "lm_head"):
        return "int4" if quant.head_quantized else "none"
    return quant.kind if name.rsplit(".", 1)[-1] in QUANTIZED_FIELDS else "none"


def _stored(name: str, shape: tuple[int, ...], kind: str, group: int) -> list[tuple[str, str, tuple[int, ...]]]:
    if kind == "none":
        return [(name, "F32", shape)]
    o, i = shape
    q = (name + ".qweight", "I8", (o, i)) if kind == "int8" else (name + ".qweight", "U8", (o, i // 2))
    return [q, (name + ".scales", "F32", (o, i // group))]


def weight_entries(arch: ModelArch, quant: QuantSpec) -> list[tuple[str, str, tuple[int, ...]]]:
    """(key, dtype, shape) of every tensor of the file in file order, from the architecture alone."""
    return [e for name in model_tensor_names(arch)
            for e in _stored(name, tensor_shape(arch, name), _matrix_kind(name, quant), quant.group)]


def weight_tensors(weights: ModelWeights, quant: QuantSpec) -> dict[str, Tensor]:
    """The file's tensors in memory, float32 (quantized projections as qweight + scales), in file order: what
    `write_weights_streamed` writes, for callers that hold the model anyway (tests, the benchmarks' cache)."""
    out = {}

    def matrix(key: str, t: Tensor) -> None:
        kind = _matrix_kind(key, quant)
        if kind == "none":
            out[key] = t.float().contiguous()
        else:
            qw = quantize(t.float(), kind, quant.group)
            out[key + ".qweight"], out[key + ".scales"] = qw.q.contiguous(), qw.scale.float().contiguous()

    matrix("embed", weights.embed)
    matrix("final_norm", weights.final_norm)
    if not weights.tied:
        matrix("lm_head", weights.lm_head)
    for i, lw in enumerate(weights.layers):
        for name, t in lw.present().items():
            matrix(f"layers.{i}.{name}", t)
    return out


class FileLayout(NamedTuple):
    """Where every tensor of a weights file goes: the header bytes, each key's absolute data offset, the size,
    and the filler bytes after each key (`__pad_N`, so that the next key starts 64-aligned)."""

    header: bytes
    offsets: dict[str, int]
    size: int
    padding: dict[str, int]


def file_layout(entries: list[tuple[str, str, tuple[int, ...]]]) -> FileLayout:
    """The safetensors layout of `entries` with every tensor's data 64-byte aligned in the file.

    safetensors packs tensors back to back; alignment is obtained by padding each tensor to a multiple of 64
    bytes with a 1-D uint8 filler tensor (`__pad_N`, N the tensor's index), which readers ignore (keys starting
    with `__`), and by padding the JSON header with spaces so that the data starts 64-aligned.
    """
    header: dict[str, dict] = {}
    offset, rel, padding = 0, {}, {}
    for n, (key, dtype, shape) in enumerate(entries):
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NP[dtype]).itemsize
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        rel[key] = offset
        offset += nbytes
        pad = padding[key] = -offset % ALIGN
        if pad:
            header[f"__pad_{n}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [offset, offset + pad]}
            offset += pad
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)      # data starts 64-aligned in the file
    base = 8 + len(raw)
    return FileLayout(len(raw).to_bytes(8, "little") + raw, {k: base + o for k, o in rel.items()}, base + offset,
                      padding)


def weights_file_size(arch: ModelArch, quant: QuantSpec) -> int:
    """The exact size of the program's weights file (to check the free space before an export)."""
    return file_layout(weight_entries(arch, quant)).size


_DTYPE_CODES = {torch.float32: "F32", torch.int8: "I8", torch.uint8: "U8", torch.int64: "I64"}


def _pwrite(fd: int, t: Tensor, offset: int) -> int:
    view = memoryview(t.detach().cpu().contiguous().numpy()).cast("B")
    n = len(view)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done
    return n


def write_weights(path: Path, tensors: dict[str, Tensor]) -> None:
    """Write `tensors` (in their order) as a weights file (`file_layout`)."""
    layout = file_layout([(k, _DTYPE_CODES[t.dtype], tuple(t.shape)) for k, t in tensors.items()])
    with Path(path).open("wb") as f:
        f.write(layout.header)
        f.truncate(layout.size)                   # padding reads as zeros
        f.flush()
        for key, t in tensors.items():
            _pwrite(f.fileno(), t, layout.offsets[key])


def write_weights_streamed(path: Path, source: WeightSource, quant: QuantSpec, *,
                           on_tensor: Callable[[str, int, int], None] | None = None,
                           chunk_bytes: int = CHUNK_BYTES) -> int:
    """Write the program's weights file from `source`, one block of rows at a time: the file `write_weights(path,
    weight_tensors(materialize(source), quant))` writes, byte for byte (quantization is per row, so blocks of rows
    give the same bytes), holding at most one block (`chunk_bytes` of float32) and its quantized form.

    Args:
        on_tensor: called after each model tensor with (name, bytes of the file written so far, file size):
            the header, the tensors written and their filler; after the last tensor the two sizes are equal.
        chunk_bytes: rows read at once, at most this many bytes of float32 (at least one row).

    Returns:
        the file's size in bytes.
    """
    arch = source.arch
    layout = file_layout(weight_entries(arch, quant))
    done = len(layout.header)
    # One intra-op thread: a block is too small for torch's thread pool to pay, and on a busy host its waits
    # cost most of the time (Qwen2.5-0.5B int4 on this 2-core host beside other jobs: 9.6-11.0 CPU-s with one
    # thread, 49-51 with two; the whole model quantized at once took 15).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _write_blocks(path, source, quant, layout, done, on_tensor, chunk_bytes)
    finally:
        torch.set_num_threads(threads)
    return layout.size


def _write_blocks(path: Path, source: WeightSource, quant: QuantSpec, layout: FileLayout, done: int,
                  on_tensor: Callable[[str, int, int], None] | None, chunk_bytes: int) -> None:
    arch = source.arch
    with Path(path).open("wb") as f:
        f.write(layout.header)
        f.truncate(layout.size)
        f.flush()
        fd = f.fileno()
        for name in model_tensor_names(arch):
            kind, want, seen = _matrix_kind(name, quant), tensor_shape(arch, name), 0
            for start, rows in source.chunks(name, chunk_bytes):
                if tuple(rows.shape[1:]) != want[1:] or start != seen or start + rows.shape[0] > want[0]:
                    raise ShapeMismatch(f"tensor {name!r}: rows {start}..{start + rows.shape[0]} of shape "
                                        f"{list(rows.shape)} do not fit its shape {list(want)}")
                seen += rows.shape[0]
                if kind == "none":
                    done += _pwrite(fd, rows, layout.offsets[name] + start * rows[0].numel() * 4)
                    continue
                qw = quantize(rows, kind, quant.group)
                q, scales = qw.q, qw.scale.float()
                done += _pwrite(fd, q, layout.offsets[name + ".qweight"] + start * q[0].numel() * q.element_size())
                done += _pwrite(fd, scales, layout.offsets[name + ".scales"] + start * scales[0].numel() * 4)
            if seen != want[0]:
                raise ShapeMismatch(f"tensor {name!r} has {seen} rows, its shape is {list(want)}")
            done += sum(layout.padding[k] for k in ((name,) if kind == "none" else (name + ".qweight", name + ".scales")))
            if on_tensor is not None:
                on_tensor(name, done, layout.size)


def read_header(path: Path) -> tuple[dict[str, dict], int, int]:
    """The tensor entries of a weights file, its data start and its size, every entry checked against the
    file before anything is mapped (`read_safetensors_header`): a dtype the program writes, a shape of
    non-negative integers, data offsets inside the file whose length is the shape's, no two tensors
    overlapping, each tensor's data 64-byte aligned. A truncated or forged file is one BadInput here (it used
    to be `ValueError: cannot reshape`, a `MemoryError`, or a SIGBUS when a mapped page past the end was read).

    Returns:
        (entries without `__metadata__`, offset of the data in the file, file size in bytes)
    """
    entries, base, size = read_safetensors_header(
        path, dtype_sizes={k: np.dtype(v).itemsize for k, v in _NP.items()}, noun="weights file",
        redo="re-export the program", align=ALIGN, disjoint=True)
    return {t.name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.start - base, t.stop - base]}
            for t in entries}, base, size


def map_weights(path: Path) -> dict[str, Tensor]:
    """Every tensor of the file as a read-only view of one memory map (no copy: file-backed pages), after
    `read_header` checked every entry against the file."""
    path = Path(path)
    header, base, size = read_header(path)
    if size == base:
        return {}
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
    out = {}
    for key, info in header.items():
        if key.startswith("__"):
            continue
        start, stop = info["data_offsets"]
        arr = mm[base + start:base + stop].view(_NP[info["dtype"]]).reshape(info["shape"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable tensor": the methods never write weights
            out[key] = torch.from_numpy(arr)
    return out


def model_weights(tensors: dict[str, Tensor], arch: ModelArch, quant: QuantSpec) -> ModelWeights:
    """The file's tensors as the step's bundles (quantized projections as `QuantWeight`, dequantized in
    row chunks of at most `quant.chunk_elems` weights, as the methods do): the eager step on exactly the
    weights an exported program runs on. No tensor is copied."""
    layers = []
    for i in range(arch.layers):
        fields = {name: None for name in LayerWeights._fields}
        for name in arch.layer_shapes():
            key = f"layers.{i}.{name}"
            if quant.kind != "none" and name in QUANTIZED_FIELDS:
                qw = QuantWeight(tensors[key + ".qweight"], tensors[key + ".scales"], quant.bits)
                fields[name] = with_chunk_rows(qw, quant.chunk_elems)
            else:
                fields[name] = tensors[key]
        layers.append(LayerWeights(**fields))
    def matrix(key: str):
        if key + ".qweight" in tensors:
            return QuantWeight(tensors[key + ".qweight"], tensors[key + ".scales"], quant.bits)
        return tensors.get(key)

    embed = matrix("embed")
    if embed is None:
        raise BadInput("the weights file has no embed; re-export the program")
    lm_head = matrix("lm_head")
    if not arch.tie_embeddings and lm_head is None:
        raise BadInput("the weights file has no lm_head, but the model's embeddings are untied; re-export the program")
    return ModelWeights(embed, tuple(layers), tensors["final_norm"], embed if lm_head is None else lm_head)
