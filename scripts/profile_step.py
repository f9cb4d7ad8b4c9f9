"""Where the ExecuTorch training step spends its time, beside the eager MeSP step (docs/benchmarks.md section 1).

  PYTHONPATH=. .venv/bin/python scripts/profile_step.py --program DIR [--model qwen2.5-0.5b] [--repeat 3]
      [--threads 1] [--no-ops] [--json OUT]

The workload is `toolchain bench memory --modes mesp,executorch --program DIR`'s (the same weights cache,
adapter, batch, program settings and threads). Two parts, in one process:

1. Stage times, unprofiled: `repeat` rounds of one eager MeSP step and one program step, interleaved (the
   order reversed every other round). The eager step's stages are timed by wrapping the functions
   `mesp_step` calls (embed, block_forward, head_loss_and_grad, block_backward, and the SGD hook); the
   program's by wrapping the runtime's `execute` per method; what is left of each step is the driver (the
   layer loop's binding and copies; the eager step's Python between stages). Per stage: the median over
   rounds of its total seconds per step (wall and process CPU), its calls, the ratio program / eager.
2. Op breakdown (unless --no-ops), one more step each: the eager step under torch.profiler (self CPU time
   per aten op; everything under mesp/ops/quant.py `dequantize` counted as dequantization), the program
   on a module loaded with ETDump (ExecuTorch's event tracer: each kernel call's time; an XNNPACK delegate
   call is one event, `DELEGATE_CALL`). Both grouped into the same buckets (`_bucket`) per stage. Profiling
   slows both steps: compare buckets within a step, and the stage totals of part 1 across modes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from toolchain.bench.memory import MemoryBenchConfig, worker_spec, host_info, program_settings
from toolchain.bench.weights_cache import (default_cache_dir, ensure_quantized, ensure_weights_cache,
                                           weights_cache_dir)
from toolchain.bench.worker import worker_setup
from toolchain.program import ProgramDir
from toolchain.runtime import LayerLoop

STAGES = ("embed", "block_forward", "head_loss", "block_backward", "update", "driver")


class _Clock:
    """Seconds (wall, CPU) and calls per stage name."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[name] += time.perf_counter() - t0
                self.cpu[name] += time.process_time() - c0
                self.calls[name] += 1
        return timed


class _TimedRuntime:
    """The loop's runtime with every `execute` timed per method role (the step's stage)."""

    def __init__(self, inner, roles: dict[str, str], clock: _Clock) -> None:
        self.inner, self.roles, self.clock = inner, roles, clock

    def execute(self, method, inputs):
        return self.clock.wrap(self.roles[method], self.inner.execute)(method, inputs)


class _EtdumpRuntime:
    """The program loaded with ETDump (the pybindings' Module): `execute` as ExecuTorchRuntime's, and the name
    of every method called, in order (ETDump's event blocks are the calls, in the same order)."""

    def __init__(self, pte: Path) -> None:
        from executorch.extension.pybindings import portable_lib

        from toolchain.runtime.executorch_runtime import load_quantized_kernels

        load_quantized_kernels()
        self.module = portable_lib._load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
        self.called: list[str] = []

    def execute(self, method, inputs):
        self.called.append(method)
        return list(self.module.run_method(method, inputs, clone_outputs=False))


def _eager_step(spec: dict, s, clock: _Clock):
    """One eager MeSP step (bench mode mesp: SGD in the per-layer hook) with its stages timed."""
    import toolchain.mesp.step as step_mod
    from toolchain.bench.steps import sgd_hook, train_step
    from toolchain.lora import init_lora

    lora = init_lora(s.arch, s.cfg, seed=spec["seed"], zero_b=False)
    hook = clock.wrap("update", sgd_hook(lora, spec["lr"]))
    originals = {n: getattr(step_mod, n) for n in ("embedding_rows", "block_forward", "head_loss_and_grad",
                                                   "block_backward")}
    stage = {"embedding_rows": "embed", "head_loss_and_grad": "head_loss"}

    def run() -> float:
        for n, fn in originals.items():
            setattr(step_mod, n, clock.wrap(stage.get(n, n), fn))
        try:
            return train_step(s.arch, s.weights, s.cfg, lora, s.input_ids, s.labels, mode="mesp", hook=hook,
                              options=s.options, lr=spec["lr"])
        finally:
            for n, fn in originals.items():
                setattr(step_mod, n, fn)
    return run


def _program_step(spec: dict, s, pdir: ProgramDir, runtime):
    """One program step on `runtime` through the host's layer loop, from the eager step's adapter."""
    from toolchain.lora import init_lora
    from toolchain.program.spec import flat_state, state_layout

    loop = LayerLoop(pdir, runtime)
    layout = state_layout(pdir.arch, pdir.lora_config, pdir.optimizer)
    state = flat_state(layout, init_lora(s.arch, s.cfg, seed=spec["seed"], zero_b=False))
    return lambda: loop.train_step(s.input_ids, s.labels, spec["lr"], state)


# Buckets shared by both modes' op lists: what kind of work an op is.
_MATMUL = ("linear", "mm", "addmm", "bmm", "matmul", "baddbmm")
_COPY = ("copy", "clone", "cat", "stack", "slice", "select", "permute", "transpose", "expand", "view", "reshape",
         "unsqueeze", "squeeze", "contiguous", "split", "index", "as_strided", "to", "_to_copy", "empty", "zeros",
         "full", "fill", "arange", "t", "unbind", "narrow", "alias", "repeat", "pad", "constant_pad_nd",
         "_to_dim_order_copy", "embedding")
_REDUCE = ("sum", "mean", "amax", "max", "logsumexp", "softmax", "_softmax", "log_softmax", "_log_softmax", "norm",
           "var", "argmax", "gather", "scatter", "scatter_add", "nll_loss", "nll_loss_forward", "cumsum")


def _bucket(op: str) -> str:
    """`aten::mm`, `native_call_mm.out`, `DELEGATE_CALL` -> matmul (delegate: xnnpack), dequantize, copy, reduce,
    elementwise."""
    if "DELEGATE" in op or op.startswith("xnnpack"):
        return "matmul_xnnpack"
    if "embedding_4bit" in op or op == "dequantize":
        return "dequantize"
    name = op.removeprefix("aten::").removeprefix("native_call_").split(".")[0].rstrip("_")
    if name in _MATMUL:
        return "matmul"
    if name in _COPY:
        return "copy"
    if name in _REDUCE:
        return "reduce"
    return "elementwise"


def eager_ops(spec: dict, s) -> dict:
    """{stage: {op: self CPU seconds}} of one eager step under torch.profiler (dequantize: an op)."""
    import toolchain.mesp.ops.quant as quant
    import toolchain.mesp.step as step_mod
    from torch.profiler import ProfilerActivity, profile, record_function

    def labelled(name, fn):
        def run(*a, **k):
            with record_function(name):
                return fn(*a, **k)
        return run

    names = {"embedding_rows": "embed", "block_forward": "block_forward", "head_loss_and_grad": "head_loss",
             "block_backward": "block_backward"}
    saved = {n: getattr(step_mod, n) for n in names}
    dq = quant.dequantize
    _eager_step(spec, s, _Clock())()                               # warm-up
    for n, st in names.items():
        setattr(step_mod, n, labelled(f"stage::{st}", saved[n]))
    quant.dequantize = labelled("stage::dequantize", dq)
    try:
        step = _eager_step(spec, s, _Clock())                      # wraps the labelled stages
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
    finally:
        for n, fn in saved.items():
            setattr(step_mod, n, fn)
        quant.dequantize = dq
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in prof.events():
        if e.name.startswith("stage::"):
            continue
        stage, op, p = "update", e.name, e.cpu_parent
        while p is not None:
            if p.name == "stage::dequantize":
                op = "dequantize"
            elif p.name.startswith("stage::"):
                stage = p.name.removeprefix("stage::")
                break
            p = p.cpu_parent
        out[stage][op] += e.self_cpu_time_total / 1e6
    return {k: dict(v) for k, v in out.items()}


def program_ops(spec: dict, s, pdir: ProgramDir) -> dict:
    """{stage: {op: seconds}} of one program step on an ETDump module (ExecuTorch's own kernel timers).

    The Inspector merges the calls of a method into one event block (one event per instruction, its
    `perf_data.raw` one time per call, in ms) and orders the blocks by first call: the module runs a
    warm-up step and the profiled one, and the second half of every instruction's times is the profiled
    step's."""
    from executorch.devtools import Inspector

    from toolchain.runtime.executorch_runtime import native_log_redirected

    runtime = _EtdumpRuntime(pdir.program_file("executorch"))
    step = _program_step(spec, s, pdir, runtime)
    step()
    step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.etdp"
        runtime.module.write_etdump_result_to_file(str(path))
        with native_log_redirected():
            blocks = [b for b in Inspector(etdump_path=str(path)).event_blocks if b.name == "Execute"]
    first_called = list(dict.fromkeys(runtime.called))
    if len(blocks) != len(first_called):
        raise RuntimeError(f"ETDump has {len(blocks)} method blocks for {len(first_called)} methods called")
    roles = {n: m.role for n, m in pdir.methods.items()}
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def profiled(e) -> float:
        raw = list(e.perf_data.raw) if e.perf_data else []
        return sum(raw[len(raw) // 2:]) / 1e3                                      # ms -> s

    for method, block in zip(first_called, blocks):
        per = out[roles[method]]
        kernels = calls = 0.0
        for e in block.events:
            t = profiled(e)
            if e.is_delegated_op:                  # XNNPACK's own events inside a DELEGATE_CALL: not added again
                continue
            if e.name == "OPERATOR_CALL":          # wraps each kernel call (native_call_*)
                calls += t
            elif e.name == "Method::execute":
                per["(method)"] += t
            else:
                per[e.name.removeprefix("native_call_")] += t
                kernels += t if e.name.startswith(("native_call_", "toolchain::")) else 0.0
        per["(dispatch)"] += calls - kernels
    return {k: dict(v) for k, v in out.items()}


def buckets(ops: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for stage, per in ops.items():
        b: dict[str, float] = defaultdict(float)
        for op, sec in per.items():
            if op != "(method)":
                b["dispatch" if op == "(dispatch)" else _bucket(op)] += sec
        out[stage] = {k: round(v, 4) for k, v in sorted(b.items())}
    return out


def top_ops(ops: dict[str, dict[str, float]], n: int = 12) -> dict[str, list]:
    return {stage: [[op, round(sec, 4)] for op, sec in sorted(per.items(), key=lambda kv: -kv[1])[:n]]
            for stage, per in ops.items()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program", type=Path, required=True)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--init", default="random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-ops", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pdir = ProgramDir(args.program)
    config = MemoryBenchConfig(model=args.model, init=args.init, seed=args.seed, threads=args.threads,
                               modes=("mesp", "executorch"), program_dir=args.program, rank=pdir.lora_config.rank,
                               alpha=pdir.lora_config.alpha, targets=pdir.lora_config.targets,
                               **program_settings(args.program))
    if config.quant != "none":
        # as bench memory's `prepare`: the quantized file from the float32 shards if cached, else streamed (an
        # entry holding only the quantized file is enough)
        cache = weights_cache_dir(default_cache_dir(), args.model, args.init, args.seed)
        ensure_quantized(cache, config.quant, config.quant_group, head=config.quant_head, model=args.model,
                         init=args.init, seed=args.seed)
    else:
        cache = ensure_weights_cache(default_cache_dir(), args.model, args.init, args.seed)
    spec = worker_spec(config, cache, pdir.arch.layers)
    s = worker_setup(spec)
    from toolchain.runtime.program_runtime import open_runtime

    roles = {n: m.role for n, m in pdir.methods.items()}
    runtime = _TimedRuntime(open_runtime(pdir, "executorch", threads=args.threads), roles, _Clock())
    doc = {"program": str(args.program), "model": args.model, "threads": args.threads, "repeat": args.repeat,
           "host": host_info(), "stages": stage_times(spec, s, pdir, runtime, args.repeat)}
    if not args.no_ops:
        e_ops, p_ops = eager_ops(spec, s), program_ops(spec, s, pdir)
        doc["buckets"] = {"mesp": buckets(e_ops), "executorch": buckets(p_ops)}
        doc["top_ops"] = {"mesp": top_ops(e_ops), "executorch": top_ops(p_ops)}
    print(format_report(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def stage_times(spec: dict, s, pdir: ProgramDir, runtime: _TimedRuntime, repeat: int) -> dict:
    """Part 1 of the module docstring (`runtime`'s clock is swapped per round)."""
    clocks: dict[str, _Clock] = {}
    program = _program_step(spec, s, pdir, runtime)
    eager_warm = _eager_step(spec, s, _Clock())
    eager_warm()
    program()
    rounds: dict[str, list[dict]] = {"mesp": [], "executorch": []}
    losses = {}
    for k in range(repeat):
        for mode in (("mesp", "executorch") if k % 2 == 0 else ("executorch", "mesp")):
            clock = clocks[mode] = _Clock()
            runtime.clock = clock
            step = _eager_step(spec, s, clock) if mode == "mesp" else program
            t0, c0 = time.perf_counter(), time.process_time()
            losses[mode] = step()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            r = {"step_s": wall, "step_cpu_s": cpu}
            for st in STAGES[:-1]:
                r[st] = (clock.wall.get(st, 0.0), clock.cpu.get(st, 0.0), clock.calls.get(st, 0))
            r["driver"] = (wall - sum(clock.wall.values()), cpu - sum(clock.cpu.values()), 0)
            rounds[mode].append(r)
    out = {}
    for mode, rs in rounds.items():
        med = {"step_s": round(statistics.median(r["step_s"] for r in rs), 3),
               "step_s_runs": [round(r["step_s"], 3) for r in rs],
               "step_cpu_s": round(statistics.median(r["step_cpu_s"] for r in rs), 3),
               "step_cpu_s_runs": [round(r["step_cpu_s"], 3) for r in rs], "loss": losses[mode], "stages": {}}
        for st in STAGES:
            med["stages"][st] = {"wall_s": round(statistics.median(r[st][0] for r in rs), 4),
                                 "cpu_s": round(statistics.median(r[st][1] for r in rs), 4), "calls": rs[0][st][2]}
        out[mode] = med
    return out


def format_report(doc: dict) -> str:
    st = doc["stages"]
    e, p = st["mesp"], st["executorch"]
    lines = [f"step (median of {doc['repeat']}): eager {e['step_s']:.3f} s (cpu {e['step_cpu_s']:.3f}), program "
             f"{p['step_s']:.3f} s (cpu {p['step_cpu_s']:.3f}): {p['step_s'] / e['step_s']:.3f}x wall, "
             f"{p['step_cpu_s'] / e['step_cpu_s']:.3f}x cpu; losses {e['loss']:.6f} / {p['loss']:.6f}",
             f"{'stage':<16}{'calls':>6}{'eager s':>10}{'program s':>11}{'ratio':>8}{'diff s':>9}"]
    for name in STAGES:
        a, b = e["stages"][name], p["stages"][name]
        ratio = f"{b['cpu_s'] / a['cpu_s']:.3f}" if a["cpu_s"] > 1e-4 else "-"
        lines.append(f"{name:<16}{max(a['calls'], b['calls']):>6}{a['cpu_s']:>10.3f}{b['cpu_s']:>11.3f}{ratio:>8}"
                     f"{b['cpu_s'] - a['cpu_s']:>+9.3f}")
    for mode in ("mesp", "executorch"):
        for stage, b in doc.get("buckets", {}).get(mode, {}).items():
            lines.append(f"{mode:<11}{stage:<15}" + "  ".join(f"{k} {v:.3f}" for k, v in b.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
