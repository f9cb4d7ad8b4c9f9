"""`toolchain eval --program DIR --data held.jsonl`: held-out loss on the program's own methods."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import program_state_options, runtime_options, verbose_requested

__all__ = ["eval_command"]


@click.command("eval")
@click.option("--program", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="An exported program directory (`toolchain export`).")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="Held-out rows (JSONL, shared_schemas/data_row.schema.json), e.g. from `toolchain data --held-out`.")
@program_state_options
@runtime_options
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='Also write {"loss", "rows", "tokens", ...} here (atomically).')
def eval_command(*, program, data, adapter, resume_from, target, threads, json_out) -> None:
    """Held-out loss: forward only (embed, block_forward per layer, head_loss) on the program's runtime.

    The loss is the mean next-token cross-entropy over all target tokens of the file (every row's
    targets pooled, labels shifted by one, -100 ignored); rows without a target are skipped."""
    import time

    from toolchain.atomic import atomic_write_text
    from toolchain.schemas import dumps
    from toolchain.training.session import TrainingSession

    session = TrainingSession(program, target=target, threads=threads, use="eval", verbose=verbose_requested())
    examples = session.examples(data)
    session.load_state(adapter=adapter, resume_from=resume_from)
    backend = session.open_runtime().backend
    t0 = time.perf_counter()
    result = session.evaluate(examples)
    result = {**result, "backend": backend, "program": str(program), "data": str(data),
              "adapter": None if adapter is None else str(adapter),
              "resume_from": None if resume_from is None else str(resume_from),
              "seconds": round(time.perf_counter() - t0, 3)}
    click.echo(f"eval loss {result['loss']:.6f} over {result['tokens']} target tokens in {result['rows']} rows "
               f"({backend}, {result['seconds']:.1f} s)"
               + (f"; {result['skipped_rows']} rows without a target skipped" if result["skipped_rows"] else ""))
    if json_out is not None:
        atomic_write_text(json_out, dumps(result))
