"""`toolchain export`: the training program phones run."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.atomic import FORCE_HELP
from toolchain.cli.options import load_model_and_adapter, lora_options, model_options
from toolchain.validate import FiniteFloat

QWEN_PAD_ID = 151643  # <|endoftext|>, Qwen2.5's padding token


@click.command("export")
@model_options(default_model="qwen2.5-0.5b")
@lora_options
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True,
              help="Static sequence length T of the train methods (shorter rows are padded).")
@click.option("--quant", type=click.Choice(["none", "int8", "int4"]), default="int4", show_default=True,
              help="Frozen projection weights: float32 or group-wise int8/int4, dequantized inside the step.")
@click.option("--quant-group", type=click.IntRange(2, 2**31 - 1), default=64, show_default=True, help="Quantization group size.")
@click.option("--dequant-chunk-mb", type=FiniteFloat(min=0, min_open=True, max=65536), default=1.0, show_default=True,
              help="Quantized weights are dequantized inside a method at most this many MiB (float32) at a time: "
                   "smaller lowers the transient, larger makes fewer graph nodes.")
@click.option("--lcsb-k", type=click.IntRange(min=1), default=None,
              help="Default LCSB plan recorded for apps: layers backpropagated per step (apps may choose at run time).")
@click.option("--lcsb-policy", type=click.Choice(["cyclic", "strided", "last", "random", "full"]), default="cyclic",
              show_default=True, help="LCSB policy (with --lcsb-k).")
@click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Default LCSB plan JSON from `toolchain plan lcsb` (instead of --lcsb-k/--lcsb-policy).")
@click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default="sgd", show_default=True,
              help="Optimizer applied inside the program, layer by layer.")
@click.option("--weight-decay", type=FiniteFloat(min=0), default=0.0, show_default=True)
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=1e-4, show_default=True,
              help="Default learning rate recorded in the manifest (apps pass lr every step).")
@click.option("--target", "export_targets", default="executorch", show_default=True,
              help="Comma-separated runtimes: executorch, onnx, coreml (one manifest describes all).")
@click.option("--xnnpack/--no-xnnpack", default=True, show_default=True,
              help="ExecuTorch: delegate the matmuls to XNNPACK (weights stay memory-mapped inputs; packed per call "
                   "into one shared workspace). --no-xnnpack: ExecuTorch's own kernels (slower, no workspace).")
@click.option("--loss-chunk", type=click.IntRange(1, 2**31 - 1), default=None,
              help="Tokens per LM-head chunk.  [default: --seq-len, one chunk: the head's graph, hence the export "
                   "time, does not grow with the sequence length]")
@click.option("--vocab-chunk", type=click.IntRange(1, 2**31 - 1), default=1024, show_default=True,
              help="Vocabulary rows per LM-head chunk (online softmax): bounds the logits and head-slice transients.")
@click.option("--mlp-chunk", type=click.IntRange(1, 2**31 - 1), default=256, show_default=True,
              help="Intermediate columns per MLP chunk (forward and backward): bounds the MLP's [T, C] tensors.")
@click.option("--generate/--no-generate", "generation", default=True, show_default=True,
              help="Also export the generation methods (prefill, KV-cache decode, one-position LM head) that "
                   "`toolchain generate` and apps run with the live adapter.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output directory (written atomically; an existing non-empty one is refused unless --force).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def export(model, init, seed, adapter, rank, alpha, targets, seq_len, quant, quant_group, dequant_chunk_mb, lcsb_k,
           lcsb_policy, plan_path, optimizer, weight_decay, lr, export_targets, xnnpack, loss_chunk, vocab_chunk,
           mlp_chunk, generation, out, force) -> None:
    """Export the explicit MeSP training step as layer-generic methods (embed, block_forward, head_loss,
    block_backward with the in-program optimizer, block_skip_update) for each --target (ExecuTorch .pte,
    ONNX, Core ML), the frozen weights once in weights.safetensors (memory-mapped by the apps, passed to
    the methods without copying), and one manifest, written atomically to --out (contract v3)."""
    import time

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from toolchain.atomic import check_output_dir
    from toolchain.errors import BadInput
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.export.program import OptimizerSpec, QuantSpec
    from toolchain.lcsb.plan import make_plan, read_plan
    from toolchain.mesp import StepOptions
    from toolchain.tokenizer import tokenizer_for_export

    if plan_path is not None and lcsb_k is not None:
        raise BadInput("give either --plan or --lcsb-k, not both")
    spec_targets = tuple(t.strip() for t in export_targets.split(",") if t.strip())
    check_output_dir(out, force=force)                   # before loading anything
    arch, weights, cfg, lora = load_model_and_adapter(model, init, seed, adapter, rank, alpha, targets)
    check_output_dir(out, force=force, expected_bytes=_expected_bytes(weights, quant))
    plan = read_plan(plan_path) if plan_path else (make_plan(arch.layers, lcsb_k, lcsb_policy) if lcsb_k else None)
    tok = tokenizer_for_export(model, arch.vocab)  # byte (tiny), the checkpoint's own tokenizer.json, or Qwen2.5
    tokenizer = (dict(tokenizer_kind=tok.kind, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id,
                      tokenizer_json=tok.to_json())
                 if tok else dict(tokenizer_kind="none", pad_token_id=QWEN_PAD_ID if arch.vocab > QWEN_PAD_ID else 0))
    quant_spec = QuantSpec(quant, quant_group, chunk_elems=max(1, int(dequant_chunk_mb * 2**20) // 4))  # float32
    spec = ExportSpec(source=model, init=init, seed=seed, seq_len=seq_len, quant=quant_spec,
                      optimizer=OptimizerSpec(optimizer, weight_decay=weight_decay), plan=plan, targets=spec_targets,
                      xnnpack=xnnpack, default_lr=lr,
                      options=StepOptions(loss_chunk=loss_chunk or seq_len, vocab_chunk=vocab_chunk, mlp_chunk=mlp_chunk),
                      **tokenizer, generation=generation)
    t0 = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("export", total=None)
        manifest = export_program(arch, weights, cfg, lora, spec, out,
                                  on_stage=lambda s: progress.update(task, description=f"export: {s}"))
    mp = manifest["memory_plan"]
    click.echo(f"exported {model} (T={seq_len}, r={cfg.rank}, {quant}, {len(manifest['methods'])} methods) -> {out}")
    for p in manifest["programs"]:
        arenas = p["planned_arena_bytes"]
        planned = (f"planned arenas {sum(arenas.values()) / 1e6:.1f} MB (largest {max(arenas.values()) / 1e6:.1f})"
                   if arenas else "no planned arena (runtime-managed)")
        click.echo(f"  {p['target']}: {p['bytes'] / 1e6:.1f} MB, {planned}")
    click.echo(f"  weights {mp['weights_bytes'] / 1e6:.1f} MB (one file, memory-mapped), LoRA state "
               f"{mp['lora_state_bytes'] / 1e6:.2f} MB, checkpoints {mp['checkpoint_bytes'] / 1e6:.1f} MB, "
               f"{time.perf_counter() - t0:.1f} s")



def _expected_bytes(weights, quant: str) -> int:
    """A lower bound of the export's size: the weights file (int8 ~1 byte, int4 ~0.5 byte per projection
    weight; the rest float32). The programs hold no weight."""
    total, seen = 0, set()
    for t in _tensors(weights):
        if id(t) in seen:        # tied embeddings: one tensor
            continue
        seen.add(id(t))
        per = 4 if quant == "none" or t.dim() != 2 else (1 if quant == "int8" else 0.5)
        total += int(t.numel() * per)
    return total


def _tensors(obj):
    import dataclasses

    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)
