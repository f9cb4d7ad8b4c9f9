"""The shared option families (toolchain/cli/options.py): one spelling, type and help text in every
command, defaults that match the library's, and library errors at the boundary as one `Error:` line."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.cli.options import _CHUNK_DEFAULTS

FAMILIES = {   # option -> the commands that take it
    "--lcsb-k": ["train", "export", "demo", "plan fit"],
    "--plan": ["train", "export"], "--lcsb-policy": ["train", "export"], "--lcsb-seed": ["train", "export"],
    "--lcsb-warmup": ["train", "export"],
    "--optimizer": ["train", "export", "plan fit"], "--weight-decay": ["train", "export"],
    "--frozen-unselected": ["train", "export"],
    "--loss-chunk": ["export", "plan fit", "bench memory", "bench tables"],
    "--vocab-chunk": ["export", "plan fit", "bench memory", "bench tables"],
    "--mlp-chunk": ["export", "plan fit", "bench memory", "bench tables"],
    "--model": ["train", "export", "grads", "bench memory", "bench mezo-cosine"],
    "--rank": ["train", "export", "grads", "bench memory", "bench mezo-cosine", "plan fit"],
    "--targets": ["train", "export", "grads", "bench memory", "bench mezo-cosine", "plan fit"],
    "--adapter": ["train", "export", "grads", "eval", "generate"],
    "--threads": ["demo", "eval", "generate"],
    "--layers-per-checkpoint": ["train", "plan fit", "bench memory"],
}


def _command(path: str) -> click.Command:
    command = cli
    for name in path.split():
        command = command.commands[name]
    return command


def _option(path: str, flag: str) -> click.Option:
    return next(p for p in _command(path).params if flag in p.opts)


def _meaning(help_text: str) -> str:
    return help_text.split("  [default:")[0].split(" [default:")[0]


@pytest.mark.parametrize("flag", sorted(FAMILIES))
def test_a_family_has_one_type_and_one_meaning_everywhere(flag):
    options = [_option(path, flag) for path in FAMILIES[flag]]
    types = {repr(o.type.to_info_dict()) for o in options}
    assert len(types) == 1, types
    meanings = {_meaning(o.help or "") for o in options}
    # --adapter: a fresh run's starting adapter (train, export, grads) vs the state a program runs with
    assert len(meanings) == (2 if flag == "--adapter" else 1), meanings


def test_chunk_help_defaults_are_step_options_defaults():
    from dataclasses import asdict

    from toolchain.mesp import StepOptions

    assert _CHUNK_DEFAULTS == asdict(StepOptions())


def test_a_bad_step_options_from_a_command_is_one_error_line_and_exit_2(monkeypatch):
    """StepOptions raises BadInput (a ToolchainError), which the root group turns into `Error: ...`, exit 2;
    the option families validate by type first, so this command takes a raw int to reach StepOptions."""
    @click.command("bad-step")
    @click.option("--loss-chunk", type=int)
    def bad_step(loss_chunk):
        from toolchain.mesp import StepOptions

        StepOptions(loss_chunk=loss_chunk)

    monkeypatch.setitem(cli.commands, "bad-step", bad_step)
    result = CliRunner().invoke(cli, ["bad-step", "--loss-chunk", "0"])
    assert result.exit_code == 2, result.output
    assert result.output == "Error: `loss_chunk` must be >= 1, got 0\n"
    assert result.exception is None or isinstance(result.exception, SystemExit)


def _all_params():
    import click

    from toolchain.cli import cli

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            for p in cmd.params:
                yield " ".join(path), p
    yield from walk(cli, [])


def test_every_threads_and_seed_option_is_bounded():
    """--threads is one type everywhere (ExecuTorch aborted on 10^9); every seed fits int64 (10^30 was a
    traceback)."""
    from toolchain.validate import MAX_SEED, THREADS

    threads = [(c, p) for c, p in _all_params() if p.name == "threads"]
    seeds = [(c, p) for c, p in _all_params() if "seed" in p.name and p.name != "seeds"]
    assert len(threads) >= 5 and all(p.type is THREADS for _, p in threads), threads
    assert seeds and all(getattr(p.type, "max", None) is not None and p.type.max <= MAX_SEED
                         and p.type.min is not None and p.type.min >= 0 for _, p in seeds), \
        [(c, p.name, p.type) for c, p in seeds]
