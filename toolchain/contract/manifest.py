"""manifest.json of a program directory as a typed tree: `Manifest`, one frozen dataclass per section of
shared_schemas/manifest.schema.json, parsed from a schema-valid document (`Manifest.from_json`) and written back
as the same document (`to_json`: the same keys and values, so a read and a write change nothing).

The manifest states the model and LoRA config, the methods (inputs and outputs in call order, each bound to an
app input, an activation, a weight key or a state entry; `{layer}` in a name is the layer index), the weights
file, the state layout, the loop the app runs, the default LCSB plan, and what each target plans in memory.
Optional keys a document leaves out stay out (each section remembers them in `absent`); their typed value is
None. Reading from disk, with every check, is contract/read.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from toolchain.contract.methods import GENERATION_ROLES, MethodSpec
from toolchain.contract.state import StateEntry

__all__ = ["Manifest", "ModelSection", "LoraSection", "QuantSection", "OptionsSection", "OptimizerSection",
           "LcsbSection", "DefaultsSection", "WeightsSection", "ProgramEntry", "LoopSection", "FusedSection", "XnnpackSection",
           "GenerateSection",
           "StateSection", "MemoryPlan", "TokenizerSection", "AdapterSection"]


def _absent(d: dict, optional: tuple[str, ...]) -> frozenset[str]:
    return frozenset(k for k in optional if k not in d)


def _present(d: dict, absent: frozenset[str]) -> dict:
    return {k: v for k, v in d.items() if k not in absent}


class _Section:
    """A section whose optional keys are written unless the document read left them out (`absent`)."""

    OPTIONAL: tuple[str, ...] = ()
    absent: frozenset[str]

    def _json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "absent"}  # type: ignore[arg-type]

    def to_json(self) -> dict:
        return _present(self._json(), self.absent)

    @classmethod
    def from_json(cls, d: dict):
        values = {f.name: d.get(f.name) for f in fields(cls) if f.name != "absent"}  # type: ignore[arg-type]
        return cls(**values, absent=_absent(d, cls.OPTIONAL))


def _absent_keys():
    return field(default=frozenset(), repr=False, compare=False)


@dataclass(frozen=True)
class ModelSection(_Section):
    """Where the model came from and its architecture (the model family's config fields, as exported)."""

    source: str                 # a preset name or a checkpoint path
    init: Literal["pretrained", "random"]
    seed: int | None
    arch: dict[str, Any]        # hidden, layers, heads, kv_heads, intermediate, vocab, max_positions, ...
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("seed",)


@dataclass(frozen=True)
class LoraSection(_Section):
    rank: int
    alpha: float
    scale: float
    targets: tuple[str, ...]
    use_rslora: bool | None
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("use_rslora",)

    def _json(self) -> dict:
        return {**super()._json(), "targets": list(self.targets)}

    @classmethod
    def from_json(cls, d: dict) -> LoraSection:
        return cls(d["rank"], d["alpha"], d["scale"], tuple(d["targets"]), d.get("use_rslora"),
                   _absent(d, cls.OPTIONAL))


@dataclass(frozen=True)
class QuantSection(_Section):
    """Frozen weights: float32 (`none`) or group-wise int8 / int4; `head`: the embedding and LM head in int4 too."""

    kind: Literal["none", "int8", "int4"]
    group: int
    chunk_elems: int
    int4_packing: str | None
    head: bool | None
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("int4_packing", "head")


@dataclass(frozen=True)
class OptionsSection(_Section):
    """The step's memory knobs (mesp.StepOptions)."""

    loss_chunk: int
    vocab_chunk: int | None
    mlp_chunk: int | None
    absent: frozenset[str] = _absent_keys()


@dataclass(frozen=True)
class OptimizerSection(_Section):
    """The in-program optimizer (toolchain/optim.py OptimizerConfig); every step takes lr as an input."""

    kind: Literal["sgd", "adamw"]
    weight_decay: float
    betas: tuple[float, float] | None
    eps: float | None
    frozen_unselected: bool | None
    default_lr: float | None
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("betas", "eps", "frozen_unselected", "default_lr")

    def _json(self) -> dict:
        return {**super()._json(), "betas": None if self.betas is None else list(self.betas)}

    @classmethod
    def from_json(cls, d: dict) -> OptimizerSection:
        betas = d.get("betas")
        return cls(d["kind"], d["weight_decay"], None if betas is None else tuple(betas), d.get("eps"),
                   d.get("frozen_unselected"), d.get("default_lr"), _absent(d, cls.OPTIONAL))


@dataclass(frozen=True)
class DefaultsSection(_Section):
    """What an app uses when the user chooses nothing (`toolchain export` writes them, toolchain/export/app_defaults.py;
    `toolchain train --program` and both apps read them): the learning rate and the number of steps of a run."""

    lr: float
    steps: int
    absent: frozenset[str] = _absent_keys()


@dataclass(frozen=True)
class LcsbSection(_Section):
    """The default LCSB plan: the layers of step s are phases[schedule[s % len(schedule)]], or every layer
    while s < warmup (`warmup` absent: 0)."""

    policy: str
    phases: tuple[tuple[int, ...], ...]
    schedule: tuple[int, ...]
    k: int | None
    seed: int | None
    warmup: int | None = None
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("k", "seed", "warmup")

    def _json(self) -> dict:
        return {**super()._json(), "phases": [list(p) for p in self.phases], "schedule": list(self.schedule)}

    @classmethod
    def from_json(cls, d: dict) -> LcsbSection:
        return cls(d["policy"], tuple(tuple(p) for p in d["phases"]), tuple(d["schedule"]), d.get("k"), d.get("seed"),
                   d.get("warmup"), _absent(d, cls.OPTIONAL))


@dataclass(frozen=True)
class WeightsSection(_Section):
    file: str
    bytes: int
    layer_placeholder: str
    absent: frozenset[str] = _absent_keys()


@dataclass(frozen=True)
class ProgramEntry:
    """One target's program: its file (or directory), size, planned arenas per method, and target details."""

    target: Literal["executorch", "coreml", "onnx"]
    file: str
    bytes: int
    planned_arena_bytes: dict[str, int]
    delegate: str | None = None            # written only when set
    methods: dict[str, str] | None = None  # one file per method (ONNX, Core ML): method name -> file
    details: dict[str, Any] = field(default_factory=dict)  # the target's own fields (opset, op counts, ...)

    _KNOWN = ("target", "file", "bytes", "planned_arena_bytes", "delegate", "methods")

    def to_json(self) -> dict:
        d = {"target": self.target, "file": self.file, "bytes": self.bytes,
             "planned_arena_bytes": dict(self.planned_arena_bytes), **self.details}
        if self.delegate is not None:
            d["delegate"] = self.delegate
        if self.methods is not None:
            d["methods"] = dict(self.methods)
        return d

    @classmethod
    def from_json(cls, d: dict) -> ProgramEntry:
        return cls(d["target"], d["file"], d["bytes"], dict(d["planned_arena_bytes"]), d.get("delegate"),
                   d.get("methods"), {k: v for k, v in d.items() if k not in cls._KNOWN})


@dataclass(frozen=True)
class LoopSection(_Section):
    """The layer loop every app runs (`steps`: it in words)."""

    layers: int
    moves_unselected: bool
    steps: tuple[str, ...]
    absent: frozenset[str] = _absent_keys()

    def _json(self) -> dict:
        return {**super()._json(), "steps": list(self.steps)}

    @classmethod
    def from_json(cls, d: dict) -> LoopSection:
        return cls(d["layers"], d["moves_unselected"], tuple(d["steps"]))


@dataclass(frozen=True)
class FusedSection(_Section):
    """The native kernels the fused generation methods call, and stock name -> fused name."""

    kernels: tuple[str, ...]
    source: str
    methods: dict[str, str]
    absent: frozenset[str] = _absent_keys()

    def _json(self) -> dict:
        return {**super()._json(), "kernels": list(self.kernels), "methods": dict(self.methods)}

    @classmethod
    def from_json(cls, d: dict) -> FusedSection:
        return cls(tuple(d["kernels"]), d["source"], dict(d["methods"]))


@dataclass(frozen=True)
class XnnpackSection(_Section):
    """The XNNPACK generation variant (export/xnnpack_generation.py): generation role -> the method to call
    instead on a runtime without the fused methods' kernels; block methods are per layer (`{layer}` in the name
    replaced by the layer index), their weights inside. `weight_bytes`: the int4 values (half a byte each) and
    bfloat16 group scales of every matrix the variant's methods hold (a layer's twice: its prefill and decode
    methods), about what XNNPACK packs into anonymous memory when they load (docs/export.md)."""

    methods: dict[str, str]
    weight_bytes: int
    absent: frozenset[str] = _absent_keys()

    def _json(self) -> dict:
        return {**super()._json(), "methods": dict(self.methods)}

    @classmethod
    def from_json(cls, d: dict) -> XnnpackSection:
        return cls(dict(d["methods"]), d["weight_bytes"])


@dataclass(frozen=True)
class GenerateSection(_Section):
    """Generation with the live adapter (runtime/generate.py is the reference driver)."""

    methods: tuple[str, ...]
    max_tokens: int
    cache_bytes: int
    steps: tuple[str, ...]
    peak_estimate_bytes: dict[str, int]
    targets: tuple[str, ...]
    prefill_chunk: int | None
    fused: FusedSection | None
    xnnpack: XnnpackSection | None = None      # absent from the document when None
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("prefill_chunk", "fused", "xnnpack")

    def _json(self) -> dict:
        return {**super()._json(), "methods": list(self.methods), "steps": list(self.steps),
                "targets": list(self.targets), "peak_estimate_bytes": dict(self.peak_estimate_bytes),
                "fused": None if self.fused is None else self.fused.to_json(),
                "xnnpack": None if self.xnnpack is None else self.xnnpack.to_json()}

    def to_json(self) -> dict:
        d = super().to_json()
        if self.xnnpack is None:
            d.pop("xnnpack", None)
        return d

    @classmethod
    def from_json(cls, d: dict) -> GenerateSection:
        fused, xnn = d.get("fused"), d.get("xnnpack")
        return cls(tuple(d["methods"]), d["max_tokens"], d["cache_bytes"], tuple(d["steps"]),
                   dict(d["peak_estimate_bytes"]), tuple(d["targets"]), d.get("prefill_chunk"),
                   None if fused is None else FusedSection.from_json(fused),
                   None if xnn is None else XnnpackSection.from_json(xnn), _absent(d, cls.OPTIONAL))

    def xnnpack_methods(self) -> dict[str, str]:
        """Generation role -> the XNNPACK variant's method name pattern ({}: none)."""
        return {} if self.xnnpack is None else dict(self.xnnpack.methods)

    def fused_methods(self) -> dict[str, str]:
        """Stock generation method -> the fused one to call when the runtime has the kernels ({}: none)."""
        return {} if self.fused is None else dict(self.fused.methods)


@dataclass(frozen=True)
class StateSection(_Section):
    """The app's flat state: float32, `numel` elements, laid out as `entries` (contract/state.py)."""

    dtype: Literal["float32"]
    numel: int
    init_file: str
    step_entry: str | None
    entries: tuple[StateEntry, ...]
    absent: frozenset[str] = _absent_keys()

    def _json(self) -> dict:
        return {**super()._json(), "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, d: dict) -> StateSection:
        return cls(d["dtype"], d["numel"], d["init_file"], d["step_entry"],
                   tuple(StateEntry.from_json(e) for e in d["entries"]))


@dataclass(frozen=True)
class MemoryPlan(_Section):
    """What the training methods plan in memory per target (generation has its own estimate)."""

    planned_arena_bytes: dict[str, dict[str, int]]   # target -> method -> arena bytes
    weights_bytes: int
    lora_state_bytes: int
    checkpoint_bytes: int                            # all layers' [T, d] float32 checkpoints
    peak_estimate_bytes: dict[str, int]
    absent: frozenset[str] = _absent_keys()


@dataclass(frozen=True)
class TokenizerSection(_Section):
    kind: Literal["byte", "qwen2.5", "huggingface", "none"]
    vocab: int
    pad_token_id: int
    bos_token_id: int | None
    eos_token_id: int | None
    file: str | None           # the tokenizer file in the program directory (None: none shipped)
    absent: frozenset[str] = _absent_keys()
    OPTIONAL = ("bos_token_id", "eos_token_id", "file")


@dataclass(frozen=True)
class AdapterSection(_Section):
    init_dir: str
    config: dict[str, Any]     # PEFT's adapter_config.json of the initial adapter
    absent: frozenset[str] = _absent_keys()


@dataclass(frozen=True)
class Manifest:
    """A program manifest (shared_schemas/manifest.schema.json), section by section."""

    schema_version: int
    toolchain_version: str
    model: ModelSection
    lora: LoraSection
    seq_len: int
    quant: QuantSection
    options: OptionsSection
    optimizer: OptimizerSection
    lcsb: LcsbSection | None
    weights: WeightsSection
    programs: tuple[ProgramEntry, ...]
    methods: dict[str, MethodSpec]             # by name, in the manifest's order
    loop: LoopSection
    generate: GenerateSection | None
    state: StateSection
    memory_plan: MemoryPlan
    tokenizer: TokenizerSection
    adapter: AdapterSection
    files: dict[str, str]                      # relative path -> sha256 of every file of the directory
    # the frozen-weight matmuls' precision (`export --compute`): "fp32" (exact), "fp16" (float16 operands and
    # products; the program needs a runtime with float16 kernels) or "int8" (int4 x int8 products through the native
    # kernels, which the training methods list). Absent (older exports, and every fp32 export: their manifests are
    # unchanged by the option) means "fp32".
    compute: Literal["fp32", "fp16", "int8"] = "fp32"
    # the apps' run defaults (lr, steps), written by `toolchain export`; None (absent): a program exported before them
    # or through the library without them (the readers fall back to optimizer.default_lr and 100 steps)
    defaults: DefaultsSection | None = None
    absent: frozenset[str] = _absent_keys()           # "generate", "compute" when the document has no such key

    def to_json(self) -> dict:
        d = {"schema_version": self.schema_version, "toolchain_version": self.toolchain_version,
             "model": self.model.to_json(), "lora": self.lora.to_json(), "seq_len": self.seq_len,
             "quant": self.quant.to_json(), "options": self.options.to_json(), "optimizer": self.optimizer.to_json(),
             "lcsb": None if self.lcsb is None else self.lcsb.to_json(), "weights": self.weights.to_json(),
             "programs": [p.to_json() for p in self.programs], "methods": [m.to_json() for m in self.methods.values()],
             "loop": self.loop.to_json(), "generate": None if self.generate is None else self.generate.to_json(),
             "state": self.state.to_json(), "memory_plan": self.memory_plan.to_json(),
             "tokenizer": self.tokenizer.to_json(), "adapter": self.adapter.to_json(), "files": dict(self.files),
             "compute": self.compute}
        if self.defaults is not None:
            d["defaults"] = self.defaults.to_json()
        return _present(d, self.absent)

    @classmethod
    def from_json(cls, d: dict) -> Manifest:
        """The typed tree of a schema-valid document (contract/read.py validates it first)."""
        lcsb, gen = d.get("lcsb"), d.get("generate")
        methods = [MethodSpec.from_json(m) for m in d["methods"]]
        return cls(d["schema_version"], d["toolchain_version"], ModelSection.from_json(d["model"]),
                   LoraSection.from_json(d["lora"]), d["seq_len"], QuantSection.from_json(d["quant"]),
                   OptionsSection.from_json(d["options"]), OptimizerSection.from_json(d["optimizer"]),
                   None if lcsb is None else LcsbSection.from_json(lcsb), WeightsSection.from_json(d["weights"]),
                   tuple(ProgramEntry.from_json(p) for p in d["programs"]), {m.name: m for m in methods},
                   LoopSection.from_json(d["loop"]), None if gen is None else GenerateSection.from_json(gen),
                   StateSection.from_json(d["state"]), MemoryPlan.from_json(d["memory_plan"]),
                   TokenizerSection.from_json(d["tokenizer"]), AdapterSection.from_json(d["adapter"]),
                   dict(d["files"]), d.get("compute", "fp32"),
                   DefaultsSection.from_json(d["defaults"]) if "defaults" in d else None, _absent(d, ("generate", "compute")))

    # -- what readers ask -------------------------------------------------------------------------------
    @property
    def targets(self) -> list[str]:
        return [p.target for p in self.programs]

    def program(self, target: str) -> ProgramEntry | None:
        """The program entry of `target` (None: not exported for it)."""
        return next((p for p in self.programs if p.target == target), None)

    def training_methods(self) -> list[str]:
        """The names of the training methods (every method whose role is not a generation role)."""
        return [n for n, m in self.methods.items() if m.role not in GENERATION_ROLES]
