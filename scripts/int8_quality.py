"""`--compute int8` quality, measured (docs/benchmarks.md "`--compute int8`"): JSON + table.

  PYTHONPATH=. .venv/bin/python scripts/int8_quality.py grads [--seeds 8] [--json OUT]
      LoRA gradient cosine and relative L2 error, and the loss's relative error, of the int8 eager step (int8 dX,
      and `int8_dx=False`) against the float64 step on the same int4 weights, per family (qwen2, qwen3, llama) on
      the random configs of tests/mesp/ops/test_int8.py (helpers.random_case, widths scaled to >= 64, group 16),
      with the float32 step's error beside it. The same numbers the test holds to its bound, all of them.

  PYTHONPATH=. .venv/bin/python scripts/int8_quality.py train --programs FP32_DIR,INT8_DIR --data ROWS.jsonl
      [--steps 200] [--threads 1] [--json OUT]
      Two exports of one model that differ only in `--compute` (fp32, int8), on the ExecuTorch runtime (the int8
      program with the native kernels), each trained --steps steps from the same initial state on the same rows
      (cycled in order); the final-loss gap = mean of the last 10 losses, int8 relative to fp32; with an SGD
      program also the gradient of the first step (state change / lr) compared.

  PYTHONPATH=. .venv/bin/python scripts/int8_quality.py noise --program FP32_DIR --data ROWS.jsonl --rel R
      [--steps 200] [--lr LR] [--shuffle 1] [--seed 0] [--eval-every 50] [--threads 1] [--json OUT]
      The int8 run's control: an SGD program trained as `toolchain train --program DIR --shuffle S --eval-data ROWS
      --eval-every E` trains it, but after every step its update (the state's change: lr times the gradient)
      multiplied elementwise by 1 + R z, z ~ N(0, 1) (seeded): an unbiased gradient error of relative L2 R in a
      random direction (cosine about 1 / sqrt(1 + R^2) against the exact gradient), the size of int8's rounding
      (the `train` command's first-step comparison). The step losses and the loss of all rows at every E steps.
      --compare INT8_DIR [--compare-every 25]: also, every N steps, the int8 program's step from the same state and
      row: its update against the fp32 one (cosine, relative L2), int8's error along the trajectory.

  PYTHONPATH=. .venv/bin/python scripts/int8_quality.py speed --programs FP32_DIR,INT8_DIR --data ROWS.jsonl
      [--steps 2] [--threads 1] [--json OUT]
      The two programs' step on ExecuTorch, interleaved after a warm-up step each: wall and process CPU seconds
      (min over --steps) and their ratio to the first; `TOOLCHAIN_KERNEL_PATH=avx2` forces the kernels' AVX2 path.

  PYTHONPATH=. .venv/bin/python scripts/int8_quality.py ops [--steps 3] [--json OUT]
      The two kernels alone at the step's shapes beside torch's float32 product (CPU ms, GMAC/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _grads(a) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tests" / "mesp" / "ops"))
    from test_int8 import FAMILIES, GROUP, _case, _flat

    from toolchain.mesp import StepOptions, mesp_step
    from toolchain.mesp.ops.compute import Compute

    rows = []
    for family in FAMILIES:
        for seed in range(a.seeds):
            case, arch, w64, w32, lora64, lora32, ids, labels = _case(family, seed)
            opts = StepOptions(vocab_chunk=7, mlp_chunk=32) if seed % 2 else StepOptions()
            ref = mesp_step(arch, w64, case.lora, lora64, ids, labels, options=opts)
            g64 = _flat(ref.grads)
            row = {"family": family, "seed": seed, "case": str(case), "hidden": arch.hidden,
                   "intermediate": arch.intermediate, "layers": arch.layers, "tokens": int(ids.shape[0]), "group": GROUP}
            for name, compute in (("fp32", Compute()), ("int8", Compute("int8")),
                                  ("int8_fp32dx", Compute("int8", int8_dx=False))):
                res = mesp_step(arch, w32, case.lora, lora32, ids, labels, options=opts, compute=compute)
                g = _flat(res.grads)
                row[name] = {"cosine": float(g64 @ g / (g64.norm() * g.norm())),
                             "rel_l2": float((g - g64).norm() / g64.norm()),
                             "loss_rel": abs(float(res.loss) - float(ref.loss)) / abs(float(ref.loss))}
            rows.append(row)
            print(f"{family:<6} seed {seed} d{arch.hidden:<4} " + "  ".join(
                f"{n}: cos {row[n]['cosine']:.6f} rel {row[n]['rel_l2']:.2e} loss {row[n]['loss_rel']:.1e}"
                for n in ("fp32", "int8", "int8_fp32dx")), flush=True)
    summary = {}
    for family in FAMILIES:
        fr = [r for r in rows if r["family"] == family]
        summary[family] = {n: {"min_cosine": min(r[n]["cosine"] for r in fr), "max_rel_l2": max(r[n]["rel_l2"] for r in fr),
                               "max_loss_rel": max(r[n]["loss_rel"] for r in fr)} for n in ("fp32", "int8", "int8_fp32dx")}
    print(f"\n{'family':<8}{'variant':<13}{'min cosine':>12}{'max rel L2':>12}{'max loss rel':>14}")
    for family, s in summary.items():
        for n, v in s.items():
            print(f"{family:<8}{n:<13}{v['min_cosine']:>12.6f}{v['max_rel_l2']:>12.2e}{v['max_loss_rel']:>14.1e}")
    return {"what": "int8 eager step vs the float64 step on the same int4 weights", "rows": rows, "summary": summary}


def agreement(ref: torch.Tensor, other: torch.Tensor) -> dict:
    """{"cosine", "rel_l2"} of `other` against `ref` (same shape), in float64."""
    ref, other = ref.double(), other.double()
    return {"cosine": float(ref @ other / (ref.norm() * other.norm())),
            "rel_l2": float((other - ref).norm() / ref.norm())}


def _train(a) -> dict:
    from toolchain.program import ProgramDir
    from toolchain.runtime.program_runtime import open_runtime
    from toolchain.text.dataset import load_examples
    from toolchain.training import TrainRun, run_program

    dirs = [Path(d) for d in a.programs.split(",")]
    pdirs = [ProgramDir(d) for d in dirs]
    computes = [p.spec.compute for p in pdirs]
    if len(dirs) != 2 or computes != ["fp32", "int8"]:
        raise SystemExit(f"Error: --programs takes FP32_DIR,INT8_DIR (got computes {', '.join(computes)})")
    if not torch.equal(pdirs[0].state_init(), pdirs[1].state_init()):
        raise SystemExit("Error: the two programs do not start from the same state (export both with the same seed)")
    runtimes = [open_runtime(p, "executorch", threads=a.threads) for p in pdirs]
    rows = load_examples(a.data, pdirs[0].arch)
    lr = a.lr if a.lr is not None else pdirs[0].default_lr
    out: dict = {"programs": [str(d) for d in dirs], "data": str(a.data), "rows": len(rows), "steps": a.steps, "lr": lr,
                 "threads": a.threads, "optimizer": pdirs[0].optimizer.kind}
    if pdirs[0].optimizer.kind == "sgd":
        init = pdirs[0].state_init()
        g = [((init - run_program(p, r, rows[:1], TrainRun(steps=1, lr=lr)).state) / lr).double()
             for p, r in zip(pdirs, runtimes)]
        out["gradient"] = agreement(g[0], g[1])
        print(f"first-step gradient, int8 vs fp32 program: cosine {out['gradient']['cosine']:.6f}, "
              f"rel L2 {out['gradient']['rel_l2']:.2e}", flush=True)
    losses, seconds = {}, {}
    for c, p, r in zip(computes, pdirs, runtimes):
        w0, c0 = time.perf_counter(), time.process_time()
        losses[c] = run_program(p, r, rows, TrainRun(steps=a.steps, lr=lr)).losses
        seconds[c] = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
        print(f"{c}: {a.steps} steps, wall {seconds[c]['wall_s']:.1f} s, cpu {seconds[c]['cpu_s']:.1f} s", flush=True)
    n = min(10, a.steps)
    first = {c: statistics.mean(v[:n]) for c, v in losses.items()}
    final = {c: statistics.mean(v[-n:]) for c, v in losses.items()}
    gap = (final["int8"] - final["fp32"]) / final["fp32"]
    out.update(losses=losses, seconds=seconds, first_mean=first, last_mean=final, mean_of=n, final_loss_gap=gap)
    print(f"{a.steps}-step run on {len(rows)} rows, lr {lr}: loss (first {n} -> last {n} mean) fp32 "
          f"{first['fp32']:.4f} -> {final['fp32']:.4f}, int8 {first['int8']:.4f} -> {final['int8']:.4f}; "
          f"final-loss gap {100 * gap:+.3f}%")
    return out


def update_noise(delta: torch.Tensor, rel: float, gen: torch.Generator) -> torch.Tensor:
    """The noise added to a step's update `delta`: delta * rel * z elementwise, z ~ N(0, 1) from `gen` (the update
    becomes delta (1 + rel z): unbiased, relative L2 about rel, zero where the update is zero)."""
    return delta * torch.randn(delta.shape, generator=gen, dtype=delta.dtype) * rel


def _noise(a) -> dict:
    from toolchain.program import ProgramDir
    from toolchain.runtime.program_runtime import open_runtime
    from toolchain.text.dataset import load_examples
    from toolchain.training import TrainRun
    from toolchain.training.order import DataOrder
    from toolchain.training.program import ProgramTrainer

    pdir = ProgramDir(a.program)
    if pdir.optimizer.kind != "sgd":
        raise SystemExit(f"Error: --program's optimizer is {pdir.optimizer.kind}: the update noise needs SGD (the "
                         "state is then the adapter, and its change lr times the gradient)")
    if a.rel < 0 or a.eval_every < 1:
        raise SystemExit("Error: --rel must be >= 0 and --eval-every >= 1")
    runtime = open_runtime(pdir, "executorch", threads=a.threads)
    rows = load_examples(a.data, pdir.arch)
    lr = a.lr if a.lr is not None else pdir.default_lr
    trainer = ProgramTrainer(pdir, runtime, rows, TrainRun(steps=a.steps, lr=lr, shuffle_seed=a.shuffle))
    order = DataOrder(len(rows), a.shuffle)
    gen = torch.Generator().manual_seed(a.seed)
    state = trainer.state

    def evaluate(step: int) -> dict:
        e = trainer.held_out(rows)
        print(f"step {step}: loss of all {e['rows']} rows {e['loss']:.6f}", flush=True)
        return {"step": step, "loss": e["loss"], "rows": e["rows"], "tokens": e["tokens"]}

    other = None
    if a.compare is not None:
        cdir = ProgramDir(a.compare)
        if not torch.equal(cdir.state_init(), pdir.state_init()):
            raise SystemExit("Error: --compare's program does not start from --program's state (export both with "
                             "the same seed)")
        other = (cdir, open_runtime(cdir, "executorch", threads=a.threads))
    losses, evals, rel_seen, compared = [], [evaluate(0)], [], []
    w0 = time.perf_counter()
    for step in range(a.steps):
        before = state.clone()
        loss, _ = trainer.step(step, order[step], None)
        delta = state - before
        if other is not None and step % a.compare_every == 0:
            twin = ProgramTrainer(other[0], other[1], rows, TrainRun(steps=1, lr=lr), state=before.clone())
            d8 = (twin.step(step, order[step], None)[0], twin.state - before)
            agree = agreement(delta, d8[1])
            compared.append({"step": step, **agree, "loss": loss, "compare_loss": d8[0]})
            print(f"step {step}: {a.compare.name}'s update against this one: cosine {agree['cosine']:.6f}, "
                  f"rel L2 {agree['rel_l2']:.3e}", flush=True)
        noise = update_noise(delta, a.rel, gen)
        state.add_(noise)                       # in place: the trainer and its loop hold this tensor
        if delta.norm() > 0:
            rel_seen.append(float(noise.norm() / delta.norm()))
        losses.append(loss)
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            evals.append(evaluate(step + 1))
    out = {"program": str(a.program), "data": str(a.data), "rows": len(rows), "steps": a.steps, "lr": lr,
           "shuffle_seed": a.shuffle, "noise_rel": a.rel, "noise_seed": a.seed, "threads": a.threads,
           "noise_rel_seen_median": statistics.median(rel_seen) if rel_seen else 0.0,
           "losses": losses, "evals": evals, "compared": compared, "wall_s": time.perf_counter() - w0}
    print(f"{a.steps} steps, lr {lr}, update noise {a.rel} (median seen {out['noise_rel_seen_median']:.4f}): "
          f"all rows' loss {evals[0]['loss']:.4f} -> {evals[-1]['loss']:.4f}")
    return out


def _speed(a) -> dict:
    """Step time of the two programs, interleaved (fp32, int8, int8, fp32, ...) after a warm-up step each, on the
    ExecuTorch runtime with --threads; wall and process CPU seconds (CPU: all threads' time summed)."""
    import os

    from toolchain.native import kernel_path
    from toolchain.program import ProgramDir
    from toolchain.runtime.program_runtime import open_runtime
    from toolchain.text.dataset import load_examples
    from toolchain.training import TrainRun, run_program

    pdirs = [ProgramDir(Path(d)) for d in a.programs.split(",")]
    rows = load_examples(a.data, pdirs[0].arch)[:1]
    runtimes = [open_runtime(p, "executorch", threads=a.threads) for p in pdirs]
    names = [p.spec.compute for p in pdirs]
    times: dict = {n: {"wall_s": [], "cpu_s": []} for n in names}
    for k in range(a.steps + 1):
        order = list(zip(names, pdirs, runtimes))
        for n, p, r in (order if k % 2 else order[::-1]):
            w0, c0 = time.perf_counter(), time.process_time()
            run_program(p, r, rows, TrainRun(steps=1, lr=1e-4))
            if k:
                times[n]["wall_s"].append(time.perf_counter() - w0)
                times[n]["cpu_s"].append(time.process_time() - c0)
    out = {"programs": a.programs.split(","), "threads": a.threads, "steps": a.steps,
           "kernel_path": kernel_path(),
           "TOOLCHAIN_KERNEL_PATH": os.environ.get("TOOLCHAIN_KERNEL_PATH"), "times": times,
           "min": {n: {k: min(v) for k, v in t.items()} for n, t in times.items()}}
    base = names[0]
    out["ratio_to_" + base] = {n: {k: out["min"][n][k] / out["min"][base][k] for k in ("wall_s", "cpu_s")}
                               for n in names}
    for n in names:
        print(f"{n}: step wall {out['min'][n]['wall_s']:.2f} s, cpu {out['min'][n]['cpu_s']:.2f} s (min of {a.steps}); "
              f"/ {base}: wall {out['ratio_to_' + base][n]['wall_s']:.3f}, cpu {out['ratio_to_' + base][n]['cpu_s']:.3f}",
              flush=True)
    return out


def _ops(a) -> dict:
    """The two W4A8 kernels (C entry points of the loaded native library, its chosen path) beside torch's float32
    product with the weight already dequantized, at the 0.5B step's shapes (T 256): process CPU seconds per call
    (min of --steps after a warm-up call) and GMAC/s."""
    import torch.nn.functional as F

    from toolchain.mesp.kernels import load_native_kernels
    from toolchain.mesp.ops.quant import dequantize, quantize

    lib = load_native_kernels()
    rows = []
    for t, i, o in ((256, 896, 4864), (256, 4864, 896), (256, 896, 896), (256, 896, 1024)):
        qw = quantize(torch.randn(o, i), "int4", 64)
        x, dy, y, dx = torch.randn(t, i), torch.randn(t, o), torch.empty(t, o), torch.empty(t, i)
        ng, wd = qw.scale.shape[1], dequantize(qw)
        cases = {
            "int4_linear_a8": lambda: lib.toolchain_int4_linear_a8(x.data_ptr(), t, i, qw.q.data_ptr(),
                                                                   qw.scale.data_ptr(), o, ng, 64, y.data_ptr()),
            "int4_dyw_a8": lambda: lib.toolchain_int4_dyw_a8(dy.data_ptr(), t, o, qw.q.data_ptr(), qw.scale.data_ptr(),
                                                             i, ng, 64, dx.data_ptr()),
            "fp32 x W^T": lambda: F.linear(x, wd), "fp32 dy W": lambda: dy @ wd}
        for name, fn in cases.items():
            fn()
            best = min(_cpu(fn) for _ in range(a.steps))
            rows.append({"shape": [t, i, o], "op": name, "cpu_ms": best * 1e3, "gmac_per_s": t * i * o / best / 1e9})
            print(f"T {t} i {i} o {o} {name:<15} {best * 1e3:7.1f} ms CPU {t * i * o / best / 1e9:7.1f} GMAC/s", flush=True)
    return {"kernel_path": lib.toolchain_kernel_path().decode(), "threads": a.threads, "rows": rows}


def _cpu(fn) -> float:
    c = time.process_time()
    fn()
    return time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grads")
    g.add_argument("--seeds", type=int, default=8)
    t = sub.add_parser("train")
    t.add_argument("--programs", required=True)
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--threads", type=int, default=1)
    sp_ = sub.add_parser("speed")
    sp_.add_argument("--programs", required=True)
    sp_.add_argument("--data", type=Path, required=True)
    sp_.add_argument("--steps", type=int, default=2)
    sp_.add_argument("--threads", type=int, default=1)
    n_ = sub.add_parser("noise")
    n_.add_argument("--program", type=Path, required=True)
    n_.add_argument("--data", type=Path, required=True)
    n_.add_argument("--rel", type=float, required=True)
    n_.add_argument("--steps", type=int, default=200)
    n_.add_argument("--lr", type=float, default=None)
    n_.add_argument("--shuffle", type=int, default=1)
    n_.add_argument("--seed", type=int, default=0)
    n_.add_argument("--eval-every", type=int, default=50)
    n_.add_argument("--threads", type=int, default=1)
    n_.add_argument("--compare", type=Path, default=None)
    n_.add_argument("--compare-every", type=int, default=25)
    o_ = sub.add_parser("ops")
    o_.add_argument("--steps", type=int, default=3)
    o_.add_argument("--threads", type=int, default=1)
    for sp in (g, t, n_, sp_, o_):
        sp.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(getattr(a, "threads", 1))
    out = {"grads": _grads, "train": _train, "noise": _noise, "speed": _speed, "ops": _ops}[a.command](a)
    import platform

    out["host"] = {"platform": platform.platform(), "torch": torch.__version__,
                   "cpu_flags": sorted(set(f for f in Path("/proc/cpuinfo").read_text().split()
                                           if f.startswith(("avx512", "avx_vnni", "avx2"))))
                   if Path("/proc/cpuinfo").exists() else []}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
