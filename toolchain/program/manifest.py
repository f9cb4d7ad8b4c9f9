"""Writing a program directory's manifest: `build_manifest` (the typed contract Manifest of toolchain/contract)
from the program's `ProgramSpec` and what each target exported. Its reader is directory.py (`ProgramDir`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from toolchain import __version__
from toolchain.contract import (ADAPTER_INIT_DIR, GENERATION_ROLES, INT4_PACKING, LAYER, MANIFEST_SCHEMA_VERSION,
                                STATE_INIT_NAME, STEP_ENTRY, TOKENIZER_NAME, WEIGHTS_NAME, AdapterSection,
                                DefaultsSection, FusedSection, GenerateSection, XnnpackSection, LcsbSection, LoopSection, LoraSection, Manifest,
                                MemoryPlan, MethodSpec, ModelSection, OptimizerSection, OptionsSection, ProgramEntry,
                                QuantSection, StateSection, TokenizerSection, WeightsSection)
from toolchain.lora.peft_io import peft_config_dict
from toolchain.program.artifact import TargetArtifact, tree_bytes
from toolchain.program.spec import (FUSED_KERNELS, QUANTIZED_FIELDS, ProgramSpec, method_specs, state_layout,
                                    xnnpack_name)

__all__ = ["build_manifest", "LOOP", "GENERATE_LOOP"]

# The loop every app runs (spec.py's docstring, in words; the host runtime is its reference).
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


def _generate_section(pspec: ProgramSpec, methods: dict[str, MethodSpec], artifacts: list[TargetArtifact],
                      arenas: dict[str, dict[str, int]], state_bytes: int) -> GenerateSection:
    arch = pspec.arch
    stock = [n for n, m in methods.items() if m.role in GENERATION_ROLES and not m.executorch_only]
    fused = {n.removesuffix("_fused"): n for n, m in methods.items() if m.kernels and m.role in GENERATION_ROLES}
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
        defaults=None if spec.default_steps is None else DefaultsSection(spec.default_lr, spec.default_steps),
        # an fp32 program's manifest has no `compute` key (the same document as before the option)
        absent=frozenset({"compute"}) if pspec.compute == "fp32" else frozenset())
