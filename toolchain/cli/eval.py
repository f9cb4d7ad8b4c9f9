"""`toolchain eval --program DIR --data held.jsonl`: held-out loss on the program's own methods."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["eval_command", "adapter_options", "program_state"]


def adapter_options(f):
    f = click.option("--resume-from", "resume_from", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None, help="Use the LoRA state of this `toolchain train --program` checkpoint "
                                        "(*.train-checkpoint.safetensors), e.g. of a run still going.")(f)
    f = click.option("--adapter", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
                     help="Use this PEFT adapter directory (its config must match the program's); "
                          "default: the program's initial adapter.")(f)
    return f


def program_state(pdir, adapter: Path | None, resume_from: Path | None):
    """The flat state to run with: an adapter's, a checkpoint's, or the program's initial one."""
    from toolchain.errors import BadInput
    from toolchain.runtime.evaluate import state_from_adapter, state_from_checkpoint

    if adapter is not None and resume_from is not None:
        raise BadInput("give either --adapter or --resume-from, not both")
    if adapter is not None:
        return state_from_adapter(pdir, adapter)
    if resume_from is not None:
        return state_from_checkpoint(pdir, resume_from)
    return pdir.state_init()


def target_option(f):
    return click.option("--target", "target", type=click.Choice(["executorch", "onnx", "eager"]), default=None,
                        help="Runtime (default: the program's first host-runnable target; eager: the same methods "
                             "in PyTorch, the reference).")(f)


@click.command("eval")
@click.option("--program", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="An exported program directory (`toolchain export`).")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="Held-out rows (JSONL, shared_schemas/data_row.schema.json), e.g. from `toolchain data --held-out`.")
@adapter_options
@target_option
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Runtime threads (default: its own).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='Also write {"loss", "rows", "tokens", ...} here (atomically).')
def eval_command(program, data, adapter, resume_from, target, threads, json_out) -> None:
    """Held-out loss: forward only (embed, block_forward per layer, head_loss) on the program's runtime.

    The loss is the mean next-token cross-entropy over all target tokens of the file (every row's
    targets pooled, labels shifted by one, -100 ignored); rows without a target are skipped."""
    import time

    from toolchain.atomic import atomic_write_text
    from toolchain.dataset import load_examples
    from toolchain.runtime import ProgramDir
    from toolchain.runtime.evaluate import evaluate_program
    from toolchain.runtime.runners import open_runner
    from toolchain.schemas import dumps

    pdir = ProgramDir(program)
    examples = load_examples(data, pdir.arch)
    state = program_state(pdir, adapter, resume_from)
    runner = open_runner(pdir, target, threads=threads, use="eval")
    t0 = time.perf_counter()
    result = evaluate_program(pdir, runner, state, examples)
    result = {**result, "backend": runner.backend, "program": str(program), "data": str(data),
              "adapter": None if adapter is None else str(adapter),
              "resume_from": None if resume_from is None else str(resume_from),
              "seconds": round(time.perf_counter() - t0, 3)}
    click.echo(f"eval loss {result['loss']:.6f} over {result['tokens']} target tokens in {result['rows']} rows "
               f"({runner.backend}, {result['seconds']:.1f} s)"
               + (f"; {result['skipped_rows']} rows without a target skipped" if result["skipped_rows"] else ""))
    if json_out is not None:
        atomic_write_text(json_out, dumps(result))
