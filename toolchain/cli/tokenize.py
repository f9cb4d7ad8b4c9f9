"""`toolchain tokenize`: the token ids of a text file."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("tokenize")
@click.option("--tokenizer", "source", required=True,
              help="qwen2.5, byte, a program directory (its tokenizer.json) or a Hugging Face model directory.")
@click.option("--special/--no-special", default=True, show_default=True,
              help="Read special-token text (<|im_start|>, <|endoftext|>, ...) as those tokens, or as plain text.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='Write {"ids": [...], "tokens": n} here (atomically) instead of printing the ids.')
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def tokenize(source, special, json_out, file) -> None:
    """Print the token ids of FILE (UTF-8 text), space-separated, on one line."""
    from toolchain.schemas import dumps
    from toolchain.atomic import atomic_write_text
    from toolchain.text_data import read_text
    from toolchain.tokenizer import load_tokenizer

    text = read_text(file)
    ids = load_tokenizer(source).encode(text, allow_special=special)
    if json_out is None:
        click.echo(" ".join(map(str, ids)))
    else:
        atomic_write_text(json_out, dumps({"ids": ids, "tokens": len(ids)}))
        click.echo(f"{len(ids)} tokens -> {json_out}", err=True)
