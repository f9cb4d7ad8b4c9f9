"""Run the iOS app's ExecuTorch path (module_check.cpp: the stock C++ `Module` as the Swift `Module`
builds and calls it, driven as TrainerCore drives manifest schema_version 2) on this host, and
compare it with the host runner (ExecutorchRunner + ProgramDir.call_train_method).

    .venv/bin/python ios/hostcheck/check.py PROGRAM_DIR [--steps 6]
    .venv/bin/python ios/hostcheck/check.py --make-program DIR [--steps 6]   # export a small one first

Checks: per-step losses equal as float32, final state bit-identical, the state moved, and (LCSB)
a phase method only changed the entries it returned. Exit 0 when all hold. Needs g++ and the venv.
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


def build(binary: Path) -> None:
    import executorch

    sp = Path(executorch.__path__[0])
    cmd = ["g++", "-std=c++17", "-O1", "-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS",
           f"-I{sp}/include", f"-I{sp}/include/executorch/runtime/core/portable_type/c10",
           str(HERE / "module_check.cpp"), "-o", str(binary), f"-L{sp}/lib", "-Wl,--no-as-needed",
           "-lexecutorch", "-lexecutorch_kernels_optimized", "-lexecutorch_kernels_quantized",
           "-lexecutorch_backend_xnnpack", f"-Wl,-rpath,{sp}/lib"]
    subprocess.run(cmd, check=True)


def make_program(out: Path) -> None:
    """A small SGD program with two LCSB phases (one layer each): phase methods return subsets."""
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.export.program import QuantSpec
    from toolchain.lcsb.plan import make_plan
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.models import Qwen25Arch, random_weights

    arch = Qwen25Arch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
    cfg = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
    spec = ExportSpec(source="hostcheck", init="random", seed=3, seq_len=16, quant=QuantSpec("int4", 16),
                      plan=make_plan(arch.layers, 1, "cyclic"), pad_token_id=0)
    export_program(arch, random_weights(arch, seed=3), cfg, init_lora(arch, cfg, seed=4, zero_b=False), spec, out)


def main() -> int:
    raise SystemExit(
        "ios/hostcheck replays contract v2 programs (whole-step train methods, manifest schema_version 2); the "
        "toolchain now exports contract v3 (layer-generic methods) and the Swift TrainerCore moves to v3 with the apps "
        "(issue 16). Until then this check cannot run against a current export.")
    ap = argparse.ArgumentParser()
    ap.add_argument("program", type=Path, nargs="?")
    ap.add_argument("--make-program", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    if args.make_program:
        make_program(args.make_program)
        args.program = args.make_program
    if args.program is None:
        ap.error("give PROGRAM_DIR or --make-program DIR")

    import torch

    from toolchain.runtime import ProgramDir
    from toolchain.runtime.executorch_runner import ExecutorchRunner
    from toolchain.training import pad_example
    from toolchain.dataset import Example

    pdir = ProgramDir(args.program)
    pte = pdir.program_file("executorch")
    m = pdir.manifest
    lr = float(m["optimizer"].get("default_lr") or 1e-4) * 100       # large enough to move the state visibly
    g = torch.Generator().manual_seed(0)
    vocab = m["model"]["arch"]["vocab"]
    steps = []
    for s in range(args.steps):
        method, _ = pdir.method_for_step(s)
        t = pdir.seq_len - (s % 3)
        ids = torch.randint(0, vocab, (t,), generator=g)
        ids, labels = pad_example(Example(ids, ids.clone()), pdir.seq_len, m["tokenizer"]["pad_token_id"], "row")
        steps.append((method, ids, labels))
    entries = m["state"]["entries"]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        binary = tmp / "module_check"
        build(binary)
        plan = [f"entries {len(entries)}"]
        plan += [f"{e['name']} {e['offset']} {len(e['shape'])} {' '.join(map(str, e['shape']))}" for e in entries]
        plan.append(f"methods {len(pdir.train_methods())}")
        for name in pdir.train_methods():
            outs = [o["name"] for o in pdir.method(name)["outputs"][1:]]
            plan.append(f"{name} {len(outs)} {' '.join(outs)}")
        for method, ids, labels in steps:
            plan.append(f"{method} {lr!r} {len(ids)} {' '.join(map(str, ids.tolist()))} {' '.join(map(str, labels.tolist()))}")
        (tmp / "plan.txt").write_text("\n".join(plan) + "\n")
        initial = pdir.state_init()
        initial.numpy().astype("<f4").tofile(tmp / "state_in.bin")
        out = subprocess.run([str(binary), str(pte), str(tmp / "plan.txt"),
                              str(tmp / "state_in.bin"), str(tmp / "state_out.bin")],
                             check=True, capture_output=True, text=True).stdout
        app_losses = [float(line.split()[2]) for line in out.splitlines() if line.startswith("loss ")]
        app_state = np.fromfile(tmp / "state_out.bin", dtype="<f4")

    runner = ExecutorchRunner(pte, pdir.train_methods())
    state = pdir.state_init()
    host_losses, untouched_ok = [], True
    for method, ids, labels in steps:
        before = state.clone()
        host_losses.append(pdir.call_train_method(runner.execute, method, ids, labels, lr, state))
        returned = {o["name"] for o in pdir.method(method)["outputs"][1:]}
        for e in entries:
            sl = slice(e["offset"], e["offset"] + int(np.prod(e["shape"])))
            if e["name"] not in returned and not torch.equal(before[sl], state[sl]):
                untouched_ok = False
    host_state = state.numpy()
    report = {
        "program": str(args.program), "optimizer": m["optimizer"]["kind"], "lcsb": m["lcsb"],
        "methods": {n: len(pdir.method(n)["outputs"]) - 1 for n in pdir.train_methods()},
        "entries": len(entries), "numel": pdir.state_numel,
        "app_losses": app_losses, "host_losses": host_losses,
        # %.9g round-trips float32 exactly: compare as float32.
        "losses_equal": [np.float32(x) for x in app_losses] == [np.float32(x) for x in host_losses],
        "max_state_diff": float(np.abs(app_state - host_state).max()),
        "state_moved": bool(np.abs(app_state - initial.numpy()).max() > 0),
        "unreturned_entries_untouched": untouched_ok,
    }
    print(json.dumps(report, indent=2))
    ok = report["losses_equal"] and report["max_state_diff"] == 0.0 and report["state_moved"] and untouched_ok
    print("hostcheck:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
