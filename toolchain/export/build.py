"""Export pipeline, written down once:

1. resolve the model (preset/checkpoint, random or real weights) and the starting adapter (caller);
2. the `ProgramSpec` fixes the layer-generic methods (program/spec.py);
3. write the frozen weights once (`weights.safetensors`, program/weights_file.py), shared by every target, streamed from
   the model's source one block of rows at a time;
4. per target (targets.py), export every method;
5. write the initial state (`state_init.bin`), the initial adapter (PEFT) and `manifest.json`
   (schema-validated, with checksums): all into a temporary directory renamed into place only when
   everything succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from toolchain.atomic import atomic_dir
from toolchain.contract import (ADAPTER_INIT_DIR, MANIFEST_NAME, QWEN_ENDOFTEXT_ID, STATE_INIT_NAME, TOKENIZER_NAME,
                                WEIGHTS_NAME, Manifest, sha256_file, write_manifest)
from toolchain.errors import BadInput, FieldError
from toolchain.export.targets import TARGETS, target
from toolchain.lcsb.plan import StepPlan
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import save_adapter
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepOptions
from toolchain.models.family import get_family
from toolchain.models.presets import ModelArch
from toolchain.models.source import InMemorySource, WeightSource
from toolchain.models.weights import ModelWeights
from toolchain.optim import OptimizerConfig
from toolchain.program.manifest import build_manifest
from toolchain.program.spec import ProgramSpec, QuantSpec, flat_state, state_layout
from toolchain.program.weights_file import write_weights_streamed
from toolchain.text.tokenizer_source import tokenizer_for_export

__all__ = ["ExportSpec", "export_program", "tokenizer_fields"]


@dataclass(frozen=True)
class ExportSpec:
    """What to export, besides the model and adapter tensors.

    Args:
        source / init / seed: how the model was resolved (recorded in the manifest).
        seq_len: T, the static sequence length of every method.
        quant: frozen projection weights' format.
        optimizer: the in-program optimizer.
        plan: default LCSB plan recorded for apps (the app may choose other layers at run time);
            None: full backprop.
        targets: runtimes to export for.
        xnnpack: ExecuTorch: delegate the matmuls to XNNPACK (export/executorch.py).
        default_lr: learning rate recorded for apps that do not choose one (optimizer.default_lr).
        default_steps: with it, the manifest's `defaults` (lr = default_lr, steps): what `toolchain export` records
            for the apps (toolchain/export/app_defaults.py); None: no `defaults` key (library exports, the traces).
        options: step memory knobs (loss/MLP chunking).
        pad_token_id / tokenizer_kind: what apps pad rows with.
        eos_token_id / tokenizer_json: the tokenizer's eos and its tokenizer.json (written into the program
            directory as `tokenizer.json`, checksummed in `files`; None: no file).
        generation: also the generation methods (chunked prefill, KV-cache decode, one-position head).
        prefill_chunk: tokens per prefill call (at most seq_len).
        compute: the training methods' frozen-weight matmuls, "fp32", "fp16" or "int8" (`ProgramSpec.compute`).
    """

    source: str
    init: Literal["pretrained", "random"]
    seed: int
    seq_len: int
    quant: QuantSpec = QuantSpec()
    optimizer: OptimizerConfig = OptimizerConfig()
    plan: StepPlan | None = None
    targets: tuple[str, ...] = ("executorch",)
    xnnpack: bool = True
    default_lr: float = 1e-4
    default_steps: int | None = None
    options: StepOptions = StepOptions()
    tokenizer_kind: Literal["byte", "qwen2.5", "huggingface", "none"] = "none"
    pad_token_id: int = 0
    eos_token_id: int | None = None
    tokenizer_json: str | None = field(default=None, repr=False)
    generation: bool = False  # also export the generation methods (program.GENERATION_ROLES; the CLI's default)
    prefill_chunk: int = 32
    compute: Literal["fp32", "fp16", "int8"] = "fp32"
    xnnpack_generation: bool = False   # also the XNNPACK generation variant (export/xnnpack_generation.py)
    preference: bool = False           # also block_backward_pair (DPO steps: `train --program --objective dpo`)

    def check(self, arch: ModelArch) -> None:
        if self.seq_len < 2 or self.seq_len > arch.max_positions:
            raise FieldError("seq_len", f"must be in 2..{arch.max_positions} for this model, got {self.seq_len}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            raise BadInput(f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
        if self.plan is not None:
            self.plan.check_layers(arch.layers, where="LCSB plan")
        if not 0 <= self.pad_token_id < arch.vocab:
            raise BadInput(f"pad token id {self.pad_token_id} is outside the vocabulary of {arch.vocab}")
        self.quant.check(arch)
        if self.compute == "fp16" and self.quant.kind == "none":
            raise BadInput("--compute fp16 needs a quantized base (--quant int4 or int8): a float32 weight would be "
                           "converted whole to float16 in every call")
        if self.compute == "fp16" and (set(self.targets) != {"executorch"} or not self.xnnpack):
            raise BadInput("--compute fp16 is exported for --target executorch with XNNPACK only (its float16 GEMMs "
                           "are XNNPACK's; ExecuTorch's own kernels, ONNX and Core ML programs stay fp32)")
        if self.compute == "int8" and self.quant.kind != "int4":
            raise BadInput(f"--compute int8 needs an int4 base (--quant int4): its products are the native W4A8 "
                           f"kernels' int4 weights x int8 activations, got --quant {self.quant.kind}")
        if self.compute == "int8" and set(self.targets) != {"executorch"}:
            others = ", ".join(sorted(set(self.targets) - {"executorch"}))
            raise BadInput(f"--compute int8 is exported for --target executorch only (its training methods call the "
                           f"native kernels, toolchain/native/kernels.cpp, which {others} cannot run)")
        if self.xnnpack_generation and "executorch" not in self.targets:
            raise BadInput("--xnnpack-generation is an ExecuTorch program's variant: export with --target executorch")

    def program_spec(self, arch: ModelArch, cfg: LoraConfig) -> ProgramSpec:
        return ProgramSpec(arch, cfg, self.seq_len, quant=self.quant, optimizer=self.optimizer, options=self.options,
                           generation=self.generation, prefill_chunk=self.prefill_chunk, compute=self.compute,
                           xnnpack_generation=self.xnnpack_generation, preference=self.preference)


def tokenizer_fields(model: str, vocab: int, family: str = "qwen2") -> dict:
    """The tokenizer fields of an `ExportSpec` for `model`: its tokenizer (`tokenizer_for_export`: byte for
    tiny and demo, a checkpoint's own tokenizer.json, else Qwen2.5's when the model embeds every Qwen id)
    with its pad and eos ids (the family's vocabulary: Qwen2.5's, Qwen3's, none for Llama); without one, kind "none" and pad id Qwen2.5's <|endoftext|> if embedded, else 0.

    Raises:
        BadInput: the tokenizer produces ids the model does not embed.
    """
    tok = tokenizer_for_export(model, vocab, get_family(family).vocabulary)
    if tok is None:
        return {"tokenizer_kind": "none", "pad_token_id": QWEN_ENDOFTEXT_ID if vocab > QWEN_ENDOFTEXT_ID else 0}
    return {"tokenizer_kind": tok.kind, "pad_token_id": tok.pad_id, "eos_token_id": tok.eos_id,
            "tokenizer_json": tok.to_json()}


def _write_probe(tmp: Path, spec: ExportSpec, arch: ModelArch, seq_len: int) -> None:
    """The evaluation gate's forgetting probe (`text/probe.py`) in the program's tokenizer, as `probe.jsonl`;
    nothing when the program ships no tokenizer (the gate then says "no probe")."""
    from toolchain.contract import PROBE_NAME, TokenizerSection
    from toolchain.text.probe import probe_jsonl, probe_rows
    from toolchain.text.tokenizer_source import program_tokenizer

    if spec.tokenizer_kind == "none" or (spec.tokenizer_kind != "byte" and spec.tokenizer_json is None):
        return
    entry = TokenizerSection(spec.tokenizer_kind, arch.vocab, spec.pad_token_id, None, spec.eos_token_id,
                             None if spec.tokenizer_json is None else TOKENIZER_NAME)
    rows = probe_rows(program_tokenizer(tmp, entry, {}), seq_len)
    if rows and all(int(r.input_ids.max()) < arch.vocab for r in rows):
        (tmp / PROBE_NAME).write_text(probe_jsonl(rows), encoding="utf-8")


def export_program(arch: ModelArch, weights: ModelWeights | WeightSource, cfg: LoraConfig, lora: LoraWeights,
                   spec: ExportSpec, out: Path, *, on_stage: Callable[[str], None] | None = None,
                   on_tensor: Callable[[str, int, int], None] | None = None, replace: bool = False) -> Manifest:
    """Run the pipeline; returns the manifest written to `out/manifest.json`.

    Args:
        weights: the frozen model, in memory or as a source read one block of rows at a time (models/source.py:
            the export then never holds the whole model; the same weights file either way).
        on_stage: called with each stage's name.
        on_tensor: called after each model tensor is written (`write_weights_streamed`).
        replace: replace a non-empty `out` (the command's --force; `atomic_dir`). Default: refuse it.

    Raises:
        BadInput: invalid spec for this model (checked before any work).
    """
    spec.check(arch)
    note = on_stage or (lambda _s: None)
    pspec = spec.program_spec(arch, cfg)
    with atomic_dir(Path(out), replace=replace) as tmp:
        note("write weights")
        source = weights if isinstance(weights, WeightSource) else InMemorySource(arch, weights)
        write_weights_streamed(tmp / WEIGHTS_NAME, source, spec.quant, on_tensor=on_tensor)
        artifacts = []
        for name in spec.targets:
            options = {"xnnpack": spec.xnnpack} if name == "executorch" else {}
            artifacts.append(target(name).export(pspec, tmp, on_stage=note, **options))
        note("write adapter + manifest")
        layout = state_layout(arch, cfg, spec.optimizer)
        (tmp / STATE_INIT_NAME).write_bytes(flat_state(layout, lora).numpy().astype("<f4").tobytes())
        save_adapter(tmp / ADAPTER_INIT_DIR, cfg, lora, base_model=spec.source)
        if spec.tokenizer_json is not None:
            (tmp / TOKENIZER_NAME).write_text(spec.tokenizer_json, encoding="utf-8")
        _write_probe(tmp, spec, arch, pspec.seq_len)
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = build_manifest(spec, pspec, artifacts, tmp, files)
        write_manifest(tmp / MANIFEST_NAME, manifest)
        source.check_unchanged()       # a shard replaced or rewritten while read: no output (models/shards.py)
    return manifest
