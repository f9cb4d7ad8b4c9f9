"""Reading an exported program directory: `ProgramDir`, the one typed view of a program the host has (the
contract's manifest checked against the program's config, checksums, the memory-mapped weights, the
state <-> adapter mapping). Everything an app does with the manifest, done once for the host runtimes.
Its writers are manifest.py (`build_manifest`) and weights_file.py, which export/build.py drives."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from toolchain.contract import (LAYER, MANIFEST_NAME, GenerateSection, LcsbSection, Manifest, MemoryPlan, MethodSpec,
                                ModelSection, ProgramEntry, StateEntry, TokenizerSection, inside, manifest_path,
                                read_program_manifest, sha256_file)
from toolchain.errors import BadInput
from toolchain.lcsb.plan import StepPlan
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import lora_from_state_dict
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepOptions
from toolchain.models.presets import ModelArch
from toolchain.optim import OptimizerConfig
from toolchain.program.spec import ProgramSpec, QuantSpec, method_specs, state_layout
from toolchain.program.weights_file import map_weights

__all__ = ["ProgramDir"]


class ProgramDir:
    """An exported program directory, checked against its manifest's checksums: the one door to a program
    (its config, methods, state layout, manifest sections, files).

    Attributes:
        path: the directory.
        arch, lora_config, optimizer: the model, LoRA and optimizer configs the manifest describes.
        spec: the `ProgramSpec` the host runtimes rebuild the methods from.
        seq_len, methods, state_entries, state_numel: as the manifest lists them (methods checked against
            `method_specs(spec)`, the state layout against `state_layout`).
        model, tokenizer, pad_token_id, generate, memory_plan, lcsb, files, moves_unselected, step_entry,
            default_lr, targets, programs: the manifest's sections and fields, typed (toolchain/contract).
        weights_file, weights_bytes, state_init_file: the weights file (`weights()` maps it) and its size, the
            initial state's file (`state_init()` reads it).
    """

    def __init__(self, path: Path, *, verify: bool = True) -> None:
        self.path = Path(path)
        manifest_path(self.path)
        try:
            m = read_program_manifest(self.path)
            self.arch = ModelArch.from_dict(m.model.arch)
            self.lora_config = LoraConfig(rank=m.lora.rank, alpha=m.lora.alpha, targets=m.lora.targets,
                                          use_rslora=bool(m.lora.use_rslora))
            o = m.optimizer
            self.optimizer = OptimizerConfig(o.kind, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                             frozen_unselected=o.frozen_unselected)
            q, gen = m.quant, m.generate
            chunk = {} if gen is None or gen.prefill_chunk is None else {"prefill_chunk": gen.prefill_chunk}
            self.spec = ProgramSpec(self.arch, self.lora_config, m.seq_len,
                                    quant=QuantSpec(q.kind, q.group, q.chunk_elems, head=bool(q.head)),
                                    optimizer=self.optimizer, options=StepOptions(**m.options.to_json()),
                                    generation=gen is not None, compute=m.compute,
                                    xnnpack_generation=gen is not None and gen.xnnpack is not None,
                                    preference="block_backward_pair" in m.methods, **chunk)
            expected = method_specs(self.spec)
        except (KeyError, TypeError, ValueError, AttributeError) as e:   # schema-valid, but not a usable config
            raise BadInput(f"{self.path / MANIFEST_NAME} describes an impossible program ({type(e).__name__}: {e}); "
                           f"re-export the program") from None
        if {n: s.to_json() for n, s in expected.items()} != {n: s.to_json() for n, s in m.methods.items()}:
            raise BadInput(f"{self.path / MANIFEST_NAME}: the methods listed do not match this toolchain's for "
                           f"the program's config; re-export the program")
        self.seq_len: int = m.seq_len
        self.methods: dict[str, MethodSpec] = m.methods
        self.state_entries: list[StateEntry] = list(m.state.entries)
        self.state_numel: int = m.state.numel
        # the manifest's sections the host reads, typed (toolchain/contract/manifest.py), read once
        self.model: ModelSection = m.model                    # where the weights came from; the arch as recorded
        self.tokenizer: TokenizerSection = m.tokenizer
        self.pad_token_id: int = m.tokenizer.pad_token_id
        self.generate: GenerateSection | None = m.generate     # None: a training-only program
        self.memory_plan: MemoryPlan = m.memory_plan
        self.lcsb: LcsbSection | None = m.lcsb                 # the LCSB plan recorded at export (`default_plan()`)
        self.files: dict[str, str] = m.files                   # every file (relative path) with its sha256
        self.moves_unselected: bool = m.loop.moves_unselected
        self.step_entry: str | None = m.state.step_entry
        # the run defaults (`defaults`, toolchain/export/app_defaults.py); older programs: optimizer.default_lr, no steps
        self.default_lr = float(m.defaults.lr if m.defaults is not None else m.optimizer.default_lr)
        self.default_steps: int | None = None if m.defaults is None else m.defaults.steps
        self.targets: list[str] = m.targets
        self.programs: dict[str, ProgramEntry] = {}            # target -> its `programs` entry (`program(target)`)
        for entry in m.programs:
            self.programs.setdefault(entry.target, entry)
        self.weights_file = self.path / m.weights.file
        self.weights_bytes: int = m.weights.bytes              # checked against the file when it exists
        self.state_init_file = self.path / m.state.init_file   # the initial flat state (raw little-endian float32)
        self._cross_check(m)
        if verify:
            self._verify()
        self._weights: dict[str, torch.Tensor] | None = None

    def probe_rows(self) -> list | None:
        """The evaluation gate's forgetting probe (`probe.jsonl`, listed in `files`: `text/probe.py`) as data rows;
        None: a program exported before probes, or without a tokenizer."""
        from toolchain.contract import PROBE_NAME
        from toolchain.text.dataset import load_examples

        if PROBE_NAME not in self.files:
            return None
        return load_examples(self.path / PROBE_NAME, self.arch)

    def program(self, target: str) -> ProgramEntry:
        """The `programs` entry of `target` (BadInput: not exported for it)."""
        entry = self.programs.get(target)
        if entry is None:
            raise BadInput(f"this program has no {target} export (it has {', '.join(self.targets) or 'none'}); "
                           f"export it with --target {target}")
        return entry

    def _cross_check(self, m: Manifest) -> None:
        """Manifest fields the checksums do not cover (the manifest is not checksummed): what they say must
        agree with each other and with the model/LoRA/optimizer config (paths and ranges: the contract's
        `read_program_manifest` checked them)."""
        where = f"{self.path / MANIFEST_NAME}"
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
        arch = self.arch
        expected = state_layout(arch, self.lora_config, self.optimizer)
        got = self.state_entries
        if [(e.name, e.key, e.role, e.shape, e.offset, e.layer) for e in expected] != \
                [(e.name, e.key, e.role, e.shape, e.offset, e.layer) for e in got] \
                or self.state_numel != sum(e.numel for e in expected):
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
        for rel, digest in self.files.items():
            f = self.path / rel
            if not os.path.lexists(f):       # a FIFO or a link loop: refused by sha256_file (toolchain.inputs)
                raise BadInput(f"{self.path}: {rel} is missing (listed in the manifest); re-export the program")
            if sha256_file(f) != digest:
                raise BadInput(f"{self.path}: {rel} does not match its checksum in the manifest; re-export the program")

    def program_file(self, target: str) -> Path:
        return self.path / self.program(target).file

    def default_plan(self) -> StepPlan | None:
        """The LCSB plan recorded at export (None: full backprop)."""
        lcsb = self.lcsb
        if lcsb is None:
            return None
        return StepPlan(layers=self.arch.layers, policy=lcsb.policy, k=lcsb.k, phases=lcsb.phases,
                        schedule=lcsb.schedule, seed=lcsb.seed, warmup=lcsb.warmup or 0)

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
        for method in self.methods.values():
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

        f = self.state_init_file
        values = np.fromfile(f, dtype="<f4")
        if values.size != self.state_numel:
            raise BadInput(f"{f} holds {values.size} values, the manifest says {self.state_numel}; re-export the program")
        if not np.isfinite(values).all():
            raise BadInput(f"{f} holds {int((~np.isfinite(values)).sum())} non-finite values (NaN or infinity); "
                           f"re-export the program")
        return torch.from_numpy(values.astype(np.float32))

    def state_views(self, state: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each state entry as a view of the flat state (entry order)."""
        return {e.name: state[e.offset:e.offset + e.numel].view(e.shape) for e in self.state_entries}

    def lora_from_state(self, state: torch.Tensor) -> LoraWeights:
        """The adapter tensors (role 'param') sliced out of a flat state vector."""
        sd = {e.key: state[e.offset:e.offset + e.numel].reshape(e.shape).clone()
              for e in self.state_entries if e.role == "param"}
        return lora_from_state_dict(self.arch, self.lora_config, sd)
