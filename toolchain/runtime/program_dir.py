"""Reading an exported program directory: manifest, checksums, and the state <-> adapter mapping.
Everything an app does with the manifest, done once for the host runners."""

from __future__ import annotations

from pathlib import Path

import torch

from toolchain.errors import BadInput
from toolchain.export.build import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION, sha256_file
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
        raw = read_json(self.path / MANIFEST_NAME)
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version != MANIFEST_SCHEMA_VERSION:
            raise BadInput(f"{self.path} was exported with manifest schema_version {version}; this toolchain runs "
                           f"version {MANIFEST_SCHEMA_VERSION}: re-export the program")
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

    def method(self, name: str) -> dict:
        for m in self.manifest["methods"]:
            if m["name"] == name:
                return m
        raise BadInput(f"{self.path}: no method {name!r} in the manifest")

    def state_init(self) -> torch.Tensor:
        """The initial flat state (state.init_file, raw little-endian float32)."""
        import numpy as np

        f = self.path / self.manifest["state"]["init_file"]
        values = np.fromfile(f, dtype="<f4")
        if values.size != self.state_numel:
            raise BadInput(f"{f} holds {values.size} values, the manifest says {self.state_numel}; re-export the program")
        return torch.from_numpy(values.astype(np.float32))

    def state_views(self, state: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each state entry as a view of the flat state (entry order)."""
        return {e["name"]: state[e["offset"]:e["offset"] + _numel(e["shape"])].view(e["shape"])
                for e in self.manifest["state"]["entries"]}

    def call_train_method(self, execute, method: str, input_ids: torch.Tensor, labels: torch.Tensor, lr: float,
                          state: torch.Tensor) -> float:
        """One step as an app makes it: inputs (ids, labels, lr, every state slice), then each output after
        the loss copied into its state slice. `execute(method, inputs) -> outputs` is the runtime."""
        views = self.state_views(state)
        inputs = [input_ids, labels, torch.tensor([lr], dtype=torch.float32), *views.values()]
        outputs = execute(method, inputs)
        spec = self.method(method)["outputs"]
        if len(outputs) != len(spec):
            raise BadInput(f"{method} returned {len(outputs)} outputs, the manifest lists {len(spec)}; re-export the program")
        for io, value in zip(spec[1:], outputs[1:]):
            target = views[io["name"]]
            if value.numel() != target.numel():
                raise BadInput(f"{method} returned {value.numel()} values for {io['name']}, the manifest says "
                               f"{list(target.shape)}; re-export the program")
            target.copy_(value.reshape(target.shape))
        return float(outputs[0].reshape(-1)[0])

    def lora_from_state(self, state: torch.Tensor) -> LoraWeights:
        """The adapter tensors (role 'param') sliced out of a flat state vector."""
        sd = {e["key"]: state[e["offset"]:e["offset"] + _numel(e["shape"])].reshape(e["shape"]).clone()
              for e in self.manifest["state"]["entries"] if e["role"] == "param"}
        return lora_from_state_dict(self.arch, self.lora_config, sd)


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
