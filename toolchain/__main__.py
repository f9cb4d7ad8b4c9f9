from toolchain.cli import cli

cli()
