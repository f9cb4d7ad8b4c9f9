"""The one rule for outputs that are symbolic links (toolchain/outputs.py `output_target`), for every kind of output
option: the link is written through and kept. (Its refusals, a loop and a link to an open descriptor, are rows of
cases.py.) And the small items of issue 45 that are not refusals: --help text, no stray newline on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cases import ROWS
from click.testing import CliRunner

from toolchain.cli import cli

TEXT = "hello links"


def _run(argv: list[str]):
    result = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _data(tmp_path: Path) -> str:
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return "d.jsonl"


def _tokenize(tmp_path: Path, out: str) -> list[str]:
    (tmp_path / "t.txt").write_text(TEXT)
    return ["tokenize", "--tokenizer", "byte", "--json", out, "t.txt"]


def _plan(tmp_path: Path, out: str) -> list[str]:
    return ["plan", "lcsb", "--layers", "8", "--k", "2", "--out", out]


def _grads(tmp_path: Path, out: str) -> list[str]:
    return ["grads", "--model", "tiny", "--init", "random", "--data", _data(tmp_path), "--out", out]


def _telemetry(tmp_path: Path, out: str) -> list[str]:
    return ["train", "--model", "tiny", "--init", "random", "--steps", "1", "--data", _data(tmp_path),
            "--telemetry-out", out]


def _check_json(target: Path) -> None:
    assert json.loads(target.read_text())


def _check_safetensors(target: Path) -> None:
    from safetensors.torch import load_file

    assert load_file(str(target))


def _check_appended(target: Path) -> None:
    lines = target.read_text().splitlines()
    assert lines[0] == "old line" and len(lines) > 1 and json.loads(lines[-1])["type"] == "run_end"


WRITERS = [("tokenize --json", _tokenize, _check_json, False), ("plan lcsb --out", _plan, _check_json, False),
           ("grads --out", _grads, _check_safetensors, False),
           ("train --telemetry-out", _telemetry, _check_appended, True)]


@pytest.mark.parametrize(("name", "argv", "check", "appends"), WRITERS, ids=[w[0] for w in WRITERS])
@pytest.mark.parametrize("target_exists", [True, False], ids=["link-to-file", "dangling-link"])
def test_an_output_link_is_written_through_and_kept(tmp_path, monkeypatch, name, argv, check, appends,
                                                    target_exists):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "target.out"
    if target_exists:
        target.write_text("old line\n")
    elif appends:
        pytest.skip("appending to a dangling link creates its target: the same as the file case")
    (tmp_path / "link.out").symlink_to("real/target.out")
    _run(argv(tmp_path, "link.out"))
    assert (tmp_path / "link.out").is_symlink() and os.readlink(tmp_path / "link.out") == "real/target.out"
    check(target)
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["target.out"]   # no temporary left


def test_a_link_to_a_directory_output_replaces_the_target_and_keeps_the_link(tmp_path):
    """Directory outputs (`telemetry report --out`, `export --out`, `--adapter-out`) go through `atomic_dir`."""
    from toolchain.atomic import atomic_dir

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    with atomic_dir(tmp_path / "link") as tmp:
        (tmp / "new.txt").write_text("new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "new.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


@pytest.mark.parametrize("command", ["train", "grads", "export", "eval"])
def test_help_names_every_family_for_model(command):
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    if "--model" in text:
        assert "Qwen2 checkpoint" not in text
        assert "qwen3" in text and "llama" in text, text


def test_no_progress_output_on_a_non_tty_stderr(tmp_path):
    """rich's transient bar wrote a newline to a non-terminal stderr when it cleared (export, train)."""
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLCHAIN_VERBOSE",)}
    proc = subprocess.run([sys.executable, "-m", "toolchain", "train", "--model", "tiny", "--init", "random",
                           "--steps", "2", "--data", "d.jsonl"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", repr(proc.stderr)
