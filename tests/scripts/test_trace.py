"""The shared replay traces (shared_schemas/traces/tiny and tiny_qwen3, format in
shared_schemas/traces/README.md): each is self-consistent, small, covers every method kind, and re-recording
it (scripts/record_trace.py: export + the host's loop on ExecuTorch) gives the same trace, so the traces the
Kotlin and Swift replays check against are what the current toolchain does."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "shared_schemas" / "traces" / "tiny"
QWEN3 = REPO / "shared_schemas" / "traces" / "tiny_qwen3"
SCRIPT = REPO / "scripts" / "record_trace.py"


def _load(d: Path) -> tuple[dict, bytes]:
    return json.loads((d / "trace.json").read_text()), (d / "outputs.bin").read_bytes()


@pytest.mark.parametrize("trace_dir", [TRACE, QWEN3], ids=lambda d: d.name)
def test_committed_trace_is_consistent_and_small(trace_dir):
    trace, blob = _load(trace_dir)
    assert trace["format"] == "toolchain-trace" and trace["format_version"] == 1
    size = sum(f.stat().st_size for f in trace_dir.rglob("*") if f.is_file())
    assert size < 3 * 1024 * 1024
    end = 0
    for c in trace["calls"]:
        for o in c["outputs"]:
            assert o["offset"] == end
            end += o["nbytes"]
            assert hashlib.sha256(blob[o["offset"]:end]).hexdigest() == o["sha256"]
    assert end == len(blob)
    # The program is complete for an app (every listed file but a dropped large .pte, checksums right).
    prog = trace_dir / trace["program"]
    manifest = json.loads((prog / "manifest.json").read_text())
    assert manifest["schema_version"] == 3
    for rel, digest in manifest["files"].items():
        f = prog / rel
        if f.suffix == ".pte" and not f.exists():
            continue
        assert hashlib.sha256(f.read_bytes()).hexdigest() == digest, rel
    assert hashlib.sha256((prog / manifest["state"]["init_file"]).read_bytes()).hexdigest() == \
        trace["initial_state_sha256"]
    # Coverage: full backprop and LCSB (k < L) steps, skip updates, eval and generation, calls partitioned.
    layers = manifest["loop"]["layers"]
    train = [s for s in trace["steps"] if s["kind"] == "train"]
    assert any(len(s["selected"]) == layers for s in train) and any(len(s["selected"]) < layers for s in train)
    assert {s["kind"] for s in trace["steps"]} == {"train", "eval", "generate"}
    # every stock method is called; the fused ones never (recorded as an app without the native kernel runs)
    assert {c["method"] for c in trace["calls"]} == {m["name"] for m in manifest["methods"] if "kernels" not in m}
    assert any("kernels" in m for m in manifest["methods"])
    assert [s["loss"] for s in train] == trace["losses"] and train[-1]["state_sha256"] == trace["final_state_sha256"]
    spans = [tuple(s["calls"]) for s in trace["steps"]]
    assert spans[0][0] == 0 and spans[-1][1] == len(trace["calls"])
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    methods = {m["name"]: m for m in manifest["methods"]}
    for c in trace["calls"]:
        assert [i["name"] for i in c["inputs"]] == [i["name"] for i in methods[c["method"]]["inputs"]]
        assert [o["name"] for o in c["outputs"]] == [o["name"] for o in methods[c["method"]]["outputs"]]


@pytest.mark.parametrize("trace_dir, family", [(TRACE, []), (QWEN3, ["--family", "qwen3"])], ids=["tiny", "tiny_qwen3"])
def test_rerecording_gives_the_same_trace(tmp_path, trace_dir, family):
    out = tmp_path / "trace"
    subprocess.run([sys.executable, str(SCRIPT), *family, str(out)], check=True, capture_output=True, cwd=REPO, timeout=900)
    new, new_blob = _load(out)
    old, old_blob = _load(trace_dir)
    # The call list first (methods, layers, input names/shapes), so a mismatch says where it starts.
    shape = lambda t: [(c["method"], c["layer"], [(i["name"], i["dtype"], i["shape"]) for i in c["inputs"]])  # noqa: E731
                       for c in t["calls"]]
    assert shape(new) == shape(old)
    for k, (a, b) in enumerate(zip(new["calls"], old["calls"])):
        assert a == b, f"call {k} ({a['method']}, layer {a['layer']}) differs: re-run scripts/record_trace.py"
    assert new == old
    assert new_blob == old_blob
    for f in (out / "program").rglob("*"):
        if f.is_file():
            assert f.read_bytes() == (trace_dir / "program" / f.relative_to(out / "program")).read_bytes(), f.name
    assert sorted(p.relative_to(trace_dir) for p in trace_dir.rglob("*")) == sorted(p.relative_to(out) for p in out.rglob("*"))


def test_qwen3_trace_is_of_a_qwen3_shaped_program_with_the_same_steps():
    """tiny_qwen3 is a Qwen3-shaped program (q/k norms, head_dim != hidden / heads, no q/k/v biases, GQA),
    its blocks bind exactly those weights, and the recording made the same calls (method, layer) as tiny's:
    the same steps on another architecture, so a replayer that passes tiny and fails this one assumed a shape."""
    trace, _ = _load(QWEN3)
    manifest = json.loads((QWEN3 / trace["program"] / "manifest.json").read_text())
    arch = manifest["model"]["arch"]
    assert (arch["family"], arch["qk_norm"], arch["qkv_bias"]) == ("qwen3", True, False)
    assert arch["head_dim"] != arch["hidden"] // arch["heads"] and arch["kv_heads"] < arch["heads"]
    methods = {m["name"]: m for m in manifest["methods"]}
    for name in ("block_forward", "block_backward", "block_skip_update", "block_prefill", "block_decode"):
        weights = {i["name"] for i in methods[name]["inputs"] if i["bind"] == "weight"}
        if name != "block_skip_update":
            assert {"w_q_norm", "w_k_norm"} <= weights, name
        assert not any(w.endswith("_bias") for w in weights), name
    cache = next(i for i in methods["block_decode"]["inputs"] if i["name"] == "k_cache")
    assert cache["shape"] == [arch["kv_heads"], manifest["seq_len"], arch["head_dim"]]
    base, _ = _load(TRACE)
    assert [(c["method"], c["layer"]) for c in trace["calls"]] == [(c["method"], c["layer"]) for c in base["calls"]]
    strip = lambda t: [{k: v for k, v in s.items() if k not in ("loss", "state_sha256", "output_ids")}  # noqa: E731
                       for s in t["steps"]]
    assert strip(trace) == strip(base) and trace["rows"] == base["rows"] and trace["eval_rows"] == base["eval_rows"]
    assert trace["losses"] != base["losses"]


@pytest.mark.parametrize("args", [["--family", "llama"], ["--family"]])
def test_an_unknown_family_is_one_error_line(args):
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == "Error: --family takes one of qwen2, qwen3"
    assert not (REPO / "shared_schemas" / "traces" / "llama").exists()


GROUPS = REPO / "shared_schemas" / "traces" / "tiny_groups"


def test_groups_trace_trains_the_same_with_the_block_forward_reruns(tmp_path):
    """tiny_groups: the same steps with layers_per_checkpoint 2 reach the same losses and states; the
    calls are tiny's plus, per step, the block_forward reruns of its groups, placed before the group's
    first backward. Re-recording gives the same files."""
    old, _ = _load(TRACE)
    new, _ = _load(GROUPS)
    assert new["program"] == "../tiny/program/" and new["layers_per_checkpoint"] == 2
    assert new["losses"] == old["losses"] and new["final_state_sha256"] == old["final_state_sha256"]
    train = lambda t: [s for s in t["steps"] if s["kind"] == "train"]  # noqa: E731
    for a, b in zip(train(new), train(old)):
        assert (a["selected"], a["state_sha256"]) == (b["selected"], b["state_sha256"])
        calls_a = [(c["method"], c["layer"]) for c in new["calls"][a["calls"][0]:a["calls"][1]]]
        calls_b = [(c["method"], c["layer"]) for c in old["calls"][b["calls"][0]:b["calls"][1]]]
        groups = [a["selected"][i:i + 2] for i in range(0, len(a["selected"]), 2)]
        reruns = sum(g[-1] - g[0] for g in groups)
        assert len(calls_a) == len(calls_b) + reruns
        assert [c for c in calls_a if c[0] != "block_forward"] == [c for c in calls_b if c[0] != "block_forward"]
    out = tmp_path / "groups"
    subprocess.run([sys.executable, str(SCRIPT), "--groups", str(out)], check=True, capture_output=True, cwd=REPO,
                   timeout=900)
    assert _load(out) == _load(GROUPS)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
