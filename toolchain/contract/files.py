"""The names of a program directory's files, and the checksum that lists them in the manifest's `files`.

A program directory (what `toolchain export` writes, what the apps and the host runtimes read):

  manifest.json          the typed contract (contract/manifest.py; shared_schemas/manifest.schema.json)
  weights.safetensors    the frozen weights, shared by every target (program/weights_file.py)
  state_init.bin         the initial flat state, raw little-endian float32 (contract/state.py)
  adapter_init/          the initial adapter, PEFT format
  tokenizer.json         the tokenizer, when the program ships one
  model.pte, ...         one program file (or directory) per target (the manifest's `programs`)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["MANIFEST_NAME", "MANIFEST_SCHEMA_VERSION", "WEIGHTS_NAME", "STATE_INIT_NAME", "ADAPTER_INIT_DIR",
           "TOKENIZER_NAME", "PROBE_NAME", "INT4_PACKING", "LAYER", "sha256_file"]

MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA_VERSION = 3  # 3: layer-generic methods, weights as inputs; 2: whole-step methods, weights inside
WEIGHTS_NAME = "weights.safetensors"
STATE_INIT_NAME = "state_init.bin"  # the initial flat state, raw little-endian float32
ADAPTER_INIT_DIR = "adapter_init"
TOKENIZER_NAME = "tokenizer.json"  # in a program directory and in a Hugging Face model directory
# The evaluation gate's forgetting probe: data rows (data_row.schema.json) of toolchain/assets/probe.txt in the program's
# tokenizer, cut to its seq_len; listed (checksummed) in the manifest's `files`. Programs exported before it have none.
PROBE_NAME = "probe.jsonl"
# The int4 byte layout of weights.safetensors (mesp/ops/quant.py): column 2j in the high nibble of byte j.
INT4_PACKING = "interleaved"
LAYER = "{layer}"  # placeholder in the manifest's per-layer names, replaced by the layer index


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (the digests of the manifest's `files`)."""
    from toolchain.inputs import open_input

    h = hashlib.sha256()
    with open_input(Path(path)) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
