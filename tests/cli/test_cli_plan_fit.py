"""`toolchain plan fit`: the answer in words and in JSON, and bad inputs -> `Error:`, exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolchain.cli import cli
from toolchain.memory.estimate import StepShape, estimate_peak
from toolchain.memory.fit import HOST_OVERHEAD_MB
from toolchain.memory.profiles import load_profile
from toolchain.models import PRESETS


def run(*args):
    return CliRunner().invoke(cli, ["plan", "fit", *map(str, args)])


def test_fits_in_words():
    r = run("--model", "qwen2.5-0.5b", "--seq-len", 256, "--rank", 8, "--device", "android-8gb")
    assert r.exit_code == 0, r.output
    peak = estimate_peak(StepShape(PRESETS["qwen2.5-0.5b"], 256, 8), overhead_mb=HOST_OVERHEAD_MB["mesp"]).peak_mb
    assert f"predicted peak {peak:.1f} MB (analytic" in r.output and "-> FITS" in r.output
    assert "largest seq len that fits at this rank: " in r.output and "hidden_grads" in r.output
    assert "runtime_overhead" in r.output and "calibrated" in r.output


def test_method_and_chunk_options_reach_the_model():
    r = run("--model", "qwen2.5-0.5b", "--seq-len", 256, "--method", "mebp", "--device", "android-8gb", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    mebp = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8, method="mebp")
    assert doc["method"] == "mebp" and doc["phase"] == "loss"
    assert doc["predicted_peak_mb"] == estimate_peak(mebp, overhead_mb=HOST_OVERHEAD_MB["mebp"]).peak_mb
    r = run("--model", "qwen2.5-0.5b", "--seq-len", 256, "--vocab-chunk", 0, "--mlp-chunk", 0, "--loss-chunk", 32,
            "--overhead-mb", 0, "--device", "android-8gb", "--json")
    rows = StepShape(PRESETS["qwen2.5-0.5b"], 256, 8, loss_chunk=32, vocab_chunk=None, mlp_chunk=None)
    assert json.loads(r.output)["predicted_peak_mb"] == estimate_peak(rows).peak_mb


def test_does_not_fit_as_json():
    r = run("--model", "qwen2.5-3b", "--seq-len", 16384, "--rank", 64, "--lcsb-k", 4, "--optimizer", "adamw",
            "--device", "ios-6gb", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["fits"] is False and doc["budget_mb"] == load_profile("ios-6gb").budget_mb
    assert doc["lcsb_k"] == 4 and doc["largest_seq_len"] < 16384 and doc["source"] == "analytic"
    assert doc["predicted_peak_mb"] > doc["budget_mb"] and "optimizer_state" in doc["parts_mb"]


def test_program_without_manifest_and_bad_inputs(tmp_path):
    r = run("--model", "qwen2.5-0.5b", "--seq-len", 256, "--device", "android-8gb", "--program", tmp_path)
    assert r.exit_code == 2 and "Error: " in r.output and "manifest.json does not exist" in r.output
    r = run("--model", "qwen9", "--seq-len", 256, "--device", "android-8gb")
    assert r.exit_code == 2 and "unknown preset 'qwen9'" in r.output
    r = run("--model", "qwen2.5-0.5b", "--seq-len", 256, "--device", "pager")
    assert r.exit_code == 2 and "unknown device profile 'pager'" in r.output
    r = run("--model", "qwen2.5-0.5b", "--seq-len", 0, "--device", "android-8gb")
    assert r.exit_code == 2 and "seq-len" in r.output
    r = run("--model", "tiny", "--seq-len", 16, "--lcsb-k", 99, "--device", "android-8gb")
    assert r.exit_code == 2 and "lcsb_k" in r.output


def test_program_in_words_and_json_and_a_mismatched_program(tmp_path):
    """The example (a real tiny export): the phone figure is the answer, the host figure beside it."""
    from toolchain.memory.fit import EXECUTORCH_OVERHEAD_MB, program_peak
    from toolchain.schemas import SCHEMA_DIR

    (tmp_path / "manifest.json").write_text((SCHEMA_DIR / "examples" / "manifest_tiny.json").read_text())
    r = run("--model", "tiny", "--seq-len", 64, "--rank", 8, "--lcsb-k", 2, "--device", "ios-6gb", "--program", tmp_path,
            "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    expected = program_peak(tmp_path, lcsb_k=2)
    assert doc["source"] == "program" and doc["overhead_mb"] == EXECUTORCH_OVERHEAD_MB and doc["lcsb_k"] == 2
    assert doc["predicted_peak_mb"] == pytest.approx(expected.peak_mb)
    assert doc["host_peak_mb"] == pytest.approx(expected.host_peak_mb)
    assert doc["host_peak_mb"] < doc["predicted_peak_mb"]
    assert doc["parts_mb"]["checkpoints"] == pytest.approx(2 * 64 * 64 * 4 / 2**20)
    r = run("--model", "tiny", "--seq-len", 64, "--rank", 8, "--device", "ios-6gb", "--program", tmp_path)
    assert r.exit_code == 0, r.output
    assert "(program) vs budget" in r.output and "planned_arenas" in r.output
    assert "on this host, one arena shared by the methods" in r.output and "note: phone figure" in r.output
    r = run("--model", "tiny", "--seq-len", 128, "--device", "ios-6gb", "--program", tmp_path)
    assert r.exit_code == 2 and "Error: " in r.output and "exported with seq_len 64 (not 128)" in r.output
    (tmp_path / "manifest.json").write_text((SCHEMA_DIR / "examples" / "invalid" / "manifest_version_2.json").read_text())
    r = run("--model", "tiny", "--seq-len", 64, "--device", "ios-6gb", "--program", tmp_path)
    assert r.exit_code == 2 and "Error: " in r.output and "re-export the program" in r.output


def test_program_supplies_model_seq_len_rank_and_targets(tmp_path):
    """`plan fit --program DIR` needs no --model/--seq-len: the manifest has them; given ones must agree."""
    from toolchain.schemas import SCHEMA_DIR

    (tmp_path / "manifest.json").write_text((SCHEMA_DIR / "examples" / "manifest_tiny.json").read_text())
    bare = run("--device", "ios-6gb", "--program", tmp_path, "--json")
    full = run("--model", "tiny", "--seq-len", 64, "--rank", 8, "--device", "ios-6gb", "--program", tmp_path, "--json")
    assert bare.exit_code == 0 and full.exit_code == 0, bare.output + full.output
    assert json.loads(bare.output) == json.loads(full.output)
    doc = json.loads(bare.output)
    assert (doc["model"], doc["seq_len"], doc["rank"], doc["source"]) == ("tiny", 64, 8, "program")
    words = run("--device", "ios-6gb", "--program", tmp_path)
    assert words.exit_code == 0 and words.output.startswith("tiny, seq 64, rank 8, mesp"), words.output
    for extra, message in ((["--seq-len", 128], "exported with seq_len 64 (not 128)"),
                           (["--rank", 4], "rank 8 (not 4)"),
                           (["--model", "qwen2.5-0.5b"], "hidden 64 (not 896)"),
                           (["--targets", "q_proj"], "targets")):
        r = run("--device", "ios-6gb", "--program", tmp_path, *extra)
        assert r.exit_code == 2, r.output
        assert r.output.count("\n") == 1 and r.output.startswith("Error: ") and message in r.output, r.output
        assert "drop --model/--seq-len/--rank/--targets" in r.output


def test_without_program_model_and_seq_len_are_required():
    for args in ((), ("--model", "tiny"), ("--seq-len", 16)):
        r = run(*args, "--device", "android-8gb")
        assert r.exit_code == 2 and r.output.startswith("Error: ") and "--program" in r.output, r.output


def test_layers_per_checkpoint_reaches_the_model():
    r = run("--model", "qwen2.5-3b", "--seq-len", 1024, "--layers-per-checkpoint", 6, "--overhead-mb", 0,
            "--device", "android-8gb", "--json")
    assert r.exit_code == 0, r.output
    arch = PRESETS["qwen2.5-3b"]
    groups, plain = (estimate_peak(StepShape(arch, 1024, 8, layers_per_checkpoint=s)).peak_mb for s in (6, 1))
    assert json.loads(r.output)["predicted_peak_mb"] == groups
    assert groups < plain - 150   # 11 of 36 [1024, 2048] inputs alive instead of 36
    bad = run("--model", "qwen2.5-3b", "--seq-len", 1024, "--layers-per-checkpoint", 0, "--device", "android-8gb")
    assert bad.exit_code == 2 and "--layers-per-checkpoint" in bad.output
