"""The shared replay trace (shared_schemas/traces/v3_tiny, format in shared_schemas/traces/README.md): it is
self-consistent, small, covers every method kind, and re-recording it (scripts/record_v3_trace.py: export +
the host's loop on ExecuTorch) gives the same trace, so the trace the Kotlin and Swift replays check against
is what the current toolchain does."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "shared_schemas" / "traces" / "v3_tiny"
SCRIPT = REPO / "scripts" / "record_v3_trace.py"


def _load(d: Path) -> tuple[dict, bytes]:
    return json.loads((d / "trace.json").read_text()), (d / "outputs.bin").read_bytes()


def test_committed_trace_is_consistent_and_small():
    trace, blob = _load(TRACE)
    assert trace["format"] == "toolchain-v3-trace" and trace["format_version"] == 1
    size = sum(f.stat().st_size for f in TRACE.rglob("*") if f.is_file())
    assert size < 3 * 1024 * 1024
    end = 0
    for c in trace["calls"]:
        for o in c["outputs"]:
            assert o["offset"] == end
            end += o["nbytes"]
            assert hashlib.sha256(blob[o["offset"]:end]).hexdigest() == o["sha256"]
    assert end == len(blob)
    # The program is complete for an app (every listed file but a dropped large .pte, checksums right).
    prog = TRACE / trace["program"]
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
    assert {c["method"] for c in trace["calls"]} == {m["name"] for m in manifest["methods"]}
    assert [s["loss"] for s in train] == trace["losses"] and train[-1]["state_sha256"] == trace["final_state_sha256"]
    spans = [tuple(s["calls"]) for s in trace["steps"]]
    assert spans[0][0] == 0 and spans[-1][1] == len(trace["calls"])
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    methods = {m["name"]: m for m in manifest["methods"]}
    for c in trace["calls"]:
        assert [i["name"] for i in c["inputs"]] == [i["name"] for i in methods[c["method"]]["inputs"]]
        assert [o["name"] for o in c["outputs"]] == [o["name"] for o in methods[c["method"]]["outputs"]]


def test_rerecording_gives_the_same_trace(tmp_path):
    out = tmp_path / "trace"
    subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, capture_output=True, cwd=REPO, timeout=900)
    new, new_blob = _load(out)
    old, old_blob = _load(TRACE)
    # The call list first (methods, layers, input names/shapes), so a mismatch says where it starts.
    shape = lambda t: [(c["method"], c["layer"], [(i["name"], i["dtype"], i["shape"]) for i in c["inputs"]])  # noqa: E731
                       for c in t["calls"]]
    assert shape(new) == shape(old)
    for k, (a, b) in enumerate(zip(new["calls"], old["calls"])):
        assert a == b, f"call {k} ({a['method']}, layer {a['layer']}) differs: re-run scripts/record_v3_trace.py"
    assert new == old
    assert new_blob == old_blob
    for f in (out / "program").rglob("*"):
        if f.is_file():
            assert f.read_bytes() == (TRACE / "program" / f.relative_to(out / "program")).read_bytes(), f.name


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
