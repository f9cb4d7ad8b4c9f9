"""`toolchain grads`: LoRA gradients of one example, by MeSP or a baseline."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import data_option, lora_options, model_options
from toolchain.validate import FiniteFloat

BETA = FiniteFloat(min=0, min_open=True)


@click.command()
@model_options(default_model=None)
@lora_options
@data_option
@click.option("--mode", type=click.Choice(["mesp", "mebp", "autograd", "mezo"]), default="mesp", show_default=True,
              help="How to compute the gradients (mesp, mebp, autograd: exact, they differ in memory and time; "
                   "mezo: one SPSA estimate from two forwards, perturbation seed --seed).")
@click.option("--objective", type=click.Choice(["sft", "dpo"]), default="sft", show_default=True,
              help="sft: mean next-token cross-entropy of the first row of --data; dpo: the DPO loss of the first "
                   "preference pair of --data (schema preference_pair; the reference log-probs from the pair, else "
                   "computed with the adapter disabled), by MeSP.")
@click.option("--beta", type=BETA, default=None, help="DPO temperature (> 0; --objective dpo).  [default: 0.1]")
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=Path), required=True,
              help="Output .safetensors; keys as in the adapter's adapter_model.safetensors (an existing file is "
                   "replaced atomically; a directory is refused).")
def grads(*, model, init, seed, adapter, rank, alpha, targets, data, mode, objective, beta, out) -> None:
    """Compute the LoRA gradients of the first example of --data and write them to --out."""
    from safetensors.torch import save as save_bytes

    from toolchain.atomic import atomic_write_bytes, check_output_file
    from toolchain.baselines import gradient_step
    from toolchain.text.dataset import load_examples
    from toolchain.lora import lora_state_dict
    from toolchain.lora.resolve import load_model_and_adapter

    from toolchain.errors import BadInput

    check_output_file(out)
    if objective == "sft" and beta is not None:
        raise BadInput("--beta is the DPO temperature; it goes with --objective dpo")
    if objective == "dpo" and mode != "mesp":
        raise BadInput(f"--objective dpo computes its gradients by MeSP; drop --mode {mode}")
    arch, weights, cfg, lora = load_model_and_adapter(model, init=init, seed=seed, adapter=adapter, rank=rank,
                                                      alpha=alpha, targets=targets)
    if objective == "dpo":
        from toolchain.mesp.dpo import dpo_step, pair_rows, reference_logps
        from toolchain.text.feedback import read_pairs

        beta = 0.1 if beta is None else beta
        pair = read_pairs(data, arch.vocab, arch.max_positions, limit=1)[0]
        chosen, rejected = pair_rows(pair["prompt_ids"], pair["chosen_ids"], pair["rejected_ids"])
        ref = ((pair["ref_chosen_logp"], pair["ref_rejected_logp"]) if "ref_chosen_logp" in pair
               else reference_logps(arch, weights, cfg, lora, chosen, rejected))
        res = dpo_step(arch, weights, cfg, lora, chosen, rejected, ref, beta=beta)
        tensors = {k: v.detach().contiguous() for k, v in lora_state_dict(res.grads).items()}
        atomic_write_bytes(out, save_bytes(tensors, metadata={
            "loss": f"{float(res.loss):.9g}", "mode": "mesp", "objective": "dpo", "beta": repr(beta),
            "margin": f"{float(res.margin):.9g}"}))
        click.echo(f"dpo loss {float(res.loss):.6f} (margin {float(res.margin):.6f}, beta {beta:g})  "
                   f"{len(tensors)} gradient tensors (mesp) -> {out}")
        return
    example = load_examples(data, arch, limit=1)[0]
    result = gradient_step(arch, weights, cfg, lora, example.input_ids, example.labels, mode=mode, seed=seed)
    tensors = {k: v.detach().contiguous() for k, v in lora_state_dict(result.grads).items()}
    atomic_write_bytes(out, save_bytes(tensors, metadata={"loss": f"{float(result.loss):.9g}", "mode": mode}))
    click.echo(f"loss {float(result.loss):.6f}  {len(tensors)} gradient tensors ({mode}) -> {out}")
