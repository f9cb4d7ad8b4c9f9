"""`toolchain demo`: exports the bundled pretrained `demo` model (with the generation methods),
then on the ExecuTorch runtime: held-out loss and greedy generation before, personalization on the bundled
user text, held-out loss and generation after. Reduced here (a few steps, a short generation); the export
is the bulk of the time."""

from __future__ import annotations

import json
import math
import re

from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.demo import USER_HELD_OUT, USER_TEXT, sparkline
from toolchain.models import load_model


def test_demo_personalizes(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(cli, ["demo", "--steps", "6", "--eval-every", "3", "--max-new-tokens", "12",
                                      "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    before = float(re.search(r"BEFORE  held-out loss (\S+)", text).group(1))
    after = float(re.search(r"AFTER   held-out loss (\S+)", text).group(1))
    assert math.isfinite(before) and after < before          # personalization lowered the held-out loss
    assert before < 3.0                                      # pretrained: far below uniform over bytes, ln 264 = 5.58
    gens = re.findall(r"^    \| (.*)$", text, flags=re.M)
    assert len(gens) >= 2 and all(g.startswith("Thursday. Wind from the") and len(g) > len("Thursday. Wind from the")
                                  for g in (gens[0], gens[-1]))  # generation produced tokens, before and after
    assert "executorch" in text and "held-out loss  step 0:" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["source"] == "demo" and manifest["tokenizer"]["kind"] == "byte"
    assert (tmp_path / "demo.rows.jsonl").is_file() and (tmp_path / "demo.telemetry.jsonl").is_file()


def test_demo_assets():
    arch, weights = load_model("demo")                      # the bundled checkpoint directory
    assert (arch.hidden, arch.layers, arch.vocab) == (256, 4, 264) and weights.tied
    assert 5_000 <= len(USER_TEXT.read_bytes()) <= 20_000 and USER_HELD_OUT.stat().st_size > 500
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁" and sparkline([]) == ""


def test_demo_rejects_zero_steps():
    result = CliRunner().invoke(cli, ["demo", "--steps", "0"])
    assert result.exit_code == 2 and "Error" in result.stderr
