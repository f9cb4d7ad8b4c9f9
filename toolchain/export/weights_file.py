"""The one frozen-weights file of a v3 program (`weights.safetensors`), shared by every target.

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

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from toolchain.errors import BadInput
from toolchain.export.program import QUANTIZED_FIELDS, QuantSpec
from toolchain.mesp.ops.quant import QuantWeight, quantize, with_chunk_rows
from toolchain.models.presets import ModelArch
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["weight_tensors", "weights_nbytes_lower_bound",
           "write_weights", "read_header", "map_weights", "model_weights", "ALIGN"]

ALIGN = 64
_NP = {"F32": np.float32, "I8": np.int8, "U8": np.uint8, "I64": np.int64}


def weight_tensors(weights: ModelWeights, quant: QuantSpec) -> dict[str, Tensor]:
    """The file's tensors, float32 (quantized projections as qweight + scales)."""
    out = {}

    def matrix(key: str, t: Tensor, kind: str) -> None:
        if kind == "none":
            out[key] = t.float().contiguous()
        else:
            qw = quantize(t.float(), kind, quant.group)
            out[key + ".qweight"], out[key + ".scales"] = qw.q.contiguous(), qw.scale.float().contiguous()

    head_kind = "int4" if quant.head_quantized else "none"
    matrix("embed", weights.embed, head_kind)
    out["final_norm"] = weights.final_norm.float().contiguous()
    if not weights.tied:
        matrix("lm_head", weights.lm_head, head_kind)
    for i, lw in enumerate(weights.layers):
        for name, t in lw.present().items():
            key = f"layers.{i}.{name}"
            matrix(key, t, quant.kind if name in QUANTIZED_FIELDS else "none")
    return out


def weights_nbytes_lower_bound(weights: ModelWeights, quant_kind: str) -> int:
    """A lower bound of the weights file's size, to check the free space before an export: int8 ~1 byte and
    int4 ~0.5 byte per 2-D weight, the rest float32 (the programs hold no weight)."""
    total, seen = 0, set()
    for t in _tensors(weights):
        if id(t) in seen:        # tied embeddings: one tensor
            continue
        seen.add(id(t))
        per = 4 if quant_kind == "none" or t.dim() != 2 else (1 if quant_kind == "int8" else 0.5)
        total += int(t.numel() * per)
    return total


def _tensors(obj):
    if isinstance(obj, Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def write_weights(path: Path, tensors: dict[str, Tensor]) -> None:
    """safetensors with every tensor's data 64-byte aligned in the file.

    safetensors packs tensors back to back; alignment is obtained by writing them in order of
    decreasing size class and padding each to a multiple of 64 bytes with a 1-D uint8 filler tensor
    (`__pad_N`), which readers ignore (keys starting with `__`).
    """
    header: dict[str, dict] = {}
    blobs: list[bytes] = []
    offset = 0
    dtypes = {torch.float32: "F32", torch.int8: "I8", torch.uint8: "U8", torch.int64: "I64"}
    for n, (key, t) in enumerate(tensors.items()):
        data = t.detach().cpu().contiguous().numpy().tobytes()
        header[key] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
        pad = -offset % ALIGN
        if pad:
            header[f"__pad_{n}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [offset, offset + pad]}
            blobs.append(b"\0" * pad)
            offset += pad
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)      # data starts 64-aligned in the file
    with Path(path).open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)


MAX_HEADER_BYTES = 100 * 2**20   # a Qwen2.5-3B program's header is ~60 KB


def read_header(path: Path) -> tuple[dict[str, dict], int, int]:
    """The tensor entries of a weights file, its data start and its size, every entry checked against the
    file before anything is mapped: a known dtype, a shape of non-negative integers, data offsets inside
    the file whose length is the shape's, no two tensors overlapping, each tensor's data 64-byte aligned.
    A truncated or forged file is one BadInput here (it used to be `ValueError: cannot reshape`, a
    `MemoryError`, or a SIGBUS when a mapped page past the end was read).

    Returns:
        (entries without `__metadata__`, offset of the data in the file, file size in bytes)
    """
    from toolchain.validate import loads

    path = Path(path)
    redo = "re-export the program"
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= n <= min(size - 8, MAX_HEADER_BYTES):
                raise BadInput(f"{path} is not a weights file (its header length {n} does not fit its {size} "
                               f"bytes); {redo}")
            raw = f.read(n)
    except OSError as e:
        raise BadInput(f"{path} cannot be read ({e.strerror}); {redo}") from None
    header = loads(raw, f"{path} header")
    if not isinstance(header, dict):
        raise BadInput(f"{path} header is not a JSON object; {redo}")
    base = 8 + n
    entries, spans = {}, []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        entries[key] = _checked_entry(path, key, info, base, size)
        start, stop = info["data_offsets"]
        if stop > start:
            spans.append((start, stop, key))
    spans.sort()
    for (_, stop, a), (start, _, b) in zip(spans, spans[1:]):
        if start < stop:
            raise BadInput(f"{path}: tensors {a!r} and {b!r} overlap in the file; {redo}")
    return entries, base, size


def _checked_entry(path: Path, key: str, info, base: int, size: int) -> dict:
    where, redo = f"{path}: tensor {key!r}", "re-export the program"
    if not isinstance(info, dict) or info.get("dtype") not in _NP:
        raise BadInput(f"{where} has no known dtype ({', '.join(_NP)}); {redo}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and len(shape) <= 8
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise BadInput(f"{where} has a malformed shape {str(shape)[:60]}; {redo}")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise BadInput(f"{where} has malformed data_offsets {str(offsets)[:60]}; {redo}")
    start, stop = offsets
    numel = 1
    for d in shape:
        numel *= d
    want = numel * np.dtype(_NP[info["dtype"]]).itemsize
    if stop - start != want:
        raise BadInput(f"{where} spans {stop - start} bytes, its shape {shape} and dtype {info['dtype']} need "
                       f"{want}; {redo}")
    if base + stop > size:
        raise BadInput(f"{where} ends at byte {base + stop}, past the end of the file ({size} bytes): the file is "
                       f"truncated; {redo}")
    if not key.startswith("__") and (base + start) % ALIGN:
        raise BadInput(f"{where} does not start on a {ALIGN}-byte boundary of the file; {redo}")
    return info


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
