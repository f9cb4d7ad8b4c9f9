"""`toolchain generate --program DIR`: text from the program's generation methods, with an adapter."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import program_state_options, runtime_options, verbose_requested
from toolchain.validate import SEED

__all__ = ["generate_command"]


@click.command("generate")
@click.option("--program", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="An exported program directory with the generation methods (`toolchain export`, the default).")
@program_state_options
@click.option("--prompt", default=None, help="Prompt text (tokenized with the program's tokenizer).")
@click.option("--prompt-ids", "prompt_ids", default=None, help="Prompt as comma-separated token ids (no tokenizer).")
@click.option("--chat", is_flag=True,
              help="--prompt is a user turn: wrap it in the Qwen chat template and add the assistant header; "
                   "stop at <|im_end|>.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), required=True, help="New tokens at most.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0: greedy (argmax); > 0: sample softmax(logits / T).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Sampling seed (with --temperature > 0).")
@runtime_options
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='Also write {"prompt_ids", "output_ids", "text", "load_s", "prefill_s", "ttft_s", '
                   '"decode_tokens_per_s", ...} here (atomically).')
def generate_command(*, program, adapter, resume_from, prompt, prompt_ids, chat, max_new_tokens, temperature, seed, target,
                     threads, json_out) -> None:
    """Generate with the program's generation methods (the prompt in prefill chunks, then one block_decode
    per layer and token, KV cache on the host) on its runtime, the adapter's LoRA slices passed as inputs.
    int4 programs on ExecuTorch run the fused methods (the native int4 kernel, built on first use with g++)
    when it builds here, else the stock ones. Streams the text (or, without a tokenizer, the ids) to stdout
    as tokens come; stops at eos or --max-new-tokens. One line of timings goes to stderr: load (program
    directory, state, runtime), prefill, time to first token, decode tokens/s."""
    import sys
    import time

    from toolchain.atomic import atomic_write_text
    from toolchain.schemas import dumps
    from toolchain.text.decode_stream import IncrementalTextDecoder
    from toolchain.training.session import TrainingSession

    t_load = time.perf_counter()
    session = TrainingSession(program, target=target, threads=threads, use="generate", verbose=verbose_requested())
    tok, ids, stop = session.prompt(text=prompt, ids=prompt_ids, chat=chat)
    session.load_state(adapter=adapter, resume_from=resume_from)
    runtime = session.open_runtime()
    load_s = time.perf_counter() - t_load
    if getattr(runtime, "fused_unavailable", None):
        click.echo(f"note: the int4 generation kernel is unavailable ({runtime.fused_unavailable.splitlines()[0]}); "
                   f"using the stock methods (slower)", err=True)
    decoder = IncrementalTextDecoder(tok) if tok is not None else None
    out_ids: list[int] = []

    def on_token(token: int) -> None:
        out_ids.append(token)
        if decoder is None:
            sys.stdout.write(("" if len(out_ids) == 1 else " ") + str(token))
        else:
            sys.stdout.write(decoder.push(token).text)
        sys.stdout.flush()

    t0 = time.perf_counter()
    res = session.generate(ids, max_new_tokens, temperature=temperature, seed=seed, stop_ids=stop, on_token=on_token)
    seconds = time.perf_counter() - t0
    text = None
    if decoder is not None:
        sys.stdout.write(decoder.finish())
        text = tok.decode(res.output_ids)
    sys.stdout.write("\n")
    sys.stdout.flush()
    decode_tps = res.decode_tokens_per_s
    kernel_path = None
    if res.fused:
        from toolchain.native import kernel_path as _kernel_path

        kernel_path = _kernel_path()
    kernel = f", kernels: {kernel_path}" if kernel_path else ", XNNPACK variant" if res.variant == "xnnpack" else ""
    click.echo(f"{len(res.output_ids)} tokens ({res.stopped}) | load {load_s:.2f} s | prefill {res.prefill_s:.3f} s "
               f"({len(ids)} tokens) | first token {res.ttft_s:.3f} s | decode "
               + (f"{decode_tps:.1f} tokens/s" if decode_tps else "-") + f" ({runtime.backend}{kernel})", err=True)
    if json_out is not None:
        atomic_write_text(json_out, dumps({
            "prompt_ids": res.prompt_ids, "output_ids": res.output_ids, "text": text, "stopped": res.stopped,
            "backend": runtime.backend, "kernel_path": kernel_path, "temperature": temperature, "seed": seed if temperature > 0 else None,
            "load_s": round(load_s, 6), **res.timings(), "seconds": round(seconds, 6)}))
