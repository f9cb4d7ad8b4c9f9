"""Read what trainer-core wrote (SessionTest, -Dinterop.dir, for the trace program) with the host's own code: the host runtime's
checkpoint reader and the PEFT adapter loader. Run by android/test.sh with the repository's venv.

Usage: python interop_check.py DIR MANIFEST.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from toolchain.lora.peft_io import load_adapter
from toolchain.models.presets import ModelArch
from toolchain.training.checkpoint import read_checkpoint


def main(d: Path, manifest_path: Path) -> None:
    m = json.loads(manifest_path.read_text())
    expect = torch.arange(m["state"]["numel"], dtype=torch.float32) / 1024
    tensors, meta = read_checkpoint(d / "checkpoint.safetensors")
    state = tensors["state"]
    assert torch.equal(state, expect), "checkpoint state differs from what Kotlin wrote"
    assert meta == {"step": 3, "run_id": "interop", "seq": 9, "losses": [1.5, None]}, meta
    sd = load_file(d / "adapter" / "adapter_model.safetensors")
    params = [e for e in m["state"]["entries"] if e["role"] == "param"]
    assert set(sd) == {e["key"] for e in params}, "adapter keys differ from the manifest's param entries"
    for e in params:
        n = math.prod(e["shape"])
        assert torch.equal(sd[e["key"]], expect[e["offset"]:e["offset"] + n].reshape(e["shape"])), e["key"]
    cfg, _ = load_adapter(d / "adapter", ModelArch.from_dict(m["model"]["arch"]))
    assert cfg.rank == m["lora"]["rank"], (cfg.rank, m["lora"]["rank"])
    print(f"interop: host read the Kotlin checkpoint ({m['state']['numel']} values) and adapter ({len(params)} tensors)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
