"""Half-precision matmuls on this host at the training step's shapes, beside float32 (issue 26 item 2's
feasibility study).

  nice -n -15 .venv/bin/python scripts/bench_half.py [--threads 1] [--repeats 7] [--json OUT]
      [--modes eager,executorch] [--shapes NAME,...]

For each frozen-weight matmul shape of one Qwen2.5-0.5B step at seq 256 (`SHAPES`: x W^T in forward and
recompute, dy W in backward; W as the dequantized chunk the step multiplies, [o, i]), it times:

- eager: torch's CPU `F.linear` / `mm` in float32, float16 and bfloat16 (torch.set_num_threads(--threads));
- executorch: a one-op module exported through the XNNPACK partitioner the way the training methods are
  (`force_non_static_weights_for_f32_linear`: the weight is a method input, packed per call; without the
  exporter's FLOP and packed-size limits), in float32, float16 and bfloat16, run by the ExecuTorch runtime in this process (thread pool --threads). A float16 matmul that
  XNNPACK does not take falls back to ExecuTorch's optimized/portable kernel: the table says which ran
  (`delegated`).

With --programs FP32_DIR,FP16_DIR (two exports of one model that differ only in `--compute`), it compares the
training step instead, on the ExecuTorch runtime through the host's layer loop, both programs loaded in this
process: --steps single steps each, interleaved (fp32, fp16, fp32, ...) after a warm-up step, wall and
process-CPU seconds per step; with --data ROWS.jsonl also a --train-steps run of each from the same initial
state on the same rows (the final-loss gap: the mean of the last 10 losses, fp16 relative to fp32).

Every matmul case runs --repeats times after a warm-up, interleaved (case after case, round after round, so host
noise hits all alike); the table gives the median ms, the range, GFLOP/s and the ratio to float32 of the
same runtime. Correctness column: max |y - y64| / max |y64| against a float64 product of the same rounded
inputs. The native kernels (toolchain/native/kernels.cpp) have no half-precision path (int4 x int8 only).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]

# name: (T, i, o, kind). kind "xwt": y = x W^T, x [T, i], W [o, i] (aten.linear); "dyw": dx = dy W, dy [T, o],
# W [o, i] (aten.mm). Qwen2.5-0.5B, seq 256; W the whole matrix (the int4 step dequantizes it in chunks of
# 2^18 elements: `chunk` rows are that chunk).
SHAPES = {
    "qo_xwt": (256, 896, 896, "xwt"),        # q / o projection: [256, 896] x [896, 896]^T
    "gateup_xwt": (256, 896, 4864, "xwt"),   # gate / up: [256, 896] x [4864, 896]^T
    "down_xwt": (256, 4864, 896, "xwt"),     # down: [256, 4864] x [896, 4864]^T
    "gateup_dyw": (256, 896, 4864, "dyw"),   # gate / up backward dx: [256, 4864] x [4864, 896]
    "chunk_xwt": (256, 896, 292, "xwt"),     # one dequantized chunk (2^18 elements): [256, 896] x [292, 896]^T
    "chunk_dyw": (256, 896, 292, "dyw"),     # its backward: [256, 292] x [292, 896]
}


def _operands(t: int, i: int, o: int, kind: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(o, i, generator=g) * 0.02).to(dtype)
    a = torch.randn(t, i if kind == "xwt" else o, generator=g).to(dtype)
    return a, w


def _reference(a: torch.Tensor, w: torch.Tensor, kind: str) -> torch.Tensor:
    a64, w64 = a.double(), w.double()
    return a64 @ w64.T if kind == "xwt" else a64 @ w64


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


class _Op(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, a, w):
        return (F.linear(a, w) if self.kind == "xwt" else a @ w,)


def _executorch_case(a: torch.Tensor, w: torch.Tensor, kind: str, threads: int, tmp: Path):
    """(callable, delegated?) for the one-op program of `kind` on (a, w), lowered like the training methods."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig, MMConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from toolchain.export.executorch import quiet_logger

    ep = torch.export.export(_Op(kind), (a, w), strict=False)
    edge = to_edge({"forward": ep}, compile_config=EdgeCompileConfig(_check_ir_validity=False,
                                                                     preserve_ops=[torch.ops.aten.linear.default]))
    # the training methods' partitioner settings (export/executorch.py xnnpack_partitioner) without its size
    # limits (this is a study of the kernel), bfloat16 allowed
    part = XnnpackPartitioner(configs=[LinearConfig, MMConfig], per_op_mode=True,
                              force_non_static_weights_for_f32_linear=True, enable_bf16=a.dtype == torch.bfloat16)
    with quiet_logger("executorch.backends.xnnpack.partition.xnnpack_partitioner"):
        edge = edge.to_backend({"forward": part})
    gm = edge.exported_program("forward").graph_module
    delegated = any("executorch_call_delegate" in str(n.target) for n in gm.graph.nodes)
    et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
    pte = tmp / f"{kind}_{a.dtype}_{a.shape[0]}x{a.shape[1]}_{w.shape[0]}x{w.shape[1]}.pte"
    pte.write_bytes(et.buffer)
    from toolchain.runtime.executorch_runtime import native_log_redirected

    with native_log_redirected():
        portable_lib._unsafe_reset_threadpool(threads)
        method = Runtime.get().load_program(pte).load_method("forward")
    inputs = [a.contiguous(), w.contiguous()]

    def run():
        return method.execute(inputs)[0]
    return run, delegated


def _time(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _programs(a) -> dict:
    """The --programs comparison (module docstring)."""
    from toolchain.text.dataset import load_examples
    from toolchain.program import ProgramDir
    from toolchain.runtime.program_runtime import open_runtime
    from toolchain.training import TrainRun, run_program

    dirs = [Path(d) for d in a.programs.split(",")]
    pdirs = [ProgramDir(d) for d in dirs]
    computes = [p.spec.compute for p in pdirs]
    if len(dirs) != 2 or computes != ["fp32", "fp16"]:
        raise SystemExit(f"Error: --programs takes FP32_DIR,FP16_DIR (got computes {', '.join(computes)})")
    runtimes = [open_runtime(p, "executorch", threads=a.threads) for p in pdirs]
    g = torch.Generator().manual_seed(0)
    vocab, t = pdirs[0].arch.vocab, pdirs[0].seq_len
    from toolchain.text.dataset import DataRow

    rows = (load_examples(a.data, pdirs[0].arch) if a.data else
            [DataRow(ids, ids.clone()) for ids in (torch.randint(0, vocab, (t,), generator=g) for _ in range(2))])
    lr = a.lr if a.lr is not None else pdirs[0].default_lr
    times = {c: {"wall_s": [], "cpu_s": []} for c in computes}
    for i in range(a.steps + 1):                         # step 0: warm-up (every method loaded, pages mapped)
        for c, p, r in zip(computes, pdirs, runtimes):
            w0, c0 = time.perf_counter(), time.process_time()
            run_program(p, r, rows[:1], TrainRun(steps=1, lr=lr))
            if i:
                times[c]["wall_s"].append(time.perf_counter() - w0)
                times[c]["cpu_s"].append(time.process_time() - c0)
    # the gradient of one step from the initial state on rows[0]: SGD's update is -lr * grad, so (init - new) / lr
    # (exact up to the product's rounding where the state starts at 0: PEFT's B = 0; AdamW: no such relation)
    grad = None
    if pdirs[0].optimizer.kind == "sgd":
        init = pdirs[0].state_init()
        g = [((init - run_program(p, r, rows[:1], TrainRun(steps=1, lr=lr)).state) / lr).double()
             for p, r in zip(pdirs, runtimes)]
        grad = {"cosine": float(g[0] @ g[1] / (g[0].norm() * g[1].norm())),
                "rel_l2": float((g[1] - g[0]).norm() / g[0].norm()), "nonzero": int((g[0] != 0).sum())}
        print(f"gradient of one step (state change / lr), fp16 vs fp32: cosine {grad['cosine']:.7f}, "
              f"rel L2 {grad['rel_l2']:.2e} ({grad['nonzero']} nonzero entries)")
    out = {"programs": [str(d) for d in dirs], "steps": a.steps, "lr": lr, "step": {}, "gradient": grad}
    for c in computes:
        out["step"][c] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times[c].items()}
    out["step_ratio_fp16_fp32"] = {k: out["step"]["fp16"][k]["median"] / out["step"]["fp32"][k]["median"]
                                   for k in ("wall_s", "cpu_s")}
    print(f"step on ExecuTorch, {a.steps} interleaved steps each (median, range):")
    for c in computes:
        st = out["step"][c]
        print(f"  {c}: wall {st['wall_s']['median']:.3f} s ({st['wall_s']['min']:.3f}-{st['wall_s']['max']:.3f}), "
              f"cpu {st['cpu_s']['median']:.3f} s ({st['cpu_s']['min']:.3f}-{st['cpu_s']['max']:.3f})")
    print(f"  fp16 / fp32: wall {out['step_ratio_fp16_fp32']['wall_s']:.3f}, cpu {out['step_ratio_fp16_fp32']['cpu_s']:.3f}")
    if a.data:
        losses = {c: run_program(p, r, rows, TrainRun(steps=a.train_steps, lr=lr)).losses
                  for c, p, r in zip(computes, pdirs, runtimes)}
        final = {c: statistics.mean(v[-10:]) for c, v in losses.items()}
        first = {c: statistics.mean(v[:10]) for c, v in losses.items()}
        gap = (final["fp16"] - final["fp32"]) / final["fp32"]
        out["train"] = {"steps": a.train_steps, "rows": len(rows), "data": str(a.data), "losses": losses,
                        "first10_mean": first, "last10_mean": final, "final_loss_gap": gap}
        print(f"{a.train_steps}-step run on {len(rows)} rows, lr {lr}: loss (first 10 -> last 10 mean) "
              f"fp32 {first['fp32']:.4f} -> {final['fp32']:.4f}, fp16 {first['fp16']:.4f} -> {final['fp16']:.4f}; "
              f"final-loss gap {100 * gap:+.3f}%")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each: every case --repeats times)")
    p.add_argument("--modes", default="eager,executorch")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated keys of SHAPES (default: all)")
    p.add_argument("--json", type=Path)
    p.add_argument("--programs", help="FP32_DIR,FP16_DIR: compare the two programs' training step instead")
    p.add_argument("--steps", type=int, default=3, help="--programs: timed steps per program")
    p.add_argument("--data", type=Path, help="--programs: rows (toolchain data) for a --train-steps run of each")
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=None, help="--programs: default: the manifest's default_lr")
    a = p.parse_args(argv)
    if a.programs:
        warnings.filterwarnings("ignore", category=FutureWarning)
        torch.set_num_threads(a.threads)
        doc = _programs(a) | {"threads": a.threads,
                              "command": "scripts/bench_half.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    modes = a.modes.split(",")
    bad = [m for m in modes if m not in ("eager", "executorch")]
    if bad:
        print(f"Error: unknown mode(s) {', '.join(bad)}; choose from eager, executorch", file=sys.stderr)
        return 2
    shapes = [s.strip() for s in a.shapes.split(",")]
    missing = [s for s in shapes if s not in SHAPES]
    if missing:
        print(f"Error: unknown shape(s) {', '.join(missing)}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    flags = sorted(set(re.findall(r"\b(avx512[a-z_0-9]*|amx[a-z_0-9]*|f16c|fma)\b",
                                  Path("/proc/cpuinfo").read_text()))) if Path("/proc/cpuinfo").exists() else []
    cases = []   # (shape, runtime, dtype, fn, delegated, flops, err)
    refused = []   # cases the runtime would not load (the native reason goes to $TOOLCHAIN_NATIVE_LOG)
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        for name in shapes:
            t, i, o, kind = SHAPES[name]
            flops = 2.0 * t * i * o
            for mode in modes:
                dtypes = (torch.float32, torch.float16, torch.bfloat16)
                for dt in dtypes:
                    x, w = _operands(t, i, o, kind, dt)
                    if mode == "eager":
                        fn = (lambda x=x, w=w: F.linear(x, w)) if kind == "xwt" else (lambda x=x, w=w: x @ w)
                        delegated = None
                    else:
                        try:
                            fn, delegated = _executorch_case(x, w, kind, a.threads, tmp)
                        except RuntimeError as e:   # a dtype the runtime cannot run is a result
                            refused.append({"shape": name, "runtime": mode, "dtype": str(dt).removeprefix("torch."),
                                            "error": str(e).splitlines()[0][:200]})
                            continue
                    err = _rel_err(fn(), _reference(x, w, kind))
                    cases.append({"shape": name, "runtime": mode, "dtype": str(dt).removeprefix("torch."),
                                  "fn": fn, "delegated": delegated, "flops": flops, "rel_err": err, "times": []})
        for c in cases:
            c["fn"]()                                                   # warm-up
        for _ in range(a.rounds):
            for c in cases:
                c["times"] += _time(c["fn"], a.repeats)
    rows = []
    for c in cases:
        med = statistics.median(c["times"])
        base = next(b for b in cases if b["shape"] == c["shape"] and b["runtime"] == c["runtime"]
                    and b["dtype"] == "float32")
        rows.append({k: c[k] for k in ("shape", "runtime", "dtype", "delegated", "rel_err")} | {
            "median_ms": 1e3 * med, "min_ms": 1e3 * min(c["times"]), "max_ms": 1e3 * max(c["times"]),
            "gflops": c["flops"] / med / 1e9, "vs_fp32": med / statistics.median(base["times"]),
            "n": len(c["times"])})
    print(f"{'shape':11s} {'runtime':10s} {'dtype':9s} {'xnn':4s} {'median ms':>9s} {'range':>15s} "
          f"{'GFLOP/s':>8s} {'x fp32':>7s} {'rel err':>8s}")
    for r in rows:
        xnn = "" if r["delegated"] is None else ("yes" if r["delegated"] else "no")
        print(f"{r['shape']:11s} {r['runtime']:10s} {r['dtype']:9s} {xnn:4s} {r['median_ms']:9.2f} "
              f"{r['min_ms']:7.2f}-{r['max_ms']:<7.2f} {r['gflops']:8.1f} {r['vs_fp32']:7.2f} {r['rel_err']:8.1e}")
    for r in refused:
        print(f"{r['shape']:11s} {r['runtime']:10s} {r['dtype']:9s} refused by the runtime: {r['error']}")
    if a.json:
        import executorch

        doc = {"host": {"machine": platform.machine(), "cpu_flags": flags, "threads": a.threads,
                        "torch": torch.__version__, "executorch": getattr(executorch, "__version__", "1.5.1")},
               "repeats": a.repeats, "rounds": a.rounds, "rows": rows, "refused": refused,
               "command": "scripts/bench_half.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
