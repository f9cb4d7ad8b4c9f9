"""Export pipeline, written down once:

1. resolve the model (preset/checkpoint, random or real weights) and the starting adapter;
2. build the `StepProgram` (explicit MeSP step + in-program optimizer, quantized frozen weights);
3. per target, export every method (one per LCSB phase) and lower it;
4. write the initial state (`state_init.bin`), the initial adapter (PEFT), `manifest.json`
   (schema-validated, with checksums) — all into a temporary directory renamed into place only when
   everything succeeded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from toolchain import __version__
from toolchain.atomic import atomic_dir
from toolchain.errors import BadInput
from toolchain.export.artifact import TargetArtifact, tree_bytes
from toolchain.export.executorch import PTE_NAME
from toolchain.export.program import OptimizerSpec, QuantSpec, StepProgram, flat_state, method_name
from toolchain.lcsb.plan import StepPlan
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import peft_config_dict, save_adapter
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepOptions
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import ModelWeights
from toolchain.schemas import write_json

__all__ = ["ExportSpec", "export_program", "sha256_file", "MANIFEST_NAME", "PTE_NAME", "ADAPTER_INIT_DIR", "TARGETS",
           "STATE_INIT_NAME", "MANIFEST_SCHEMA_VERSION"]

MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA_VERSION = 2  # 2: functional state (inputs/outputs); 1 had mutable buffers + get/set_state
ADAPTER_INIT_DIR = "adapter_init"
STATE_INIT_NAME = "state_init.bin"  # the initial flat state, raw little-endian float32
TARGETS = ("executorch", "onnx", "coreml")


@dataclass(frozen=True)
class ExportSpec:
    """What to export, besides the model and adapter tensors.

    Args:
        source / init / seed: how the model was resolved (recorded in the manifest).
        seq_len: T, the static sequence length of every train method.
        quant: frozen projection weights' format.
        optimizer: the in-program optimizer.
        plan: LCSB plan (one method per phase); None for full backprop.
        targets: runtimes to export for.
        xnnpack: delegate attention matmuls to XNNPACK (ExecuTorch); frozen-weight matmuls never are.
        default_lr: learning rate recorded for apps that do not choose one.
        options: step memory knobs (loss/MLP chunking).
        pad_token_id / tokenizer_kind: what apps pad rows with.
    """

    source: str
    init: Literal["pretrained", "random"]
    seed: int
    seq_len: int
    quant: QuantSpec = QuantSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    plan: StepPlan | None = None
    targets: tuple[str, ...] = ("executorch",)
    xnnpack: bool = False
    default_lr: float = 1e-4
    options: StepOptions = StepOptions()
    tokenizer_kind: Literal["byte", "huggingface", "none"] = "none"
    pad_token_id: int = 0

    def check(self, arch: Qwen25Arch) -> None:
        if self.seq_len < 2 or self.seq_len > arch.max_positions:
            raise BadInput(f"--seq-len must be in 2..{arch.max_positions} for this model, got {self.seq_len}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            raise BadInput(f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
        if self.plan is not None:
            self.plan.check_layers(arch.layers, where="LCSB plan")
        if not 0 <= self.pad_token_id < arch.vocab:
            raise BadInput(f"pad token id {self.pad_token_id} is outside the vocabulary of {arch.vocab}")
        self.quant.check(arch)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _methods(spec: ExportSpec, arch: Qwen25Arch, program: StepProgram) -> list[dict]:
    t = spec.seq_len
    state_io = [{"name": e.name, "dtype": "float32", "shape": list(e.shape)} for e in program.layout]
    phases = [None] if spec.plan is None else list(range(len(spec.plan.phases)))
    methods = []
    for k in phases:
        layers = tuple(range(arch.layers)) if k is None else tuple(spec.plan.phases[k])
        updated = {e.name for e in program.updated_entries(None if k is None else layers)}
        methods.append({
            "name": method_name(k), "kind": "train_step", "phase": k, "backward_layers": list(layers),
            "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [t]},
                       {"name": "labels", "dtype": "int64", "shape": [t], "description": "-100 = no target"},
                       {"name": "lr", "dtype": "float32", "shape": [1]}] + state_io,
            "outputs": [{"name": "loss", "dtype": "float32", "shape": [1]}]
                       + [io for io in state_io if io["name"] in updated],
        })
    return methods


def _program_entry(root: Path, a: TargetArtifact) -> dict:
    entry = {"target": a.target, "file": a.file, "delegate": a.delegate, "bytes": tree_bytes(root / a.file), **a.details}
    if a.methods is not None:
        entry["methods"] = dict(a.methods)
    return entry


def _manifest(spec: ExportSpec, arch: Qwen25Arch, cfg: LoraConfig, program: StepProgram,
              artifacts: list[TargetArtifact], root: Path, files: dict[str, str]) -> dict:
    numel = sum(e.numel for e in program.layout)
    planned = next((a.planned_arena_bytes for a in artifacts if a.planned_arena_bytes), {})
    opt = spec.optimizer
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "toolchain_version": __version__,
        "model": {"source": spec.source, "init": spec.init, "seed": spec.seed, "arch": asdict(arch)},
        "lora": {"rank": cfg.rank, "alpha": cfg.alpha, "scale": cfg.scale, "targets": list(cfg.targets),
                 "use_rslora": cfg.use_rslora},
        "seq_len": spec.seq_len,
        "quant": {"kind": spec.quant.kind, "group": spec.quant.group},
        "optimizer": {"kind": opt.kind, "weight_decay": opt.weight_decay, "betas": list(opt.betas), "eps": opt.eps,
                      "frozen_unselected": opt.frozen_unselected, "default_lr": spec.default_lr},
        "lcsb": None if spec.plan is None else {"policy": spec.plan.policy, "k": spec.plan.k,
                                                 "phases": [list(p) for p in spec.plan.phases],
                                                 "schedule": list(spec.plan.schedule)},
        "programs": [_program_entry(root, a) for a in artifacts],
        "methods": _methods(spec, arch, program),
        "state": {"dtype": "float32", "numel": numel, "init_file": STATE_INIT_NAME,
                  "entries": [{"name": e.name, "key": e.key, "role": e.role, "shape": list(e.shape), "offset": e.offset}
                              for e in program.layout]},
        "memory_plan": {
            "planned_arena_bytes": planned,
            "constant_bytes": program_constant_bytes(program),
            "lora_state_bytes": 4 * numel,
            # The stock Android/iOS `Module` gives every loaded method its own arena: an app with all
            # phase methods loaded holds their sum, plus its state array.
            **({"peak_estimate_bytes": sum(planned.values()) + 4 * numel} if planned else {}),
        },
        "tokenizer": {"kind": spec.tokenizer_kind, "vocab": arch.vocab, "pad_token_id": spec.pad_token_id},
        "adapter": {"init_dir": ADAPTER_INIT_DIR, "config": peft_config_dict(cfg, base_model=spec.source)},
        "files": files,
    }


def program_constant_bytes(program: StepProgram) -> int:
    """Bytes of frozen tensors (serialized once, memory-mapped by the runtime)."""
    return sum(b.numel() * b.element_size() for b in program.buffers())


def export_program(arch: Qwen25Arch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, spec: ExportSpec,
                   out: Path, *, on_stage: Callable[[str], None] | None = None) -> dict:
    """Run the pipeline; returns the manifest written to `out/manifest.json`.

    Raises:
        BadInput: invalid spec for this model (checked before any work).
    """
    spec.check(arch)
    note = on_stage or (lambda _s: None)
    note("build step program")
    program = StepProgram(arch, weights, cfg, optimizer=spec.optimizer, options=spec.options, quant=spec.quant)
    phases = None if spec.plan is None else [tuple(p) for p in spec.plan.phases]
    with atomic_dir(Path(out)) as tmp:
        artifacts = []
        for target in spec.targets:
            artifacts.append(_export_target(target, program, phases, spec, tmp, note))
        note("write adapter + manifest")
        (tmp / STATE_INIT_NAME).write_bytes(flat_state(program.layout, lora).numpy().astype("<f4").tobytes())
        save_adapter(tmp / ADAPTER_INIT_DIR, cfg, lora, base_model=spec.source)
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = _manifest(spec, arch, cfg, program, artifacts, tmp, files)
        write_json(tmp / MANIFEST_NAME, "manifest", manifest)
    return manifest


def _export_target(target: str, program: StepProgram, phases, spec: ExportSpec, out_dir: Path, note) -> TargetArtifact:
    """Dispatch to the target's adapter (imported lazily: each pulls in its own heavy library)."""
    if target == "executorch":
        from toolchain.export.executorch import export_executorch

        return export_executorch(program, phases, spec.seq_len, out_dir, xnnpack=spec.xnnpack, on_stage=note)
    if target == "onnx":
        from toolchain.export.onnx import export_onnx

        return export_onnx(program, phases, spec.seq_len, out_dir, on_stage=note)
    if target == "coreml":
        from toolchain.export.coreml import export_coreml

        return export_coreml(program, phases, spec.seq_len, out_dir, quant=spec.quant, on_stage=note)
    raise BadInput(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
