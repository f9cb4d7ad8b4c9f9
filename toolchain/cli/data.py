"""`toolchain data`: the user's own text (plain or chat) as training rows for a program."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.validate import SEED

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_OUT = click.Path(dir_okay=False, path_type=Path)


@click.command("data")
@click.option("--program", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="Exported program directory: its tokenizer and seq_len.")
@click.option("--text", type=_FILE, default=None, help="Plain UTF-8 text, cut into seq_len windows.")
@click.option("--chat", type=_FILE, default=None,
              help='JSONL, one {"messages": [{"role", "content"}, ...]} per line; loss on assistant tokens only.')
@click.option("--feedback", type=_FILE, default=None,
              help="JSONL of feedback records (schema feedback: prompt|messages, response, action accept|edit|reject): "
                   "SFT rows to --out and preference pairs to --pairs-out (docs/training.md).")
@click.option("--out", type=_OUT, required=True, help="Training rows (JSONL).")
@click.option("--pairs-out", "pairs_out", type=_OUT, default=None,
              help="Preference pairs (JSONL, schema preference_pair) made from --feedback.")
@click.option("--held-out", "held_out", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Fraction of the rows set aside for evaluation (needs --held-out-out).")
@click.option("--held-out-out", "held_out_out", type=_OUT, default=None, help="Held-out rows (JSONL).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the held-out choice.")
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
def data(*, program, text, chat, feedback, out, pairs_out, held_out, held_out_out, seed, force) -> None:
    """Tokenize --text or --chat with the program's tokenizer into rows of at most seq_len tokens
    (schema data_row), optionally holding out a seeded fraction; or turn --feedback into rows and
    preference pairs. Outputs are written atomically, and only when every input line is good."""
    from toolchain.atomic import check_output_file
    from toolchain.contract import read_text_fields
    from toolchain.errors import BadInput
    from toolchain.text.text_data import make_rows, program_text, split_held_out, write_rows

    if sum(x is not None for x in (text, chat, feedback)) != 1:
        raise BadInput("give exactly one of --text FILE, --chat FILE.jsonl and --feedback FILE.jsonl")
    if (feedback is None) != (pairs_out is None):
        raise BadInput("--feedback and --pairs-out go together")
    if feedback is not None and held_out is not None:
        raise BadInput("--held-out is for --text and --chat; split the feedback file itself")
    if (held_out is None) != (held_out_out is None):
        raise BadInput("--held-out and --held-out-out go together")
    outputs = [p for p in (out, held_out_out, pairs_out) if p is not None]
    if len({p.resolve() for p in outputs}) != len(outputs):
        raise BadInput("--out, --held-out-out and --pairs-out must be different files")
    existing = [str(p) for p in outputs if p.exists()]
    if existing and not force:
        raise BadInput(f"{', '.join(existing)} already exists; pass --force to overwrite")
    for p, option in ((out, "--out"), (held_out_out, "--held-out-out"), (pairs_out, "--pairs-out")):
        if p is not None:
            check_output_file(p, option=option)
    read_text_fields(program)              # every path inside the directory, every field typed and in range
    prog = program_text(program)
    if feedback is not None:
        from toolchain.text.feedback import feedback_data, write_pairs

        made = feedback_data(prog, feedback)       # every line checked before anything is written
        write_rows(out, made.rows)
        write_pairs(pairs_out, made.pairs)
        click.echo(f"{made.summary()} (seq_len {prog.seq_len}, {prog.tokenizer.kind}): rows -> {out}, "
                   f"pairs -> {pairs_out}")
        return
    if text is not None and chat is None:  # a stream: bounded memory, a bar on long inputs
        from toolchain.cli.progress import file_progress
        from toolchain.text.text_data import write_text_rows

        with file_progress(text, "tokenizing") as on_bytes:
            got = write_text_rows(prog, text, out, held_out=held_out, held_out_out=held_out_out, seed=seed,
                                  on_bytes=on_bytes)
        n_rows, tokens, n_train, n_held = got.rows, got.tokens, got.train, got.held
    else:
        rows = make_rows(prog, text=text, chat=chat)
        train, held = split_held_out(rows, held_out, seed) if held_out is not None else (rows, [])
        write_rows(out, train)
        if held_out_out is not None:
            write_rows(held_out_out, held)
        n_rows, tokens, n_train, n_held = len(rows), sum(len(r["input_ids"]) for r in rows), len(train), len(held)
    click.echo(f"{n_rows} rows ({tokens} tokens, seq_len {prog.seq_len}, {prog.tokenizer.kind}): "
               f"{n_train} -> {out}" + (f", {n_held} -> {held_out_out}" if held_out_out else ""))
