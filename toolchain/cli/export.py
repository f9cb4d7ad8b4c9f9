"""`toolchain export`: the training program phones run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from toolchain.cli.options import (INT8_MLP_CHUNK, chunk_options, force_option, lora_options, model_options,
                                   optimizer_options, plan_options, plan_request)
from toolchain.validate import FiniteFloat


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
@plan_options("full backprop")
@optimizer_options("sgd", momentum=False)
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Default learning rate recorded in the manifest (apps pass lr every step).  [default: measured, "
                   "per optimizer: sgd 1e-1, adamw 3e-3 (toolchain/export/app_defaults.py)]")
@click.option("--steps", "default_steps", type=click.IntRange(min=1), default=None,
              help="Steps of a run recorded in the manifest for the apps and `train --program` when the user gives "
                   "none.  [default: 200 (toolchain/export/app_defaults.py)]")
@click.option("--target", "export_targets", default="executorch", show_default=True,
              help="Comma-separated runtimes: executorch, onnx, coreml (one manifest describes all).")
@click.option("--xnnpack/--no-xnnpack", default=True, show_default=True,
              help="ExecuTorch: delegate the matmuls to XNNPACK (weights stay memory-mapped inputs; packed per call "
                   "into one shared workspace). --no-xnnpack: ExecuTorch's own kernels (slower, no workspace).")
@chunk_options(loss_chunk_default="--seq-len, one chunk: the head's graph, hence the export time, does not grow "
                                  "with the sequence length",
               mlp_chunk_default=f"256; {INT8_MLP_CHUNK} with --compute int8, whose kernels run fewer, larger calls "
                                 "at the same peak memory")
@click.option("--generate/--no-generate", "generation", default=True, show_default=True,
              help="Also export the generation methods (chunked prefill, KV-cache decode, one-position LM head) "
                   "that `toolchain generate` and apps run with the live adapter; int4 programs also get their "
                   "fused variants (the native int4 kernel).")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=None,
              help="Prompt tokens per prefill call: a prompt of n tokens costs ceil(n / C) calls.  "
                   "[default: 32, or --seq-len if shorter]")
@click.option("--float-head", is_flag=True,
              help="int4 programs: keep the embedding and LM head float32 (default: int4 like the layers; the head "
                   "is most of the bytes generation reads per token).")
@click.option("--compute", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
              help="Training methods' frozen-weight matmuls: fp32 (exact), fp16 (float16 weight chunks and "
                   "products, float32 LoRA, optimizer and loss; needs --quant int4/int8 and a runtime with float16 "
                   "kernels: phones' ARMv8.2 FP16; on x86 hosts without AVX512-FP16 it is slower, docs/benchmarks.md), "
                   "or int8 (int4 weights x int8 activations, exact integer sums, in the forward, recompute, dX and "
                   "LM head; needs --quant int4, --target executorch and a runtime with the native kernels: "
                   "docs/export.md).")
@click.option("--xnnpack-generation", is_flag=True,
              help="int4 programs: also the XNNPACK generation variant, for runtimes without the native kernels (the "
                   "published Android AAR): per layer a prefill and a decode method holding that layer's weights, "
                   "int8 x int4 on XNNPACK (~20x the stock methods' decode; adds the weights to the .pte and their "
                   "packed copy to memory when generating: docs/export.md).")
@click.option("--preference", is_flag=True,
              help="Also block_backward_pair, the method preference training (DPO, `train --program --objective dpo`) "
                   "calls: two sequences' backward through one layer, one update on their summed gradient.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output directory (written atomically; an existing non-empty one is refused unless --force).")
@force_option
def export(*, model, init, seed, adapter, rank, alpha, targets, seq_len, quant, quant_group, dequant_chunk_mb,
           plan_path, lcsb_k, lcsb_policy, lcsb_seed, lcsb_warmup, optimizer, weight_decay, frozen_unselected, lr,
           export_targets, xnnpack, loss_chunk, vocab_chunk, mlp_chunk, generation, prefill_chunk, float_head, out,
           force, compute, xnnpack_generation, default_steps, preference) -> None:
    """Export the explicit MeSP training step as layer-generic methods (embed, block_forward, head_loss,
    block_backward with the in-program optimizer, block_skip_update) for each --target (ExecuTorch .pte,
    ONNX, Core ML), the frozen weights once in weights.safetensors (memory-mapped by the apps, passed to
    the methods without copying), and one manifest, written atomically to --out. The LCSB
    plan options record the default plan apps run (they may choose other layers at run time)."""
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from toolchain.atomic import check_output_dir
    from toolchain.export.app_defaults import DEFAULT_STEPS, default_lr
    from toolchain.export.build import ExportSpec, export_program, tokenizer_fields
    from toolchain.lora.resolve import resolve_adapter
    from toolchain.mesp import StepOptions, chunk_overrides
    from toolchain.models.load import model_source
    from toolchain.optim import optimizer_config
    from toolchain.program.spec import QuantSpec
    from toolchain.program.weights_file import weights_file_size

    plan = plan_request(plan_path, lcsb_k, lcsb_policy, lcsb_seed, lcsb_warmup)
    opt = optimizer_config(optimizer, weight_decay=weight_decay, frozen_unselected=frozen_unselected)  # lr: a step input
    if mlp_chunk is None and compute == "int8":
        mlp_chunk = INT8_MLP_CHUNK
    options = StepOptions(**{"loss_chunk": seq_len, **chunk_overrides(loss_chunk=loss_chunk, vocab_chunk=vocab_chunk,
                                                                      mlp_chunk=mlp_chunk)})
    if prefill_chunk is None:
        prefill_chunk = min(32, seq_len)
    elif prefill_chunk > seq_len:
        raise click.BadParameter(f"{prefill_chunk} is longer than --seq-len {seq_len}", param_hint="--prefill-chunk")
    if float_head and quant != "int4":
        raise click.BadParameter("applies to --quant int4 only (int8 and none keep a float32 head)",
                                 param_hint="--float-head")
    check_output_dir(out, force=force)                   # before reading anything
    arch, source = model_source(model, init=init, seed=seed)   # checked, not loaded: export streams it
    cfg, lora = resolve_adapter(arch, seed=seed, adapter=adapter, rank=rank, alpha=alpha, targets=targets)
    quant_spec = QuantSpec(quant, quant_group, chunk_elems=max(1, int(dequant_chunk_mb * 2**20) // 4),  # float32
                           head=not float_head)
    quant_spec.check(arch)
    check_output_dir(out, force=force, expected_bytes=weights_file_size(arch, quant_spec))
    spec = ExportSpec(source=model, init=init, seed=seed, seq_len=seq_len, quant=quant_spec, optimizer=opt,
                      plan=plan.resolve_lcsb(arch.layers), options=options, generation=generation,
                      default_lr=default_lr(opt.kind) if lr is None else lr,
                      default_steps=DEFAULT_STEPS if default_steps is None else default_steps,
                      prefill_chunk=prefill_chunk, targets=tuple(t.strip() for t in export_targets.split(",") if t.strip()), xnnpack=xnnpack,
                      compute=compute, xnnpack_generation=xnnpack_generation, preference=preference,
                      **tokenizer_fields(model, arch.vocab, arch.family))
    t0 = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as progress:   # off the terminal it left a stray newline
        weights_task = progress.add_task("export: write weights", total=None)
        task = progress.add_task("export", total=None, visible=False)

        def on_tensor(name: str, done: int, total: int) -> None:
            progress.update(weights_task, completed=done, total=total,
                            description=f"export: write weights {done / 1e6:,.0f} / {total / 1e6:,.0f} MB ({name})")

        def on_stage(stage: str) -> None:
            if stage != "write weights":
                progress.update(weights_task, visible=False)
                progress.update(task, visible=True, description=f"export: {stage}")

        manifest = export_program(arch, source, cfg, lora, spec, out, on_stage=on_stage, on_tensor=on_tensor,
                                  replace=force)
    mp = manifest.memory_plan
    click.echo(f"exported {model} (T={seq_len}, r={cfg.rank}, {quant}, {len(manifest.methods)} methods) -> {out}")
    for p in manifest.programs:
        arenas = p.planned_arena_bytes
        planned = (f"planned arenas {sum(arenas.values()) / 1e6:.1f} MB (largest {max(arenas.values()) / 1e6:.1f})"
                   if arenas else "no planned arena (runtime-managed)")
        click.echo(f"  {p.target}: {p.bytes / 1e6:.1f} MB, {planned}")
    click.echo(f"  weights {mp.weights_bytes / 1e6:.1f} MB (one file, memory-mapped), LoRA state "
               f"{mp.lora_state_bytes / 1e6:.2f} MB, checkpoints {mp.checkpoint_bytes / 1e6:.1f} MB, "
               f"{time.perf_counter() - t0:.1f} s")
