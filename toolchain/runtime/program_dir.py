"""Reading an exported program directory: manifest, checksums, and the state <-> adapter mapping.
Everything an app does with the manifest, done once for the host runners."""

from __future__ import annotations

from pathlib import Path

import torch

from toolchain.errors import BadInput
from toolchain.export.build import MANIFEST_NAME, sha256_file
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import lora_from_state_dict
from toolchain.lora.weights import LoraWeights
from toolchain.models.presets import Qwen25Arch
from toolchain.schemas import read_json

__all__ = ["ProgramDir", "MANIFEST_NAME"]


class ProgramDir:
    """An exported program directory, checked against its manifest's checksums."""

    def __init__(self, path: Path, *, verify: bool = True) -> None:
        self.path = Path(path)
        if not (self.path / MANIFEST_NAME).is_file():
            raise BadInput(f"{self.path} is not an exported program (no {MANIFEST_NAME}); run `toolchain export` first")
        self.manifest = read_json(self.path / MANIFEST_NAME, "manifest")
        if verify:
            self._verify()
        m = self.manifest
        self.arch = Qwen25Arch(**m["model"]["arch"])
        self.lora_config = LoraConfig(rank=m["lora"]["rank"], alpha=m["lora"]["alpha"], targets=tuple(m["lora"]["targets"]),
                                      use_rslora=m["lora"].get("use_rslora", False))
        self.seq_len: int = m["seq_len"]
        self.state_numel: int = m["state"]["numel"]

    def _verify(self) -> None:
        for rel, digest in self.manifest["files"].items():
            f = self.path / rel
            if not f.is_file():
                raise BadInput(f"{self.path}: {rel} is missing (listed in the manifest); re-export the program")
            if sha256_file(f) != digest:
                raise BadInput(f"{self.path}: {rel} does not match its checksum in the manifest; re-export the program")

    def program_file(self, target: str) -> Path:
        for p in self.manifest["programs"]:
            if p["target"] == target:
                return self.path / p["file"]
        raise BadInput(f"{self.path} has no {target} program; export it with --target {target}")

    @property
    def targets(self) -> list[str]:
        return [p["target"] for p in self.manifest["programs"]]

    def method_for_step(self, step: int) -> tuple[str, int | None]:
        """(method name, LCSB phase) of 0-based training step `step`."""
        lcsb = self.manifest["lcsb"]
        if lcsb is None:
            return "train_step", None
        phase = lcsb["schedule"][step % len(lcsb["schedule"])]
        return f"train_step_p{phase}", phase

    def train_methods(self) -> list[str]:
        return [m["name"] for m in self.manifest["methods"] if m["kind"] == "train_step"]

    def lora_from_state(self, state: torch.Tensor) -> LoraWeights:
        """The adapter tensors (role 'param') sliced out of a flat state vector."""
        sd = {}
        for e in self.manifest["state"]["entries"]:
            if e["role"] == "param":
                n = 1
                for s in e["shape"]:
                    n *= s
                sd[e["key"]] = state[e["offset"]:e["offset"] + n].reshape(e["shape"]).clone()
        return lora_from_state_dict(self.arch, self.lora_config, sd)
