"""Reading an exported v3 program directory: the typed manifest (toolchain/contract) checked against the
program's config, checksums, the memory-mapped weights, the state <-> adapter mapping. Everything an app
does with the manifest, done once for the host runners."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from toolchain.contract import LAYER, MANIFEST_NAME, Manifest, StateEntry, inside, manifest_path, sha256_file
from toolchain.errors import BadInput
from toolchain.export.manifest import ProgramManifest
from toolchain.export.program import state_layout
from toolchain.export.weights_file import map_weights
from toolchain.lcsb.plan import StepPlan
from toolchain.lora.peft_io import lora_from_state_dict
from toolchain.lora.weights import LoraWeights

__all__ = ["ProgramDir"]


class ProgramDir:
    """An exported program directory, checked against its manifest's checksums."""

    def __init__(self, path: Path, *, verify: bool = True) -> None:
        self.path = Path(path)
        manifest_path(self.path)
        try:
            self.info = ProgramManifest.read(self.path)
        except (KeyError, TypeError, ValueError, AttributeError) as e:   # schema-valid, but not a usable config
            raise BadInput(f"{self.path / MANIFEST_NAME} describes an impossible program ({type(e).__name__}: {e}); "
                           f"re-export the program") from None
        self.manifest: Manifest = self.info.manifest
        self._cross_check()
        if verify:
            self._verify()
        self.arch = self.info.arch
        self.lora_config = self.info.lora
        self.seq_len: int = self.info.seq_len
        self.state_numel: int = self.info.state_numel
        self._weights: dict[str, torch.Tensor] | None = None

    def _cross_check(self) -> None:
        """Manifest fields the checksums do not cover (the manifest is not checksummed): what they say must
        agree with each other and with the model/LoRA/optimizer config (paths and ranges: the contract's
        `read_program_manifest` checked them)."""
        m, where = self.manifest, f"{self.path / MANIFEST_NAME}"
        files = m.files

        def listed(rel: str, what: str) -> None:
            f = inside(self.path, rel, what)
            covered = rel in files or (f.is_dir() and any(k.startswith(rel.rstrip("/") + "/") for k in files))
            if not covered:
                raise BadInput(f"{where}: the {what} {rel!r} has no checksum in 'files'; re-export the program")

        listed(m.weights.file, "weights file")
        listed(m.state.init_file, "state init file")
        for p in m.programs:
            listed(p.file, f"{p.target} program")
        arch = self.info.arch
        expected = state_layout(arch, self.info.lora, self.info.optimizer)
        got = self.info.state_entries
        if [(e.name, e.key, e.role, e.shape, e.offset, e.layer) for e in expected] != \
                [(e.name, e.key, e.role, e.shape, e.offset, e.layer) for e in got] \
                or self.info.state_numel != sum(e.numel for e in expected):
            raise BadInput(f"{where}: the state layout (entries, offsets, numel) does not match the program's LoRA and "
                           f"optimizer config; re-export the program")
        if m.loop.layers != arch.layers:
            raise BadInput(f"{where}: loop.layers {m.loop.layers} is not the model's {arch.layers} layers; "
                           f"re-export the program")
        weights = self.path / m.weights.file
        if weights.is_file() and weights.stat().st_size != m.weights.bytes:
            raise BadInput(f"{where}: weights.bytes {m.weights.bytes} is not the size of {weights.name} "
                           f"({weights.stat().st_size}); re-export the program")

    def _verify(self) -> None:
        for rel, digest in self.manifest.files.items():
            f = self.path / rel
            if not os.path.lexists(f):       # a FIFO or a link loop: refused by sha256_file (toolchain.inputs)
                raise BadInput(f"{self.path}: {rel} is missing (listed in the manifest); re-export the program")
            if sha256_file(f) != digest:
                raise BadInput(f"{self.path}: {rel} does not match its checksum in the manifest; re-export the program")

    def program_file(self, target: str) -> Path:
        return self.path / self.info.program(target).file

    @property
    def targets(self) -> list[str]:
        return self.info.targets

    def default_plan(self) -> StepPlan | None:
        """The LCSB plan recorded at export (None: full backprop)."""
        lcsb = self.manifest.lcsb
        if lcsb is None:
            return None
        return StepPlan(layers=self.arch.layers, policy=lcsb.policy, k=lcsb.k, phases=lcsb.phases,
                        schedule=lcsb.schedule, seed=lcsb.seed, warmup=lcsb.warmup or 0)

    @property
    def weights_file(self) -> Path:
        return self.path / self.manifest.weights.file

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights file, memory-mapped once (read-only views, no copy), after its header was checked
        against the file (`read_header`) and against every weight the manifest's methods bind (key and
        dtype, every layer). `weights_changed()` then tells whether the file changed since."""
        if self._weights is None:
            import os

            f = self.weights_file
            self._weights_stat = os.stat(f)
            weights = map_weights(f)
            self._check_bound_weights(weights)
            self._weights = weights
        return self._weights

    def _check_bound_weights(self, weights: dict[str, torch.Tensor]) -> None:
        for method in self.info.methods.values():
            for io in method.inputs:
                if io.bind != "weight":
                    continue
                refs = [io.ref.replace(LAYER, str(i)) for i in range(self.arch.layers)] if LAYER in io.ref else [io.ref]
                for ref in refs:
                    t = weights.get(ref)
                    if t is None:
                        raise BadInput(f"{self.weights_file} lacks the tensor {ref!r} that method {method.name} reads; "
                                       f"re-export the program")
                    if str(t.dtype).removeprefix("torch.") != io.dtype:
                        raise BadInput(f"{self.weights_file}: tensor {ref!r} is {str(t.dtype).removeprefix('torch.')}, "
                                       f"method {method.name} reads {io.dtype}; re-export the program")

    def weights_changed(self) -> str | None:
        """Why the mapped weights file is no longer the one mapped (None: unchanged, or not mapped yet): a
        smaller size (reading a page past the new end is a SIGBUS), another file in its place, or a newer
        modification time."""
        import os

        old = getattr(self, "_weights_stat", None)
        if old is None:
            return None
        f = self.weights_file
        try:
            new = os.stat(f)
        except OSError as e:
            return f"{f} is gone ({e.strerror})"
        if (new.st_dev, new.st_ino) != (old.st_dev, old.st_ino):
            return f"{f} was replaced by another file"
        if new.st_size != old.st_size:
            return f"{f} changed size from {old.st_size} to {new.st_size} bytes"
        if new.st_mtime_ns != old.st_mtime_ns:
            return f"{f} was modified"
        return None

    def state_init(self) -> torch.Tensor:
        """The initial flat state (state.init_file, raw little-endian float32)."""
        import numpy as np

        f = self.path / self.manifest.state.init_file
        values = np.fromfile(f, dtype="<f4")
        if values.size != self.state_numel:
            raise BadInput(f"{f} holds {values.size} values, the manifest says {self.state_numel}; re-export the program")
        if not np.isfinite(values).all():
            raise BadInput(f"{f} holds {int((~np.isfinite(values)).sum())} non-finite values (NaN or infinity); "
                           f"re-export the program")
        return torch.from_numpy(values.astype(np.float32))

    @property
    def state_entries(self) -> list[StateEntry]:
        return self.info.state_entries

    def state_views(self, state: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each state entry as a view of the flat state (entry order)."""
        return {e.name: state[e.offset:e.offset + e.numel].view(e.shape) for e in self.state_entries}

    def lora_from_state(self, state: torch.Tensor) -> LoraWeights:
        """The adapter tensors (role 'param') sliced out of a flat state vector."""
        sd = {e.key: state[e.offset:e.offset + e.numel].reshape(e.shape).clone()
              for e in self.state_entries if e.role == "param"}
        return lora_from_state_dict(self.arch, self.lora_config, sd)
