"""Inputs as a class (toolchain/inputs.py) and a checkpoint that changes while it is read (models/shards.py)."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
import torch
from safetensors.torch import save_file

from toolchain.errors import BadInput
from toolchain.inputs import check_input, open_input, read_input
from toolchain.models import get_preset, random_weights
from toolchain.models.load import checkpoint_source, state_dict_from_weights
from toolchain.models.source import materialize


@pytest.fixture
def specials(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling").symlink_to("nothing")
    (tmp_path / "to-fifo").symlink_to("fifo")
    yield tmp_path
    sock.close()


@pytest.mark.parametrize(("name", "words"), [
    ("fifo", "is a FIFO"), ("sock", "is a socket"), ("loop", "symbolic link loop"),
    ("dangling", "a symbolic link to a missing file"), ("to-fifo", "is a FIFO"), ("/dev/null", "character device"),
])
@pytest.mark.parametrize("reader", [check_input, open_input, read_input], ids=["check", "open", "read"])
def test_special_inputs_are_refused_at_once(specials, name, words, reader):
    result: list = []
    path = name if name.startswith("/") else specials / name

    def run():
        try:
            reader(path)
            result.append(None)
        except BadInput as e:
            result.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{reader.__name__}({name}) blocked"
    assert result and result[0] is not None and words in str(result[0]), result


def test_a_regular_file_reads_through_a_link(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "l").symlink_to("f")
    assert read_input(tmp_path / "l") == b"abc"
    with open_input(tmp_path / "f") as f:
        assert os.get_blocking(f.fileno())        # O_NONBLOCK cleared after the check
        assert f.read() == b"abc"


def _checkpoint(path):
    arch = get_preset("tiny")
    path.mkdir()
    save_file({k: v.contiguous() for k, v in state_dict_from_weights(random_weights(arch)).items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(arch.to_hf_config().to_dict()))
    return path / "model.safetensors"


def _other_values(shard):
    raw = bytearray(shard.read_bytes())
    raw[-64:] = bytes(64)
    return bytes(raw)


def test_a_shard_replaced_after_the_last_read_is_caught_by_the_final_check(tmp_path):
    shard = _checkpoint(tmp_path / "ck")
    _, source = checkpoint_source(tmp_path / "ck")
    source.tensor("embed")
    other = tmp_path / "other"
    other.write_bytes(_other_values(shard))
    os.replace(other, shard)
    with pytest.raises(BadInput, match="changed while it was being read"):
        source.check_unchanged()


def test_a_shard_rewritten_in_place_is_caught_at_the_next_read(tmp_path):
    shard = _checkpoint(tmp_path / "ck")
    _, source = checkpoint_source(tmp_path / "ck")
    source.tensor("embed")
    data = _other_values(shard)
    with open(shard, "r+b") as f:
        f.write(data)
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(BadInput, match="changed while it was being read"):
        source.tensor("final_norm")
    with pytest.raises(BadInput, match="changed"):
        materialize(source)


def test_what_cannot_be_seen_a_rewrite_that_restores_size_and_mtime(tmp_path):
    """docs/reliability.md: a rewrite in place keeping the size and setting the mtime back is not detected."""
    shard = _checkpoint(tmp_path / "ck")
    _, source = checkpoint_source(tmp_path / "ck")
    before = source.tensor("embed").clone()
    st = os.stat(shard)
    data = bytearray(shard.read_bytes())
    t = source.shards.tensors["model.embed_tokens.weight"]
    data[t.start:t.start + 4] = torch.tensor([7.0]).numpy().tobytes()
    with open(shard, "r+b") as f:
        f.write(data)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    source.check_unchanged()                                  # not seen
    assert source.tensor("embed")[0, 0] == 7.0 != before[0, 0]
