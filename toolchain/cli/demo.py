"""`toolchain demo`: the quick-start job on the embedded tiny preset (no downloads)."""

from __future__ import annotations

import click


@click.command()
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True, help="Training steps.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-3, show_default=True,
              help="SGD learning rate.")
def demo(steps: int, lr: float) -> None:
    """Train the tiny preset (random init) with MeSP + SGD on the bundled corpus; print the loss."""
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from toolchain.dataset import ByteTokenizer, bundled_examples
    from toolchain.lora import LoraConfig, LoraPair, init_lora
    from toolchain.mesp import mesp_step
    from toolchain.models import get_preset, random_weights

    arch = get_preset("tiny")
    weights = random_weights(arch, seed=0)
    cfg = LoraConfig(rank=8, alpha=16)
    lora = [dict(layer) for layer in init_lora(arch, cfg, seed=0)]
    examples = bundled_examples(ByteTokenizer(), seq_len=128)
    losses = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("MeSP steps (tiny)", total=steps)
        for i in range(steps):
            ex = examples[i % len(examples)]

            def sgd(layer: int, g: dict) -> None:  # update this layer as soon as its grads exist
                lora[layer] = {t: LoraPair(p.a - lr * g[t].a, p.b - lr * g[t].b) for t, p in lora[layer].items()}

            with torch.no_grad():
                res = mesp_step(arch, weights, tuple(lora), cfg, ex.input_ids, ex.labels, on_layer_grads=sgd)
            losses.append(float(res.loss))
            progress.update(task, advance=1, description=f"MeSP steps (tiny) loss {losses[-1]:.3f}")
    for i, loss in enumerate(losses):
        click.echo(f"step {i + 1:3d}  loss {loss:.4f}")
