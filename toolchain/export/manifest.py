"""manifest.json of a v3 program directory: written and read by one class, `ProgramManifest`.

File names of a program directory live here, once. The manifest states the model and LoRA config,
the methods (inputs and outputs in call order, each bound to an app input, an activation, a weight
key or a state entry; `{layer}` in a name is the layer index), the weights file, the state layout,
the loop the app runs, the default LCSB plan, and what each target plans in memory
(shared_schemas/manifest.schema.json). Programs of another schema_version are refused ("re-export").
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from toolchain import __version__
from toolchain.errors import BadInput
from toolchain.export.artifact import TargetArtifact, tree_bytes
from toolchain.export.program import (FUSED_KERNELS, GENERATION_ROLES, LAYER, IoSpec, MethodSpec, OptimizerSpec,
                                      ProgramSpec, QuantSpec, StateEntry, method_specs, state_layout)
from toolchain.export.weights_file import WEIGHTS_NAME
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import peft_config_dict
from toolchain.mesp import StepOptions
from toolchain.models.presets import Qwen25Arch
from toolchain.schemas import read_json, write_json
from toolchain.tokenizer import TOKENIZER_NAME as TOKENIZER_FILE

__all__ = ["ProgramManifest", "build_manifest", "MANIFEST_NAME", "MANIFEST_SCHEMA_VERSION", "STATE_INIT_NAME",
           "ADAPTER_INIT_DIR", "TOKENIZER_FILE", "WEIGHTS_NAME", "LOOP", "GENERATE_LOOP"]

MANIFEST_NAME = "manifest.json"
# The int4 byte layout of weights.safetensors (mesp/ops/quant.py): column 2j in the high nibble of byte j.
INT4_PACKING = "interleaved"
MANIFEST_SCHEMA_VERSION = 3  # 3: layer-generic methods, weights as inputs; 2: whole-step methods, weights inside
ADAPTER_INIT_DIR = "adapter_init"
STATE_INIT_NAME = "state_init.bin"  # the initial flat state, raw little-endian float32

# The loop every app runs (program.py's docstring, in words; the host runner is its reference).
LOOP = [
    "if state.step_entry: state[step_entry] += 1",
    "x = embed(input_ids)",
    "for layer in 0..L-1: if layer is selected: checkpoint[layer] = copy(x); x = block_forward(x, layer)",
    "loss, d = head_loss(x, labels)",
    "for layer in L-1..0: if selected: d, state[layer] = block_backward(d, checkpoint[layer], layer) "
    "(stop after the lowest selected layer); elif loop.moves_unselected: state[layer] = block_skip_update(layer)",
]

# Generation with the live adapter (the same state array; runtime/generate.py is the reference driver).
GENERATE_LOOP = [
    "cache: per layer k and v float32 [kv_heads, seq_len, head_dim] (bind cache, ref k_{layer} / v_{layer}); "
    "a prompt of n tokens and N new ones need n + N <= seq_len",
    "methods: if the runtime has generate.fused.kernels registered, call each method of generate.fused.methods "
    "under its fused name (same inputs and outputs), else the stock one",
    "prefill: for pos in 0, C, 2C, .. < n (C = prefill_chunk): x = embed_prefill(prompt[pos:pos+C] padded with "
    "pad_token_id to C); for layer in 0..L-1: x, k_new, v_new = block_prefill(x, pos, cache[layer], layer), "
    "write rows pos..pos+C-1 (those < seq_len) of cache[layer]",
    "logits = head_logits(row (n - 1) mod C of the last chunk's x); pos = n",
    "until eos or N tokens: token = pick(logits) (greedy: argmax; else sample softmax(logits / temperature)); "
    "x = embed_token(token); for layer in 0..L-1: x, k_new, v_new = block_decode(x, pos, cache[layer], layer), "
    "write k_new / v_new at row pos of cache[layer]; logits = head_logits(x); pos += 1",
]


class ProgramManifest:
    """A validated v3 manifest, with typed views of what the host and apps need."""

    def __init__(self, doc: dict) -> None:
        self.doc = doc
        m = doc
        self.arch = Qwen25Arch(**m["model"]["arch"])
        lora = m["lora"]
        self.lora = LoraConfig(rank=lora["rank"], alpha=lora["alpha"], targets=tuple(lora["targets"]),
                               use_rslora=lora.get("use_rslora", False))
        o = m["optimizer"]
        self.optimizer = OptimizerSpec(o["kind"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"],
                                       frozen_unselected=o["frozen_unselected"])
        q = m["quant"]
        if q["kind"] == "int4" and q.get("int4_packing") != INT4_PACKING:
            raise BadInput("the program's int4 weights use an older packing (planar nibbles, before int4_packing "
                           f"{INT4_PACKING!r}); re-export the program with this toolchain")
        gen = m.get("generate")
        self.spec = ProgramSpec(self.arch, self.lora, m["seq_len"],
                                quant=QuantSpec(q["kind"], q["group"], q["chunk_elems"], head=q.get("head", False)),
                                optimizer=self.optimizer, options=StepOptions(**m["options"]),
                                generation=gen is not None,
                                **({"prefill_chunk": gen["prefill_chunk"]} if gen and "prefill_chunk" in gen else {}))
        self.seq_len: int = m["seq_len"]
        self.methods: dict[str, MethodSpec] = {x["name"]: _method(x) for x in m["methods"]}
        self.state_entries = [StateEntry(e["name"], e["key"], e["role"], tuple(e["shape"]), e["offset"], e.get("layer"))
                              for e in m["state"]["entries"]]
        self.state_numel: int = m["state"]["numel"]

    # -- reading and writing ------------------------------------------------------------------------
    @classmethod
    def read(cls, path: Path) -> ProgramManifest:
        raw = read_json(path)
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version != MANIFEST_SCHEMA_VERSION:
            raise BadInput(f"{path.parent} was exported with manifest schema_version {version}; this toolchain runs "
                           f"version {MANIFEST_SCHEMA_VERSION} (layer-generic methods): re-export the program")
        _refuse_before_fused_generation(raw, path)
        man = cls(read_json(path, "manifest"))
        expected = method_specs(man.spec)
        if {n: m.to_json() for n, m in expected.items()} != {n: m.to_json() for n, m in man.methods.items()}:
            raise BadInput(f"{path}: the methods listed do not match this toolchain's for the program's config; "
                           f"re-export the program")
        return man

    def write(self, path: Path) -> None:
        write_json(path, "manifest", self.doc)

    # -- typed views --------------------------------------------------------------------------------
    @property
    def moves_unselected(self) -> bool:
        return bool(self.doc["loop"]["moves_unselected"])

    @property
    def step_entry(self) -> str | None:
        return self.doc["state"]["step_entry"]

    @property
    def pad_token_id(self) -> int:
        return self.doc["tokenizer"]["pad_token_id"]

    @property
    def targets(self) -> list[str]:
        return [p["target"] for p in self.doc["programs"]]

    def program(self, target: str) -> dict:
        for p in self.doc["programs"]:
            if p["target"] == target:
                return p
        raise BadInput(f"this program has no {target} export (it has {', '.join(self.targets) or 'none'}); "
                       f"export it with --target {target}")

    @property
    def default_lr(self) -> float:
        return float(self.doc["optimizer"]["default_lr"])


def _refuse_before_fused_generation(raw: dict, path: Path) -> None:
    """Programs exported before chunked prefill and int4 embedding/head (same schema_version 3): re-export."""
    gen, quant = raw.get("generate"), raw.get("quant")
    old_gen = isinstance(gen, dict) and "prefill_chunk" not in gen
    old_int4 = isinstance(quant, dict) and quant.get("kind") == "int4" and "head" not in quant
    if old_gen or old_int4:
        what = "its generation methods prefill the whole seq_len" if old_gen else "its embedding and LM head are float32"
        raise BadInput(f"{path.parent} was exported before chunked prefill and the int4 embedding/head ({what}); "
                       f"re-export the program with this toolchain")


def _method(d: dict) -> MethodSpec:
    def io(x: dict) -> IoSpec:
        return IoSpec(x["name"], x["dtype"], tuple(x["shape"]), x["bind"], x["ref"],
                      tuple(x["rows"]) if "rows" in x else None)
    return MethodSpec(d["name"], d["role"], tuple(io(x) for x in d["inputs"]), tuple(io(x) for x in d["outputs"]),
                      tuple(d.get("kernels", ())))


def _generate_section(pspec: ProgramSpec, methods: dict[str, MethodSpec], artifacts: list[TargetArtifact],
                      arenas: dict[str, dict[str, int]], state_bytes: int) -> dict:
    arch = pspec.arch
    stock = [n for n, m in methods.items() if m.role in GENERATION_ROLES and not m.kernels]
    fused = {n.removesuffix("_fused"): n for n, m in methods.items() if m.kernels}
    cache_bytes = 2 * 4 * arch.layers * arch.kv_heads * pspec.seq_len * arch.head_dim
    return {
        "methods": stock + list(fused.values()), "max_tokens": pspec.seq_len, "cache_bytes": cache_bytes,
        "prefill_chunk": pspec.prefill_chunk, "steps": GENERATE_LOOP,
        # the native kernel (toolchain/native/kernels.cpp) and the methods that call it; null: none needed
        "fused": None if not fused else {"kernels": list(FUSED_KERNELS), "source": "toolchain/native/kernels.cpp",
                                         "methods": fused},
        # the arenas of what generation loads (each its own arena on the stock mobile Module; a fused method
        # counted instead of its stock one when larger) + the KV cache + the state array
        "peak_estimate_bytes": {t: sum(max(a.get(n, 0), a.get(fused.get(n, n), 0)) for n in stock) + cache_bytes
                                + state_bytes for t, a in arenas.items()},
        # targets that export the stock generation methods (their program entry says why not)
        "targets": [a.target for a in artifacts if a.methods is None or all(n in a.methods for n in stock)]}


def _program_entry(root: Path, a: TargetArtifact) -> dict:
    entry = {"target": a.target, "file": a.file, "bytes": tree_bytes(root / a.file),
             "planned_arena_bytes": dict(a.planned_arena_bytes), **a.details}
    if a.delegate is not None:
        entry["delegate"] = a.delegate
    if a.methods is not None:
        entry["methods"] = dict(a.methods)
    return entry


def build_manifest(spec, pspec: ProgramSpec, artifacts: list[TargetArtifact], root: Path,
                   files: dict[str, str]) -> ProgramManifest:
    """The manifest of a program directory being built at `root` (`spec`: the ExportSpec)."""
    arch, cfg, opt = pspec.arch, pspec.lora, pspec.optimizer
    layout = state_layout(arch, cfg, opt)
    numel = sum(e.numel for e in layout)
    ckpt_bytes = 4 * arch.layers * pspec.seq_len * arch.hidden
    arenas = {a.target: dict(a.planned_arena_bytes) for a in artifacts if a.planned_arena_bytes}
    methods = method_specs(pspec)
    train = [n for n, m in methods.items() if m.role not in GENERATION_ROLES]
    doc = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "toolchain_version": __version__,
        "model": {"source": spec.source, "init": spec.init, "seed": spec.seed, "arch": asdict(arch)},
        "lora": {"rank": cfg.rank, "alpha": cfg.alpha, "scale": cfg.scale, "targets": list(cfg.targets),
                 "use_rslora": cfg.use_rslora},
        "seq_len": pspec.seq_len,
        "quant": {"kind": pspec.quant.kind, "group": pspec.quant.group, "chunk_elems": pspec.quant.chunk_elems,
                  "int4_packing": INT4_PACKING, "head": pspec.quant.head_quantized},
        "options": asdict(pspec.options),
        "optimizer": {"kind": opt.kind, "weight_decay": opt.weight_decay, "betas": list(opt.betas), "eps": opt.eps,
                      "frozen_unselected": opt.frozen_unselected, "default_lr": spec.default_lr},
        "lcsb": None if spec.plan is None else {"policy": spec.plan.policy, "k": spec.plan.k,
                                                 "phases": [list(p) for p in spec.plan.phases],
                                                 "schedule": list(spec.plan.schedule), "seed": spec.plan.seed},
        "weights": {"file": WEIGHTS_NAME, "bytes": (root / WEIGHTS_NAME).stat().st_size, "layer_placeholder": LAYER},
        "programs": [_program_entry(root, a) for a in artifacts],
        "methods": [m.to_json() for m in methods.values()],
        "loop": {"layers": arch.layers, "moves_unselected": opt.moves_unselected, "steps": LOOP},
        "generate": _generate_section(pspec, methods, artifacts, arenas, 4 * numel) if pspec.generation else None,
        "state": {"dtype": "float32", "numel": numel, "init_file": STATE_INIT_NAME,
                  "step_entry": "adam_step" if opt.kind == "adamw" else None,
                  "entries": [{"name": e.name, "key": e.key, "role": e.role, "shape": list(e.shape), "offset": e.offset,
                               **({"layer": e.layer} if e.layer is not None else {})} for e in layout]},
        "memory_plan": {
            "planned_arena_bytes": arenas,
            "weights_bytes": (root / WEIGHTS_NAME).stat().st_size,
            "lora_state_bytes": 4 * numel,
            "checkpoint_bytes": ckpt_bytes,
            # The stock Android/iOS `Module` gives every loaded method its own arena: the app holds their
            # sum, its state array and the per-layer checkpoints (all anonymous memory); weights are mapped.
            # (training methods only: generation has its own estimate, `generate.peak_estimate_bytes`)
            "peak_estimate_bytes": {t: sum(a.get(n, 0) for n in train) + 4 * numel + ckpt_bytes
                                    for t, a in arenas.items()},
        },
        "tokenizer": {"kind": spec.tokenizer_kind, "vocab": arch.vocab, "pad_token_id": spec.pad_token_id,
                      "eos_token_id": spec.eos_token_id,
                      "file": TOKENIZER_FILE if spec.tokenizer_json is not None else None},
        "adapter": {"init_dir": ADAPTER_INIT_DIR, "config": peft_config_dict(cfg, base_model=spec.source)},
        "files": files,
    }
    return ProgramManifest(doc)
