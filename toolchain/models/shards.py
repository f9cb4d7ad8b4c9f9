"""A Hugging Face checkpoint's safetensors shards, read tensor by tensor without mapping them.

Every shard's header (tensor names, dtypes, shapes, byte ranges) is read and checked against the file when the
checkpoint is opened: nothing is loaded until a caller asks for rows of one tensor, and a truncated or forged
shard, or a shard the index names but the directory lacks, is one `BadInput` naming the tensor before any output
is written. Each shard's identity (device, inode, size, modification time) is recorded when its header is read
and checked at every read and once more at the end (`check_unchanged`: export calls it before its output is
put in place): a shard replaced or rewritten while a command reads it is one `BadInput` and no output. A
rewrite that keeps the size and sets the modification time back (or lands within the file system's timestamp
granularity) is not seen; neither is a change after the check.

Rows are read with `pread` into a buffer of their own: the safetensors library memory-maps whole
shards, and every mapped page a reader touches stays in the process's resident set (a 3B checkpoint's 6 GB would
count against an export that holds one tensor at a time).

Layout of a shard (the safetensors format): 8 bytes little-endian header length n, n bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the data, offsets
relative to byte 8 + n. Sharded checkpoints list `weight_map: {name: shard file}` in
`model.safetensors.index.json`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from toolchain.errors import BadInput, MissingWeights

__all__ = ["ShardTensor", "CheckpointShards", "FLOAT_DTYPES", "read_safetensors_header", "MAX_HEADER_BYTES"]

# Checkpoint dtypes a model tensor may have (converted to the program's float32 as it is read).
FLOAT_DTYPES: dict[str, torch.dtype] = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                                        "BF16": torch.bfloat16}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 2**20   # a safetensors header longer than this is refused, not read


@dataclass(frozen=True)
class ShardTensor:
    """Where one tensor's bytes are: its shard, dtype, shape and absolute byte range in the file."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the first dimension's index); a 0-d or 1-d tensor is one row."""
        return (self.stop - self.start) // max(1, self.shape[0] if len(self.shape) > 1 else 1)


class CheckpointShards:
    """The tensors of a checkpoint directory's `*.safetensors` shards (with `model.safetensors.index.json`: the
    shards it names, each of which must exist), every header checked against its file.

    Raises:
        MissingWeights: no shard at all, or a shard the index names is absent (the message names a tensor in it).
        BadInput: an unreadable or truncated shard, a malformed header entry, a tensor in two shards, or an
            index that does not match the shards (each message names the tensor and the file).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tensors: dict[str, ShardTensor] = {}
        index = self.root / INDEX_NAME
        has_index = index.exists() or index.is_symlink()      # a FIFO or a link loop: refused when read
        if has_index:
            files = self._indexed_files(index)
        else:
            files = sorted(self.root.glob("*.safetensors"))
        if not files:
            raise MissingWeights(f"checkpoint {str(self.root)!r} has no *.safetensors files")
        self.identity: dict[Path, tuple[int, int, int, int]] = {}
        for f in files:
            before = _identity(f)
            entries, _, _ = read_safetensors_header(f, dtype_sizes=_ITEMSIZE, noun="shard",
                                                    redo="download the checkpoint again")
            if _identity(f) != before:
                raise _changed(f)
            self.identity[f] = before
            for t in entries:
                if t.name in self.tensors:
                    raise BadInput(f"tensor {t.name!r} is in two shards ({self.tensors[t.name].path.name} and "
                                   f"{f.name}) of {self.root}")
                self.tensors[t.name] = t
        if has_index:
            self._check_index(index)

    def _indexed_files(self, index: Path) -> list[Path]:
        self._weight_map = _read_index(index)
        files = []
        for shard in dict.fromkeys(self._weight_map.values()):
            path = self.root / shard
            if not (path.exists() or path.is_symlink()):
                names = [k for k, v in self._weight_map.items() if v == shard]
                more = f" and {len(names) - 1} more" if len(names) > 1 else ""
                raise MissingWeights(f"shard {shard} of {self.root} is missing: {INDEX_NAME} puts tensor "
                                     f"{names[0]!r}{more} in it")
            files.append(path)
        return files

    def _check_index(self, index: Path) -> None:
        for name, shard in self._weight_map.items():
            t = self.tensors.get(name)
            if t is None:
                raise BadInput(f"tensor {name!r} is not in shard {shard}, where {index.name} puts it")
            if t.path.name != shard:
                raise BadInput(f"tensor {name!r} is in shard {t.path.name}, {index.name} puts it in {shard}")

    def check_unchanged(self) -> None:
        """Every shard is still the file whose header was read (device, inode, size, mtime).

        Raises:
            BadInput: one was replaced or rewritten (see the module docstring for what cannot be seen).
        """
        for path, ident in self.identity.items():
            if _identity(path) != ident:
                raise _changed(path)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of tensor `name` (a 1-d tensor: its elements), in the checkpoint's dtype."""
        t = self.tensors[name]
        if t.dtype not in FLOAT_DTYPES:
            raise BadInput(f"tensor {name!r} in {t.path.name} has dtype {t.dtype}; model tensors must be one of "
                           f"{', '.join(FLOAT_DTYPES)}")
        rows = t.shape[0] if t.shape else 1
        if not 0 <= start <= stop <= rows:
            raise ValueError(f"rows {start}:{stop} of {name} with {rows} rows")
        width = t.row_bytes if len(t.shape) > 1 else _ITEMSIZE[t.dtype]
        buf = bytearray((stop - start) * width)
        fd = os.open(t.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if _identity(fd) != self.identity[t.path]:
                raise _changed(t.path)
            view, pos = memoryview(buf), t.start + start * width
            while view:
                n = os.preadv(fd, [view], pos)
                if n == 0:            # the file shrank after it was opened
                    raise BadInput(f"tensor {name!r} in {t.path.name} ends past the end of the file: the shard is "
                                   "truncated; download the checkpoint again")
                view, pos = view[n:], pos + n
            if _identity(fd) != self.identity[t.path]:     # rewritten in place while these rows were read
                raise _changed(t.path)
        finally:
            os.close(fd)
        shape = (stop - start,) + t.shape[1:] if len(t.shape) > 1 else (stop - start,)
        if not buf:
            return torch.empty(shape, dtype=FLOAT_DTYPES[t.dtype])
        return torch.frombuffer(buf, dtype=FLOAT_DTYPES[t.dtype]).reshape(shape)


def _identity(f: Path | int) -> tuple[int, int, int, int]:
    from toolchain.inputs import file_identity

    try:
        return file_identity(os.fstat(f) if isinstance(f, int) else os.stat(f))
    except OSError:
        return (0, 0, -1, 0)           # gone: differs from any file's identity


def _changed(path: Path) -> BadInput:
    return BadInput(f"shard {path.name} of {path.parent} changed while it was being read (replaced, or rewritten in "
                    f"place: its device, inode, size or modification time differ); nothing was written: run again "
                    f"once the checkpoint is complete")


def _read_index(index: Path) -> dict[str, str]:
    from toolchain.validate import read_json

    doc = read_json(index)
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise BadInput(f"{index} has no weight_map of tensor names to shard files")
    for shard in set(wm.values()):
        if Path(shard).name != shard:
            raise BadInput(f"{index} names shard {shard!r} outside the checkpoint directory")
    return wm


def read_safetensors_header(path: Path, *, dtype_sizes: Mapping[str, int], noun: str, redo: str,
                            align: int = 0, disjoint: bool = False) -> tuple[list[ShardTensor], int, int]:
    """Every tensor entry of a safetensors file, checked against the file before anything is read or mapped:
    a header length that fits the file, a JSON object, a dtype in `dtype_sizes` (its item size in bytes), a shape
    of at most 8 non-negative integers, data offsets whose span is what shape and dtype need, inside the file.
    With `align`, each tensor not named `__...` starts on an `align`-byte boundary of the file; with `disjoint`,
    no two tensors' bytes overlap. A truncated or forged file is one `BadInput` naming the file (and the tensor),
    ending with `redo`, the way to get a good file ("download the checkpoint again", "re-export the program").

    Both readers of safetensors files without the safetensors library use it: `CheckpointShards` (a checkpoint's
    shards, `noun` "shard") and `toolchain.program.weights_file.read_header` (a program's weights file).

    Returns:
        (entries in header order with absolute byte ranges, offset of the data in the file, file size in bytes)
    """
    from toolchain.validate import loads

    path = Path(path)
    unreadable = f"{path} is not a readable safetensors {noun}"
    from toolchain.inputs import open_input

    try:
        with open_input(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= n <= min(size - 8, MAX_HEADER_BYTES):
                raise BadInput(f"{unreadable} (header length {n} in {size} bytes); {redo}")
            raw = f.read(n)
    except OSError as e:
        raise BadInput(f"{path} cannot be read ({e.strerror}); {redo}") from None
    try:
        header = loads(raw, "header")
    except BadInput as e:
        raise BadInput(f"{unreadable} ({e}); {redo}") from None
    if not isinstance(header, dict):
        raise BadInput(f"{unreadable} (its header is not a JSON object); {redo}")
    base, out = 8 + n, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"tensor {name!r} in {path}"
        if not isinstance(info, dict) or info.get("dtype") not in dtype_sizes:
            dtype = info.get("dtype") if isinstance(info, dict) else info
            raise BadInput(f"{where} has dtype {str(dtype)[:20]}, not one of {', '.join(dtype_sizes)}; {redo}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and len(shape) <= 8
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise BadInput(f"{where} has a malformed shape {str(shape)[:60]}; {redo}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise BadInput(f"{where} has malformed data_offsets {str(offsets)[:60]}; {redo}")
        numel = 1
        for d in shape:
            numel *= d
        want = numel * dtype_sizes[info["dtype"]]
        if offsets[1] - offsets[0] != want:
            raise BadInput(f"{where} spans {offsets[1] - offsets[0]} bytes, its shape {shape} and dtype "
                           f"{info['dtype']} need {want}; {redo}")
        if base + offsets[1] > size:
            raise BadInput(f"{where} ends at byte {base + offsets[1]}, past the end of the file ({size} bytes): the "
                           f"{noun} is truncated; {redo}")
        if align and not name.startswith("__") and (base + offsets[0]) % align:
            raise BadInput(f"{where} does not start on a {align}-byte boundary of the file; {redo}")
        out.append(ShardTensor(name, path, info["dtype"], tuple(shape), base + offsets[0], base + offsets[1]))
    if disjoint:
        spans = sorted((t.start, t.stop, t.name) for t in out if t.stop > t.start)
        for (_, stop, a), (start, _, b) in zip(spans, spans[1:]):
            if start < stop:
                raise BadInput(f"{path}: tensors {a!r} and {b!r} overlap in the file; {redo}")
    return out, base, size
