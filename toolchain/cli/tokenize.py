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
    from toolchain.atomic import atomic_write_chunks, check_output_file
    from toolchain.cli.progress import file_progress
    from toolchain.contract import MANIFEST_NAME, read_text_fields
    from toolchain.text.encode_stream import encode_stream, ids_json, spelling, text_blocks
    from toolchain.text.tokenizer_source import load_tokenizer

    if json_out is not None:
        check_output_file(json_out, option="--json")
    if Path(source).is_dir() and (Path(source) / MANIFEST_NAME).is_file():
        read_text_fields(Path(source))    # a program's manifest is checked before its tokenizer is followed
    tokenizer = load_tokenizer(source)
    with file_progress(file, "tokenizing") as on_bytes:       # a stream: bounded memory, a bar on long inputs
        chunks = encode_stream(tokenizer, text_blocks(file, on_bytes=on_bytes), allow_special=special)
        if json_out is None:
            first, spell = True, spelling(tokenizer.vocab_size)
            for ids in chunks:
                if ids:
                    click.echo(("" if first else " ") + " ".join(map(spell, ids)), nl=False)
                    first = False
            click.echo("")
        else:
            count: list[int] = []
            atomic_write_chunks(json_out, ids_json(chunks, count, tokenizer.vocab_size))
            click.echo(f"{count[0]} tokens -> {json_out}", err=True)
