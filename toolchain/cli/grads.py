"""`toolchain grads`: LoRA gradients of one example, by MeSP or a baseline."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import data_option, lora_options, model_options


@click.command()
@model_options(default_model=None)
@lora_options
@data_option
@click.option("--mode", type=click.Choice(["mesp", "mebp", "autograd", "mezo"]), default="mesp", show_default=True,
              help="How to compute the gradients (mesp, mebp, autograd: exact, they differ in memory and time; "
                   "mezo: one SPSA estimate from two forwards, perturbation seed --seed).")
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=Path), required=True,
              help="Output .safetensors; keys as in the adapter's adapter_model.safetensors (an existing file is "
                   "replaced atomically; a directory is refused).")
def grads(*, model, init, seed, adapter, rank, alpha, targets, data, mode, out) -> None:
    """Compute the LoRA gradients of the first example of --data and write them to --out."""
    from safetensors.torch import save as save_bytes

    from toolchain.atomic import atomic_write_bytes, check_output_file
    from toolchain.baselines import gradient_step
    from toolchain.text.dataset import load_examples
    from toolchain.lora import lora_state_dict
    from toolchain.lora.resolve import load_model_and_adapter

    check_output_file(out)
    arch, weights, cfg, lora = load_model_and_adapter(model, init=init, seed=seed, adapter=adapter, rank=rank,
                                                      alpha=alpha, targets=targets)
    example = load_examples(data, arch, limit=1)[0]
    result = gradient_step(arch, weights, cfg, lora, example.input_ids, example.labels, mode=mode, seed=seed)
    tensors = {k: v.detach().contiguous() for k, v in lora_state_dict(result.grads).items()}
    atomic_write_bytes(out, save_bytes(tensors, metadata={"loss": f"{float(result.loss):.9g}", "mode": mode}))
    click.echo(f"loss {float(result.loss):.6f}  {len(tensors)} gradient tensors ({mode}) -> {out}")
