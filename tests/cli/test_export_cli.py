"""`toolchain export`: bad input is refused before any work — one `Error:` line, exit 2, no output
directory (the exports themselves are tested in tests/export/)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.lcsb import make_plan, write_plan

BASE = ["export", "--model", "tiny", "--init", "random", "--seq-len", "16", "--rank", "2"]


@pytest.mark.parametrize("extra, message", [
    (["--target", "tflite"], "unknown target"),
    (["--seq-len", "100000"], "--seq-len"),
    (["--quant", "int4", "--quant-group", "48"], "does not divide"),
    (["--quant", "int4", "--dequant-chunk-mb", "0"], "--dequant-chunk-mb"),
    (["--lcsb-k", "2", "--plan", "plan.json"], "are exclusive"),
    (["--lcsb-k", "2", "--lcsb-seed", "3"], "--lcsb-seed applies to"),   # the same plan options as `train`
    (["--lcsb-policy", "strided"], "needs k"),
    (["--lcsb-warmup", "2"], "full backprop has no warm-up"),
    (["--lcsb-k", "2", "--lcsb-warmup", "-1"], "--lcsb-warmup"),
    (["--loss-chunk", "0"], "--loss-chunk"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    write_plan(tmp_path / "plan.json", make_plan(8, 2, "cyclic"))
    out = tmp_path / "prog"
    result = CliRunner().invoke(cli, BASE + extra + ["--out", str(out)])  # a repeated option: the last wins
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.count("Error:") == 1
    assert not out.exists()
    assert not any(p.name.startswith(".prog.") for p in tmp_path.iterdir())


def test_sigterm_mid_export_leaves_nothing(tmp_path):
    """A terminated export (Ctrl-C's cousin, what a CI timeout or `kill` sends) removes its temporary
    directory: neither the output nor a hidden half-written sibling is left."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "prog"
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", *BASE, "--target", "onnx", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the signal must arrive while the temporary directory exists: wait for it (a loaded CI host can take minutes
    # to import torch and build the model), never signal at an unknown moment of start-up
    deadline = time.monotonic() + 600
    seen = False
    while time.monotonic() < deadline and proc.poll() is None and not seen:
        seen = any(p.name.startswith(".prog.") for p in tmp_path.iterdir())
        if not seen:
            time.sleep(0.05)
    if not seen:
        proc.kill()
    assert seen, "the export's temporary directory was not seen (it ended first, or took over 600 s to start)"
    assert proc.poll() is None, "the export ended before it could be signalled"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
