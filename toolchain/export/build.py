"""Export pipeline, written down once:

1. resolve the model (preset/checkpoint, random or real weights) and the starting adapter;
2. build the `StepProgram` (explicit MeSP step + in-program optimizer, quantized frozen weights);
3. per target, export every method (one per LCSB phase, get_state, set_state) and lower it;
4. write the initial adapter (PEFT), `manifest.json` (schema-validated, with checksums) — all into a
   temporary directory renamed into place only when everything succeeded.
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
from toolchain.export.program import OptimizerSpec, QuantSpec, StepProgram, method_name
from toolchain.lcsb.plan import StepPlan
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import peft_config_dict, save_adapter
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepOptions
from toolchain.models.presets import Qwen25Arch
from toolchain.models.weights import ModelWeights
from toolchain.schemas import write_json

__all__ = ["ExportSpec", "export_program", "sha256_file", "MANIFEST_NAME", "PTE_NAME", "ADAPTER_INIT_DIR", "TARGETS"]

MANIFEST_NAME = "manifest.json"
PTE_NAME = "model.pte"
ADAPTER_INIT_DIR = "adapter_init"
TARGETS = ("executorch",)


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


def _methods(spec: ExportSpec, arch: Qwen25Arch, state_numel: int) -> list[dict]:
    t = spec.seq_len
    train_io = {"inputs": [{"name": "input_ids", "dtype": "int64", "shape": [t]},
                           {"name": "labels", "dtype": "int64", "shape": [t], "description": "-100 = no target"},
                           {"name": "lr", "dtype": "float32", "shape": [1]}],
                "outputs": [{"name": "loss", "dtype": "float32", "shape": [1]}]}
    phases = [None] if spec.plan is None else list(range(len(spec.plan.phases)))
    methods = []
    for k in phases:
        layers = list(range(arch.layers)) if k is None else list(spec.plan.phases[k])
        methods.append({"name": method_name(k), "kind": "train_step", "phase": k, "backward_layers": layers, **train_io})
    state = {"name": "state", "dtype": "float32", "shape": [state_numel]}
    methods.append({"name": "get_state", "kind": "get_state", "inputs": [], "outputs": [state]})
    methods.append({"name": "set_state", "kind": "set_state", "inputs": [state],
                    "outputs": [{"name": "entries", "dtype": "float32", "shape": [1]}]})
    return methods


def _manifest(spec: ExportSpec, arch: Qwen25Arch, cfg: LoraConfig, program: StepProgram, artifacts: dict,
              files: dict[str, str]) -> dict:
    numel = sum(e.numel for e in program.layout)
    et = artifacts.get("executorch")
    opt = spec.optimizer
    return {
        "schema_version": 1,
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
        "programs": [{"target": "executorch", "file": PTE_NAME, "delegate": "xnnpack" if et.delegated else None,
                      "bytes": et.path.stat().st_size}] if et else [],
        "methods": _methods(spec, arch, numel),
        "state": {"dtype": "float32", "numel": numel,
                  "entries": [{"name": e.name, "key": e.key, "role": e.role, "shape": list(e.shape), "offset": e.offset}
                              for e in program.layout]},
        "memory_plan": {
            "planned_arena_bytes": {k: v["planned_arena_bytes"] for k, v in et.methods.items()} if et else {},
            "constant_bytes": program_constant_bytes(program),
            "lora_state_bytes": 4 * numel,
        },
        "tokenizer": {"kind": spec.tokenizer_kind, "vocab": arch.vocab, "pad_token_id": spec.pad_token_id},
        "adapter": {"init_dir": ADAPTER_INIT_DIR, "config": peft_config_dict(cfg, base_model=spec.source)},
        "files": files,
    }


def program_constant_bytes(program: StepProgram) -> int:
    """Bytes of frozen tensors (serialized once, memory-mapped by the runtime)."""
    state = {e.name for e in program.layout}
    return sum(b.numel() * b.element_size() for n, b in program.named_buffers() if n not in state)


def export_program(arch: Qwen25Arch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights, spec: ExportSpec,
                   out: Path, *, on_stage: Callable[[str], None] | None = None) -> dict:
    """Run the pipeline; returns the manifest written to `out/manifest.json`.

    Raises:
        BadInput: invalid spec for this model (checked before any work).
    """
    spec.check(arch)
    note = on_stage or (lambda _s: None)
    note("build step program")
    program = StepProgram(arch, weights, cfg, lora, optimizer=spec.optimizer, options=spec.options, quant=spec.quant)
    phases = None if spec.plan is None else [tuple(p) for p in spec.plan.phases]
    with atomic_dir(Path(out)) as tmp:
        artifacts = {}
        if "executorch" in spec.targets:
            from toolchain.export.executorch import export_executorch

            artifacts["executorch"] = export_executorch(program, phases, spec.seq_len, tmp / PTE_NAME,
                                                        xnnpack=spec.xnnpack, on_stage=note)
        note("write adapter + manifest")
        save_adapter(tmp / ADAPTER_INIT_DIR, cfg, lora, base_model=spec.source)
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = _manifest(spec, arch, cfg, program, artifacts, files)
        write_json(tmp / MANIFEST_NAME, "manifest", manifest)
    return manifest
