"""The one frozen-weights file of a v3 program (`weights.safetensors`), shared by every target.

Keys (Hugging Face layouts, `weight` [out, in]):
  embed [V, d], final_norm [d], lm_head [V, d] (untied models only; tied models use `embed`); in int4
      programs (`QuantSpec.head_quantized`) embed.qweight / embed.scales (and lm_head.*) instead
  layers.{i}.input_norm, .post_norm [d]; .q_bias [d], .k_bias, .v_bias [kv]
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
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["WEIGHTS_NAME", "weight_tensors", "weights_nbytes_lower_bound",
           "write_weights", "map_weights", "model_weights", "ALIGN"]

WEIGHTS_NAME = "weights.safetensors"
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
        for name, t in lw._asdict().items():
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


def map_weights(path: Path) -> dict[str, Tensor]:
    """Every tensor of the file as a read-only view of one memory map (no copy: file-backed pages)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise BadInput(f"{path} is not a readable weights file ({e}); re-export the program") from None
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
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


def model_weights(tensors: dict[str, Tensor], arch: Qwen25Arch, quant: QuantSpec) -> ModelWeights:
    """The file's tensors as the step's bundles (quantized projections as `QuantWeight`, dequantized in
    row chunks of at most `quant.chunk_elems` weights, as the methods do): the eager step on exactly the
    weights an exported program runs on. No tensor is copied."""
    layers = []
    for i in range(arch.layers):
        fields = {}
        for name in LayerWeights._fields:
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
