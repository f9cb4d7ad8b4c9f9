"""`read_safetensors_header`: the one reader of safetensors headers without the safetensors library (checkpoint
shards and a program's weights file), against the library itself on good files and on forged ones."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from toolchain.errors import BadInput
from toolchain.models.shards import _ITEMSIZE, read_safetensors_header

KW = dict(dtype_sizes=_ITEMSIZE, noun="shard", redo="download the checkpoint again")


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(3, 5, generator=g), "b.bias": torch.randn(7, generator=g).to(torch.bfloat16),
            "c": torch.arange(6, dtype=torch.int64).reshape(2, 3), "empty": torch.zeros(0, 4)}


def _forge(path, edit):
    """Rewrite the file's header after `edit(header)`, keeping the data bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + raw[8 + n:])


def test_entries_match_the_safetensors_library(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), str(path), metadata={"format": "pt"})
    entries, base, size = read_safetensors_header(path, **KW)
    assert size == path.stat().st_size and base == 8 + int.from_bytes(path.read_bytes()[:8], "little")
    raw = path.read_bytes()
    with safe_open(str(path), framework="pt") as f:
        assert sorted(t.name for t in entries) == sorted(f.keys())
        for t in entries:
            ref = f.get_tensor(t.name)
            assert t.shape == tuple(ref.shape)
            assert t.dtype == {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}[ref.dtype]
            got = torch.frombuffer(bytearray(raw[t.start:t.stop]), dtype=ref.dtype) if t.stop > t.start else \
                torch.empty(0, dtype=ref.dtype)
            assert torch.equal(got.reshape(ref.shape), ref)


def _set(key, field, value):
    def edit(h):
        h[key][field] = value
    return edit


FORGED = {
    "dtype": (_set("a.weight", "dtype", "F99"), r"tensor 'a.weight' in \S+ has dtype F99, not one of F64"),
    "shape not ints": (_set("a.weight", "shape", [3, "5"]), r"'a.weight' .* malformed shape"),
    "shape 9-d": (_set("c", "shape", [1] * 7 + [2, 3]), r"'c' .* malformed shape"),
    "negative dim": (_set("c", "shape", [-2, -3]), r"'c' .* malformed shape"),
    "bool offsets": (_set("c", "data_offsets", [True, 8]), r"'c' .* malformed data_offsets"),
    "reversed offsets": (_set("c", "data_offsets", [48, 0]), r"'c' .* malformed data_offsets"),
    "span": (_set("a.weight", "shape", [3, 6]), r"'a.weight' .* spans 60 bytes, its shape \[3, 6\] and dtype F32 "
                                                r"need 72"),
    "past the end": (lambda h: h["c"].update(data_offsets=[10**6, 10**6 + 48]),
                     r"'c' .* ends at byte \d+, past the end of the file \(\d+ bytes\): the shard is truncated"),
    "entry not an object": (lambda h: (h.clear(), h.update(x=1)), r"'x' .* has dtype 1"),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_entry_is_one_error_naming_the_tensor(tmp_path, case):
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), str(path))
    edit, pattern = FORGED[case]
    _forge(path, edit)
    with pytest.raises(BadInput, match=pattern) as e:
        read_safetensors_header(path, **KW)
    assert str(e.value).endswith("; download the checkpoint again")


@pytest.mark.parametrize("raw", [b"", b"\x05\x00", b"\xff" * 8 + b"{}", b"\x04" + b"\x00" * 7 + b"[1]x",
                                 b"\x03" + b"\x00" * 7 + b"{x}"], ids=["empty", "short", "huge length", "array", "bad json"])
def test_an_unreadable_file_is_one_error(tmp_path, raw):
    path = tmp_path / "w.safetensors"
    path.write_bytes(raw)
    with pytest.raises(BadInput, match=rf"{path} is not a readable safetensors weights file \(.*\); re-export"):
        read_safetensors_header(path, dtype_sizes=_ITEMSIZE, noun="weights file", redo="re-export the program")


def test_alignment_and_overlap_are_checked_only_when_asked(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(3), "b": torch.zeros(3)}, str(path))   # the library aligns to 8 bytes, not 64
    read_safetensors_header(path, **KW)
    with pytest.raises(BadInput, match=r"tensor '[ab]' in \S+ does not start on a 64-byte boundary"):
        read_safetensors_header(path, **KW, align=64)
    _forge(path, _set("b", "data_offsets", [4, 16]))                    # b's bytes overlap a's
    read_safetensors_header(path, **KW)
    with pytest.raises(BadInput, match=r"tensors 'a' and 'b' overlap in the file"):
        read_safetensors_header(path, **KW, disjoint=True)
