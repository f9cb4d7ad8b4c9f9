"""Run the iOS app's ExecuTorch core (SharedArenaCore.hpp) on this host and compare it with the host
runner (toolchain.runtime.ExecutorchRunner, the Python bindings over the same C++ runtime).

    .venv/bin/python ios/hostcheck/check.py PROGRAM_DIR [--steps 6] [--binary /tmp/shared_arena_check]

Builds shared_arena_check.cpp against the executorch wheel (g++), drives both with the same rows,
LCSB methods and lr, and checks: set_state is seen by get_state (shared arenas), the per-step losses
and the final state are equal, and the same core built without shared arenas (what the Swift
`Module` of the ExecuTorch package does) fails the shared-state check. Exit 0 when all hold.
Needs g++ and the project's venv.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def build(binary: Path, *, share_arenas: bool = True) -> None:
    import executorch

    sp = Path(executorch.__path__[0])
    cmd = ["g++", "-std=c++17", "-O1", "-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS",
           f"-DTC_SHARE_MEMORY_ARENAS={'true' if share_arenas else 'false'}",
           f"-I{sp}/include", f"-I{sp}/include/executorch/runtime/core/portable_type/c10",
           str(HERE / "shared_arena_check.cpp"), "-o", str(binary), f"-L{sp}/lib", "-Wl,--no-as-needed",
           "-lexecutorch", "-lexecutorch_kernels_optimized", "-lexecutorch_kernels_quantized", f"-Wl,-rpath,{sp}/lib"]
    subprocess.run(cmd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("program", type=Path)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--binary", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from toolchain.dataset import ByteTokenizer, bundled_examples
    from toolchain.runtime import ProgramDir, pad_example
    from toolchain.runtime.executorch_runner import ExecutorchRunner

    pdir = ProgramDir(args.program)
    m = pdir.manifest
    lr = float(m["optimizer"].get("default_lr", 1e-4)) * 100      # large enough to move the state visibly
    names = [x["name"] for x in m["methods"]]
    examples = bundled_examples(ByteTokenizer(), seq_len=pdir.seq_len)
    steps = []
    for s in range(args.steps):
        method, _ = pdir.method_for_step(s)
        ids, labels = pad_example(examples[s % len(examples)], pdir.seq_len, m["tokenizer"]["pad_token_id"], "row")
        steps.append((method, ids, labels))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        binary = args.binary or tmp / "shared_arena_check"
        if not binary.exists():
            build(binary)
        plan = [f"methods {len(names)} {' '.join(names)}", f"numel {pdir.state_numel}"]
        for method, ids, labels in steps:
            plan.append(f"{method} {lr!r} {len(ids)} {' '.join(map(str, ids.tolist()))} {' '.join(map(str, labels.tolist()))}")
        (tmp / "plan.txt").write_text("\n".join(plan) + "\n")
        out = subprocess.run([str(binary), str(pdir.program_file("executorch")), str(tmp / "plan.txt"),
                              str(tmp / "state.bin")], check=True, capture_output=True, text=True).stdout
        # Control: the same core without shared arenas (what ExecuTorch's Swift `Module` builds)
        # must fail the shared-state check, or the check above proves nothing.
        unshared = tmp / "unshared_check"
        build(unshared, share_arenas=False)
        control = subprocess.run([str(unshared), str(pdir.program_file("executorch")), str(tmp / "plan.txt"),
                                  str(tmp / "state_unshared.bin")], capture_output=True, text=True).stdout
        lines = out.split("\n")
        shared = "shared_state ok" in lines
        app_losses = [float(line.split()[2]) for line in lines if line.startswith("loss ")]
        app_state = np.fromfile(tmp / "state.bin", dtype=np.float32)

    runner = ExecutorchRunner(pdir.program_file("executorch"), names)
    host_losses = [runner.train_step(method, ids, labels, lr) for method, ids, labels in steps]
    host_state = runner.get_state().numpy()
    initial = ExecutorchRunner(pdir.program_file("executorch"), names).get_state().numpy()

    report = {
        "shared_state": shared,
        "unshared_control_detected": "shared_state broken" in control.split("\n"),
        "app_losses": app_losses,
        "host_losses": host_losses,
        # %.9g round-trips float32 exactly: compare as float32.
        "losses_equal": [np.float32(x) for x in app_losses] == [np.float32(x) for x in host_losses],
        "max_state_diff": float(np.abs(app_state - host_state).max()),
        "state_moved": bool(np.abs(app_state - initial).max() > 0),
    }
    print(json.dumps(report, indent=2))
    ok = shared and report["unshared_control_detected"] and report["losses_equal"] and report["max_state_diff"] == 0.0 and report["state_moved"]
    print("hostcheck:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
