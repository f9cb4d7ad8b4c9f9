"""Run the iOS app's ExecuTorch path on this host and compare it with the recorded trace.

module_check.cpp is the stock C++ `Module` as the Swift `Module` builds and calls it (LoadMode::Mmap,
so one arena per loaded method; set_input per index, then execute(method)); this script makes it the
runtime of the layer loop (toolchain/runtime/loop.py, the loop TrainerCore's LayerLoop replays bit
for bit in ios/test.sh) and runs what the trace's steps did: the train steps (full and LCSB chosen at
run time, AdamW with skip updates), the eval pass and greedy generation with the chunked prefill and the
KV cache (toolchain/runtime/generate.py, the manifest's generate.steps). Checks: every step's loss and
state sha256, the final state, the eval loss and the generated ids equal the trace's (recorded on the
Python bindings' runtime, one shared arena, with the stock generation methods), and the number of calls.

Two builds of module_check, both with the app's kernel probe (ios/App/Sources/Kernels/ToolchainKernels.cpp):
  stock (default): the app's ExecuTorch kernel set only; the probe must say toolchain::int4_linear_a8.out is
    missing, and only the stock methods are loaded (a fused method would not load without its kernel);
  --fused: also toolchain/native/kernels.cpp (the toolchain's flags), as the app target compiles it;
    the probe must say registered (and the kernel path query: none, or a path name), the fused generation
    methods (generate.fused) are loaded instead of
    their stock ones and called by generate(); the greedy ids must still be the trace's.

    .venv/bin/python ios/hostcheck/check.py [TRACE_DIR] [--fused]   # default shared_schemas/traces/tiny
                                                                     # (tiny_groups: its layers_per_checkpoint)

Needs g++ and the venv (the executorch wheel's headers and libexecutorch.so). Exit 0 when all hold.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {0: np.float32, 1: np.int64, 2: np.uint8, 3: np.int8}


KERNEL = "toolchain::int4_linear_a8.out"
KERNEL_PATHS = ("generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm")  # toolchain_kernel_path()
KERNELS_DIR = ROOT / "ios/App/Sources/Kernels"     # the app's kernel probe (and its header)


def build(binary: Path, fused: bool = False) -> None:
    """module_check + the app's kernel probe; with `fused`, also the native int4 kernel, compiled with the
    toolchain's own flags (toolchain/native/build.py) into an object linked in whole (its static
    initializer registers the kernel, as in the app target)."""
    import executorch

    sp = Path(executorch.__path__[0])
    inc = ["-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS", f"-I{sp}/include",
           f"-I{sp}/include/executorch/runtime/core/portable_type/c10", f"-I{KERNELS_DIR}"]
    objects = []
    if fused:
        from toolchain.native.build import KERNEL_SOURCE, compile_flags

        flags = [f for f in compile_flags() if f not in ("-shared", "-fPIC")]
        kernel = binary.with_name("kernels.o")
        subprocess.run(["g++", *flags, *inc, "-c", str(KERNEL_SOURCE), "-o", str(kernel)], check=True)
        objects.append(str(kernel))
    cmd = ["g++", "-std=c++17", "-O1", *inc, str(HERE / "module_check.cpp"), str(KERNELS_DIR / "ToolchainKernels.cpp"),
           *objects, "-o", str(binary), f"-L{sp}/lib", "-Wl,--no-as-needed",
           "-lexecutorch", "-lexecutorch_kernels_optimized", "-lexecutorch_kernels_quantized",
           "-lexecutorch_backend_xnnpack", f"-Wl,-rpath,{sp}/lib"]
    subprocess.run(cmd, check=True)


def probe(binary: Path, kernel: str) -> bool:
    out = subprocess.run([str(binary), "--probe", kernel], check=True, capture_output=True, text=True).stdout.strip()
    if out not in ("registered", "missing"):
        raise RuntimeError(f"module_check --probe answered {out!r}")
    return out == "registered"


class AppModuleRuntime:
    """`execute(method, inputs) -> outputs` over the module_check process (the app's C++ Module)."""

    def __init__(self, binary: Path, pte: Path, methods: list[str]) -> None:
        self.proc = subprocess.Popen([str(binary), str(pte), *methods], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.calls = 0
        self.called: list[str] = []
        self.methods_loaded = tuple(methods)      # generate() calls the fused names only if they are among these

    def execute(self, method: str, inputs):
        import torch

        codes = {torch.float32: 0, torch.int64: 1, torch.uint8: 2, torch.int8: 3}
        msg = [struct.pack("<I", len(method)), method.encode(), struct.pack("<I", len(inputs))]
        for t in inputs:
            b = t.detach().contiguous().numpy().tobytes()
            msg += [struct.pack("<BI", codes[t.dtype], t.dim()), struct.pack(f"<{t.dim()}i", *t.shape), struct.pack("<Q", len(b)), b]
        self.proc.stdin.write(b"".join(msg))
        self.proc.stdin.flush()
        read = self.proc.stdout.read
        status, n = struct.unpack("<II", read(8))
        if status != 0:
            raise RuntimeError(f"{method}: ExecuTorch error 0x{status:x} in the app's Module")
        outs = []
        for _ in range(n):
            dtype, ndim = struct.unpack("<BI", read(5))
            shape = struct.unpack(f"<{ndim}i", read(4 * ndim))
            (nbytes,) = struct.unpack("<Q", read(8))
            outs.append(torch.from_numpy(np.frombuffer(read(nbytes), dtype=DTYPES[dtype]).copy().reshape(shape)))
        self.calls += 1
        self.called.append(method)
        return outs

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def main() -> int:
    import torch

    from toolchain.text.dataset import DataRow
    from toolchain.program import ProgramDir
    from toolchain.runtime.evaluate import evaluate_program
    from toolchain.runtime.generate import generate
    from toolchain.runtime.loop import LayerLoop
    from toolchain.runtime.program_runtime import role_methods

    args = [a for a in sys.argv[1:] if a != "--fused"]
    fused = "--fused" in sys.argv[1:]
    trace_dir = Path(args[0]) if args else ROOT / "shared_schemas/traces/tiny"
    trace = json.loads((trace_dir / "trace.json").read_text())
    if trace.get("format") != "toolchain-trace":
        print(f"Error: {trace_dir / 'trace.json'} is not a toolchain trace (format {trace.get('format')!r}, "
              "expected 'toolchain-trace'): re-record it with scripts/record_trace.py", file=sys.stderr)
        return 2
    pdir = ProgramDir(trace_dir / trace["program"])
    pte = pdir.program_file(pdir.targets[0])
    if not pte.exists():
        print(f"hostcheck: {pte} is not in the trace (large programs ship without it); re-record with the .pte")
        return 2
    sha = lambda t: hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()  # noqa: E731
    pad, s = trace["pad_token_id"], trace["seq_len"]

    def padded(row):
        ids = torch.full((s,), pad, dtype=torch.int64)
        labels = torch.full((s,), -100, dtype=torch.int64)
        ids[:len(row["input_ids"])] = torch.tensor(row["input_ids"])
        labels[:len(row["labels"])] = torch.tensor(row["labels"])
        return ids, labels

    gen = pdir.generate
    fused_methods = set(gen.fused.methods.values()) if gen is not None and gen.fused is not None else set()
    if fused and not fused_methods:
        print(f"hostcheck: {pdir.path} has no fused generation methods (generate.fused); --fused needs an int4 program")
        return 2
    report: dict = {"trace": str(trace_dir), "mode": "fused" if fused else "stock", "steps": []}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "module_check"
        build(binary, fused=fused)
        registered = probe(binary, KERNEL)
        report["kernel_probe"] = {KERNEL: "registered" if registered else "missing"}
        ok &= registered == fused
        # the app's kernel path query (ToolchainKernels.cpp): without the kernels its weak stand-in says none; with
        # them, none (kernels without toolchain_kernel_path) or one of the path names
        path = subprocess.run([str(binary), "--kernel-path"], check=True, capture_output=True, text=True).stdout.strip()
        report["kernel_path"] = path
        ok &= path == "none" if not fused else path in ("none", *KERNEL_PATHS)
        # the stock build loads no method that needs the kernel; the fused one loads the fused variants instead
        methods = role_methods(pdir, "all", fused=fused)
        ok &= bool(fused_methods & set(methods)) == fused
        report["methods_loaded"] = methods
        runtime = AppModuleRuntime(binary, pte, methods)
        try:
            loop = LayerLoop(pdir, runtime)
            state = pdir.state_init()
            ok &= sha(state) == trace["initial_state_sha256"]
            lr = float(trace["lr"])
            for step in trace["steps"]:
                if step["kind"] == "train":
                    ids, labels = padded(trace["rows"][step["row"]])
                    loss = loop.train_step(ids, labels, lr, state, selected=step["selected"],
                                           layers_per_checkpoint=trace.get("layers_per_checkpoint", 1))
                    same = (np.float32(loss) == np.float32(step["loss"]), sha(state) == step["state_sha256"])
                    report["steps"].append({"train": step["step"], "selected": step["selected"], "loss": loss,
                                            "loss_equal": bool(same[0]), "state_equal": same[1]})
                    ok &= all(same)
                elif step["kind"] == "eval":
                    rows = [DataRow(*padded(trace["eval_rows"][i])) for i in step["rows"]]
                    ev = evaluate_program(pdir, runtime, state, rows, loop=loop)
                    same = abs(ev["loss"] - step["loss"]) <= 1e-12 * abs(step["loss"]) and ev["tokens"] == step["tokens"]
                    report["steps"].append({"eval": ev["loss"], "equal": same})
                    ok &= same
                else:
                    gen = generate(pdir, runtime, state, step["prompt_ids"], step["max_new_tokens"], loop=loop)
                    same = gen.output_ids == step["output_ids"]
                    report["steps"].append({"generate": gen.output_ids, "equal": same})
                    ok &= same
            final = sha(state) == trace["final_state_sha256"]
            ok &= final
            called_fused = sorted(set(runtime.called) & fused_methods)
            report.update(calls=runtime.calls, recorded_calls=len(trace["calls"]), final_state_equal=final,
                          fused_methods_called=called_fused)
            ok &= runtime.calls == len(trace["calls"])
            ok &= bool(called_fused) == fused          # the fused run really called them; the stock run never
            if fused:
                # call for call the trace's methods, the stock names replaced by their fused ones
                to_fused = pdir.generate.fused.methods
                ok &= runtime.called == [to_fused.get(c["method"], c["method"]) for c in trace["calls"]]
        finally:
            runtime.close()
    print(json.dumps(report, indent=2))
    print("hostcheck:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
