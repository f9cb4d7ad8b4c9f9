"""The manifest a program directory is exported with (`build_manifest`: the typed contract Manifest of
toolchain/contract), and the program config a manifest describes (`ProgramManifest`: the model, LoRA and
optimizer configs and the `ProgramSpec` the host runners rebuild from, checked against the methods listed).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from toolchain import __version__
from toolchain.contract import (ADAPTER_INIT_DIR, GENERATION_ROLES, INT4_PACKING, LAYER, MANIFEST_NAME,
                                MANIFEST_SCHEMA_VERSION, STATE_INIT_NAME, STEP_ENTRY, TOKENIZER_NAME, WEIGHTS_NAME,
                                AdapterSection, FusedSection, GenerateSection, XnnpackSection, LcsbSection, LoopSection, LoraSection,
                                Manifest, MemoryPlan, MethodSpec, ModelSection, OptimizerSection, OptionsSection,
                                ProgramEntry, QuantSection, StateSection, TokenizerSection, WeightsSection,
                                read_program_manifest)
from toolchain.errors import BadInput
from toolchain.export.artifact import TargetArtifact, tree_bytes
from toolchain.export.program import (FUSED_KERNELS, QUANTIZED_FIELDS, ProgramSpec, QuantSpec, method_specs, state_layout,
                                      xnnpack_name)
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import peft_config_dict
from toolchain.mesp import StepOptions
from toolchain.models.presets import ModelArch
from toolchain.optim import OptimizerConfig

__all__ = ["ProgramManifest", "build_manifest", "LOOP", "GENERATE_LOOP"]

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
    """The program config a validated v3 manifest describes: typed configs for the host runners."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        m = manifest
        self.arch = ModelArch.from_dict(m.model.arch)
        self.lora = LoraConfig(rank=m.lora.rank, alpha=m.lora.alpha, targets=m.lora.targets,
                               use_rslora=bool(m.lora.use_rslora))
        o = m.optimizer
        self.optimizer = OptimizerConfig(o.kind, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                         frozen_unselected=o.frozen_unselected)
        q, gen = m.quant, m.generate
        chunk = {} if gen is None or gen.prefill_chunk is None else {"prefill_chunk": gen.prefill_chunk}
        self.spec = ProgramSpec(self.arch, self.lora, m.seq_len,
                                quant=QuantSpec(q.kind, q.group, q.chunk_elems, head=bool(q.head)),
                                optimizer=self.optimizer, options=StepOptions(**m.options.to_json()),
                                generation=gen is not None, compute=m.compute,
                                xnnpack_generation=gen is not None and gen.xnnpack is not None, **chunk)
        self.seq_len: int = m.seq_len
        self.methods: dict[str, MethodSpec] = m.methods
        self.state_entries = list(m.state.entries)
        self.state_numel: int = m.state.numel

    @classmethod
    def read(cls, program: Path) -> ProgramManifest:
        """The manifest of the program directory `program` (contract `read_program_manifest`), its methods
        checked against this toolchain's for the program's config."""
        man = cls(read_program_manifest(program))
        expected = method_specs(man.spec)
        if {n: m.to_json() for n, m in expected.items()} != {n: m.to_json() for n, m in man.methods.items()}:
            raise BadInput(f"{Path(program) / MANIFEST_NAME}: the methods listed do not match this toolchain's for "
                           f"the program's config; re-export the program")
        return man

    # -- typed views --------------------------------------------------------------------------------
    @property
    def moves_unselected(self) -> bool:
        return self.manifest.loop.moves_unselected

    @property
    def step_entry(self) -> str | None:
        return self.manifest.state.step_entry

    @property
    def pad_token_id(self) -> int:
        return self.manifest.tokenizer.pad_token_id

    @property
    def targets(self) -> list[str]:
        return self.manifest.targets

    def program(self, target: str) -> ProgramEntry:
        entry = self.manifest.program(target)
        if entry is None:
            raise BadInput(f"this program has no {target} export (it has {', '.join(self.targets) or 'none'}); "
                           f"export it with --target {target}")
        return entry

    @property
    def default_lr(self) -> float:
        return float(self.manifest.optimizer.default_lr)


def _generate_section(pspec: ProgramSpec, methods: dict[str, MethodSpec], artifacts: list[TargetArtifact],
                      arenas: dict[str, dict[str, int]], state_bytes: int) -> GenerateSection:
    arch = pspec.arch
    stock = [n for n, m in methods.items() if m.role in GENERATION_ROLES and not m.executorch_only]
    fused = {n.removesuffix("_fused"): n for n, m in methods.items() if m.kernels}
    cache_bytes = 2 * 4 * arch.layers * arch.kv_heads * pspec.seq_len * arch.head_dim
    return GenerateSection(
        methods=tuple(stock + list(fused.values())), max_tokens=pspec.seq_len, cache_bytes=cache_bytes,
        steps=tuple(GENERATE_LOOP),
        # the arenas of what generation loads (each its own arena on the stock mobile Module; a fused method
        # counted instead of its stock one when larger) + the KV cache + the state array
        peak_estimate_bytes={t: sum(max(a.get(n, 0), a.get(fused.get(n, n), 0)) for n in stock) + cache_bytes
                             + state_bytes for t, a in arenas.items()},
        # targets that export the stock generation methods (their program entry says why not)
        targets=tuple(a.target for a in artifacts if a.methods is None or all(n in a.methods for n in stock)),
        prefill_chunk=pspec.prefill_chunk,
        # the native kernel (toolchain/native/kernels.cpp) and the methods that call it; None: none needed
        fused=None if not fused else FusedSection(FUSED_KERNELS, "toolchain/native/kernels.cpp", fused),
        xnnpack=_xnnpack_section(pspec, methods))


def _xnnpack_section(pspec: ProgramSpec, methods: dict[str, MethodSpec]) -> XnnpackSection | None:
    """The XNNPACK generation variant's role -> method name pattern, and the weight bytes its methods hold."""
    variant = [m for m in methods.values() if m.variant is not None]
    if not variant:
        return None
    arch, group = pspec.arch, pspec.quant.group
    layer = sum(o * i // 2 + o * i // group * 2 for o, i in (arch.linear_shape(t) for t in QUANTIZED_FIELDS))
    head = arch.vocab * arch.hidden // 2 + arch.vocab * arch.hidden // group * 2
    roles = {m.role: xnnpack_name(m.role, None if m.layer is None else LAYER) for m in variant}
    blocks = sum(1 for m in variant if m.layer is not None)
    return XnnpackSection(roles, blocks * layer + head)


def _program_entry(root: Path, a: TargetArtifact) -> ProgramEntry:
    return ProgramEntry(a.target, a.file, tree_bytes(root / a.file), dict(a.planned_arena_bytes), a.delegate,
                        None if a.methods is None else dict(a.methods), dict(a.details))


def _memory_plan(pspec: ProgramSpec, methods: dict[str, MethodSpec], arenas: dict[str, dict[str, int]],
                 weights_bytes: int, state_bytes: int) -> MemoryPlan:
    ckpt_bytes = 4 * pspec.arch.layers * pspec.seq_len * pspec.arch.hidden
    train = [n for n, m in methods.items() if m.role not in GENERATION_ROLES]
    # The stock Android/iOS `Module` gives every loaded method its own arena: the app holds their
    # sum, its state array and the per-layer checkpoints (all anonymous memory); weights are mapped.
    # (training methods only: generation has its own estimate, `generate.peak_estimate_bytes`)
    peak = {t: sum(a.get(n, 0) for n in train) + state_bytes + ckpt_bytes for t, a in arenas.items()}
    return MemoryPlan(arenas, weights_bytes, state_bytes, ckpt_bytes, peak)


def build_manifest(spec, pspec: ProgramSpec, artifacts: list[TargetArtifact], root: Path,
                   files: dict[str, str]) -> Manifest:
    """The manifest of a program directory being built at `root` (`spec`: the ExportSpec)."""
    arch, cfg, opt, q = pspec.arch, pspec.lora, pspec.optimizer, pspec.quant
    layout = state_layout(arch, cfg, opt)
    numel = sum(e.numel for e in layout)
    arenas = {a.target: dict(a.planned_arena_bytes) for a in artifacts if a.planned_arena_bytes}
    methods = method_specs(pspec)
    weights_bytes = (root / WEIGHTS_NAME).stat().st_size
    plan = spec.plan
    return Manifest(
        schema_version=MANIFEST_SCHEMA_VERSION, toolchain_version=__version__,
        model=ModelSection(spec.source, spec.init, spec.seed, arch.to_dict()),
        lora=LoraSection(cfg.rank, cfg.alpha, cfg.scale, tuple(cfg.targets), cfg.use_rslora),
        seq_len=pspec.seq_len,
        quant=QuantSection(q.kind, q.group, q.chunk_elems, INT4_PACKING, q.head_quantized),
        options=OptionsSection(**asdict(pspec.options)),
        optimizer=OptimizerSection(opt.kind, opt.weight_decay, tuple(opt.betas), opt.eps, opt.frozen_unselected,
                                   spec.default_lr),
        lcsb=None if plan is None else LcsbSection(plan.policy, tuple(tuple(p) for p in plan.phases),
                                                   tuple(plan.schedule), plan.k, plan.seed, plan.warmup or None,
                                                   absent=frozenset() if plan.warmup else frozenset({"warmup"})),
        weights=WeightsSection(WEIGHTS_NAME, weights_bytes, LAYER),
        programs=tuple(_program_entry(root, a) for a in artifacts),
        methods=methods,
        loop=LoopSection(arch.layers, opt.moves_unselected, tuple(LOOP)),
        generate=_generate_section(pspec, methods, artifacts, arenas, 4 * numel) if pspec.generation else None,
        state=StateSection("float32", numel, STATE_INIT_NAME, STEP_ENTRY if opt.kind == "adamw" else None,
                           tuple(layout)),
        memory_plan=_memory_plan(pspec, methods, arenas, weights_bytes, 4 * numel),
        tokenizer=TokenizerSection(spec.tokenizer_kind, arch.vocab, spec.pad_token_id, None, spec.eos_token_id,
                                   TOKENIZER_NAME if spec.tokenizer_json is not None else None,
                                   absent=frozenset({"bos_token_id"})),
        adapter=AdapterSection(ADAPTER_INIT_DIR, peft_config_dict(cfg, base_model=spec.source)),
        files=files, compute=pspec.compute,
        # an fp32 program's manifest has no `compute` key (the same document as before the option)
        absent=frozenset({"compute"}) if pspec.compute == "fp32" else frozenset())
