"""Programs on the aarch64 ExecuTorch runtime (under qemu-aarch64) against the x86 runtime: the Python half of
scripts/check_arm64.sh, which installs the tools, fetches the aarch64 executorch wheel and builds the drivers.

The driver on both sides is ios/hostcheck/module_check.cpp (the apps' C++ `Module`, as the Swift `Module` calls it)
plus the app's kernel probe, built stock and fused (with toolchain/native/kernels.cpp): for aarch64 against the
aarch64 wheel, run under `qemu-aarch64 -cpu C -L SYSROOT`; for x86 natively against the venv's executorch wheel
(the same C++ Module code, the same layer loop, only the ISA differs; the Python bindings would add a second code
path, one shared arena, that the comparison does not need). Both are driven by the host's layer loop
(toolchain/runtime/loop.py, evaluate.py, generate.py) through `AppModuleRuntime` (ios/hostcheck/check.py).

A session is: training steps (a full-backprop step, then LCSB steps whose layers are chosen at run time), an eval
pass and a greedy generation. `trace DIR` runs the steps of a recorded trace (shared_schemas/traces/*/trace.json);
`program DIR` runs STEPS steps on random rows of the program's vocabulary. Every case runs on x86 once and on
aarch64 at each CPU level, and compares aarch64 with x86 (and, for a trace, the x86 run with the recorded trace).

Exact (must be equal): the kernel probe's answer (registered in the fused build, missing in the stock one), the
number of calls and their method names (layer loop decisions do not depend on values), eval's target-token count,
and every greedy id whose x86 logit margin (top-1 minus top-2) exceeds twice the logit bound; after the first
position whose margin does not, the rest of the generation is not compared (its prefix differs legitimately).
The integer kernel sums (int8 x int4 dot products, exact in any order) are checked by scripts/check_kernel_arm64.sh.

Bounded (derived, not fitted). XNNPACK's NEON and AVX kernels, and the optimized/portable kernels' vectorized
loops, sum the same terms in different orders (and fuse multiply-adds differently). A float dot product of
length n, in any order, lies within gamma_n * sum|a_i b_i| of the exact value, gamma_n = n u / (1 - n u) ~ n u
(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1); two orders differ by at most
twice that. Each compared value q depends on a chain of reductions (matmuls, norms, softmax sums, the loss's
log-sum-exp and token mean); first order, relative errors add along the chain, so
    |q_arm64 - q_x86| <= 2 * u * N(q) * scale(q)
with scale(q) = max |q_x86| over the compared tensor (normwise; the worst-case n of gamma_n stands in for the
typical sqrt(n) ratio of sum|a b| to |sum a b|) and N(q) the sum of the reduction lengths on q's chain
(d = hidden, hd = head_dim, qd = heads * hd, I = intermediate, T = seq_len, V = vocab, r = LoRA rank, L = layers):
    forward of a layer  n_f = 2 d (two RMSNorms) + 2 d + r (q/k/v and gate/up projections with LoRA)
                              + hd (q.k) + T (softmax sum, P.V) + qd (o_proj) + I (down_proj) [+ hd: q/k norms]
    backward of a layer n_b = n_f + T (LoRA weight gradients sum over the T tokens)
    head                n_h = 2 d (norm, logits) + V (log-sum-exp) + T (token mean)
    a training step     N_step = L (n_f + n_b) + n_h
    loss of step s      N = s N_step + L n_f + n_h        (the state it sees carries s steps of differences)
    state after step s  N = (s + 1) N_step                  scale: max |entry| per state entry (param, Adam m, v)
    eval loss           N = S N_step + L n_f + n_h         (S train steps before it)
    generation logits   N = S N_step + L n_f + 2 d         (scale: max |logits|)
u = 2^-24 (float32). An fp16 program (`compute: fp16`) multiplies its frozen weights in float16 (mesp/ops/half.py:
rows scaled to max |x| = 1, float16 operands, slices of at most 256 columns per product, summed in float32). The
bound adds one float16 rounding (u = 2^-11) per product on the chain (4 per layer forward: q/k/v, o, gate/up, down;
4 backward), the rounding of the operands and of the product with float32 accumulation inside it. XNNPACK's f16
GEMMs accumulate in float16 within a slice (NEON FP16 arithmetic on FEAT_FP16 CPUs: -cpu max, cortex-a76; on x86
its F16C and AVX512-FP16 kernels round the accumulator to float16 after every multiply-add too), which that model
does not cover and whose worst case (256 x 2^-11 per product) bounds nothing: on FEAT_FP16 CPUs an fp16 program
gets the exact checks against x86, and the fp16 gradient check below is its accuracy check, on every CPU; on
cortex-a53 (no FP16 arithmetic) it is compared in full as well.
Adam: step t's update lr m_hat / sqrt(v_hat) is at most c_t lr in size (`adam_factor`) and, to first order, has
the relative error dm / |m| + dv / (2 v) of the x86 moments; each param element may also differ by the sum over
the steps of lr min(2 c_t, c_t (dm / |m| + dv / (2 v))) (`adam_allowance`): nothing to speak of where the
gradient's sign is decided, up to 2 c_t lr where the first moment is within its own bound of zero. The case line
counts the param values past the normwise bound that this allowance accepted.
The fused generation (int8 activations: discontinuous in its input) is compared in lockstep, call by call on the
same inputs (`LockstepRuntime`), besides the free run's exact checks.

An int8 program (`compute: int8`: every frozen-weight product through the toolchain's int4 x int8 kernels,
activations and dY rounded to int8 per row and block) needs the kernels: the stock driver must refuse it at load
(`Missing operator: toolchain::...`, on x86 and on every CPU level: that is the case's pass). The fused driver runs
it; its kernels give the same bits on every ISA, but their int8 inputs come from XNNPACK / portable float ops that
sum in another order on aarch64, and one ulp there can move an activation across a rounding boundary: a jump of one
quantum (1/127 of its block's max) that no summation-order bound covers. So, as for fp16 on FEAT_FP16, an int8
program gets the exact checks against x86 (calls, probe, eval tokens, the fused generation in lockstep), and its
accuracy check is the gradient check below.

With `--fp32-twin DIR` (the same export with --compute fp32, SGD, the same seed), the documented gradient bound of
the program's compute is checked on aarch64: one SGD step from the same state on the same row, gradient = state
change / lr, LoRA gradient cosine and relative L2 error against the twin's:
  fp16: cosine >= 0.9999, rel L2 <= 1e-2 (docs/benchmarks.md "fp16 compute", tests/mesp/ops/test_half.py,
        tests/export/test_compute_fp16.py);
  int8: cosine >= 0.999, rel L2 <= 5e-2 (docs/benchmarks.md "Compute int8", tests/mesp/ops/test_int8.py), and the
        aarch64 int8 gradient against x86's int8 gradient (same program, same step): each lies within the angle
        arccos(0.999) of the float32 gradient (the twins' float32 gradients on the two ISAs differ by a float32
        summation bound, ~1e-5 relative here), so the two are within twice that angle of each other:
        cosine >= cos(2 arccos 0.999) = 2 * 0.999^2 - 1 = 0.996002.

    python scripts/arm64_runtime.py trace DIR --drivers DIR --qemu Q --sysroot S [--cpus max,cortex-a76,cortex-a53]
    python scripts/arm64_runtime.py program DIR --drivers DIR --qemu Q --sysroot S [--steps 5] [--fp32-twin DIR]

--drivers holds module_check-{arm64,x86}-{stock,fused}. Prints one line per case ("arm64: PASS ..." or
"arm64: FAIL ..."), the details with --verbose, and the counts to --counts FILE ("passed failed"). Exit 0 when
every case passed, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ios" / "hostcheck"))

import torch  # noqa: E402

U32 = 2.0 ** -24
U16 = 2.0 ** -11
FP16_PRODUCTS = 4      # q/k/v, o_proj, gate/up, down_proj on a layer's chain (forward; their transposes backward)
KERNEL = "toolchain::int4_linear_a8.out"
DEFAULT_CPUS = ("max", "cortex-a76", "cortex-a53")
# qemu CPU models with FEAT_FP16 (ARMv8.2-A half-precision arithmetic). On the others (cortex-a53: ARMv8.0) an
# fp16 program either loads and runs (then it is compared like any other) or is refused when its methods load with
# Error::Internal (0x1) from XNNPACK's init, the code the apps map to the "--compute fp32" message (android
# ExecuTorchRuntime.kt `load`, ios ExecuTorchRuntime.swift `load`, Compute.loadFailure); anything else fails.
FP16_CPUS = ("max", "cortex-a76", "neoverse-n1", "a64fx", "cortex-a710", "neoverse-v1", "neoverse-n2")


# ---------------------------------------------------------------- what a session does

@dataclass
class Plan:
    rows: list                     # [(input_ids, labels)] padded to seq_len (int64)
    train: list                    # [(row index, selected layers)]
    eval_rows: list                # [(input_ids, labels)] padded
    prompt: list[int]
    new_tokens: int
    lr: float
    layers_per_checkpoint: int = 1


def _pad(row: dict, s: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((s,), pad, dtype=torch.int64)
    labels = torch.full((s,), -100, dtype=torch.int64)
    ids[:len(row["input_ids"])] = torch.tensor(row["input_ids"])
    labels[:len(row["labels"])] = torch.tensor(row["labels"])
    return ids, labels


def plan_from_trace(trace: dict) -> Plan:
    s, pad = trace["seq_len"], trace["pad_token_id"]
    rows = [_pad(r, s, pad) for r in trace["rows"]]
    train, eval_rows, prompt, new = [], [], [], 0
    for st in trace["steps"]:
        if st["kind"] == "train":
            train.append((st["row"], tuple(st["selected"])))
        elif st["kind"] == "eval":
            eval_rows = [_pad(trace["eval_rows"][i], s, pad) for i in st["rows"]]
        else:
            prompt, new = list(st["prompt_ids"]), int(st["max_new_tokens"])
    return Plan(rows, train, eval_rows, prompt, new, float(trace["lr"]), trace.get("layers_per_checkpoint", 1))


def lcsb_selections(layers: int, steps: int) -> list[tuple[int, ...]]:
    """Step 0 backpropagates every layer; the others are LCSB phases: k = max(1, L // 2) layers, the window
    moving down by k each step (cyclic, as `--lcsb-policy cyclic`), so every layer is selected and unselected
    layers below the lowest selected one get block_skip_update."""
    k = max(1, layers // 2)
    out = [tuple(range(layers))]
    for s in range(1, steps):
        top = (layers - 1 - (s - 1) * k) % layers
        out.append(tuple(sorted({(top - j) % layers for j in range(k)})))
    return out


def plan_for_program(pdir, steps: int, seed: int = 0) -> Plan:
    s, vocab, pad = pdir.seq_len, pdir.arch.vocab, pdir.pad_token_id
    g = torch.Generator().manual_seed(seed)

    def row(n: int, prompt_part: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, vocab, (n,), generator=g)
        labels = ids.clone()
        labels[:prompt_part] = -100
        return _pad({"input_ids": ids.tolist(), "labels": labels.tolist()}, s, pad)

    rows = [row(s - (i % 3), 3 * (i % 2)) for i in range(4)]         # some shorter than T, some with a prompt part
    train = [(i % len(rows), sel) for i, sel in enumerate(lcsb_selections(pdir.arch.layers, steps))]
    eval_rows = [row(s - 1, 0), row(max(2, s // 2), 1)]
    prompt = torch.randint(0, vocab, (min(5, max(1, s - 4)),), generator=g).tolist()
    gen = pdir.generate
    new = min(6, (gen.max_tokens if gen is not None else s) - len(prompt))
    return Plan(rows, train, eval_rows, prompt, new, lr=1e-2)


@dataclass
class Result:
    losses: list[float] = field(default_factory=list)
    states: list[torch.Tensor] = field(default_factory=list)
    eval_loss: float = float("nan")
    eval_tokens: int = 0
    ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    called: list[str] = field(default_factory=list)
    probe: str = ""
    seconds: float = 0.0
    lockstep: list = field(default_factory=list)    # [(method, diff / bound, x86 margin or None, argmax equal)]


class QemuModuleRuntime:
    """check.py's AppModuleRuntime (the app's C++ Module over a pipe), started under a command prefix
    (`qemu-aarch64 -cpu C -L SYSROOT`, or none for the native x86 build); records the calls and the
    generation's logits."""

    def __init__(self, prefix: list[str], binary: Path, pte: Path, methods: list[str]) -> None:
        from check import AppModuleRuntime

        self.inner = AppModuleRuntime.__new__(AppModuleRuntime)
        self.log = tempfile.TemporaryFile()      # the runtime's log lines; shown when a call fails
        self.inner.proc = subprocess.Popen([*prefix, str(binary), str(pte), *methods], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=self.log)
        self.inner.calls, self.inner.called, self.inner.methods_loaded = 0, [], tuple(methods)
        self.methods_loaded = tuple(methods)
        self.logits: list[torch.Tensor] = []

    def execute(self, method, inputs):
        try:
            outs = self.inner.execute(method, inputs)
        except (RuntimeError, struct.error, BrokenPipeError) as e:
            raise RuntimeError(f"{method}: {e}; the runtime said: {self.log_tail()}") from None
        if method.startswith("head_logits"):
            self.logits.append(outs[0].reshape(-1).clone())
        return outs

    @property
    def called(self) -> list[str]:
        return self.inner.called

    def log_tail(self, n: int = 3) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().decode(errors="replace").splitlines() if ln.startswith("E ") or "failed" in ln]
        return " | ".join(lines[-n:]) or "(nothing)"

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.log.close()


class LockstepRuntime:
    """The fused generation on aarch64 and x86 on the same inputs, call by call: each call goes to both drivers,
    the loop goes on with x86's outputs, and each float output of aarch64 is compared with x86's under the bound
    of that one call, 2 u N(method) max|out|: N = n_f for a layer's prefill/decode, 2 d for head_logits, 0 for the
    embeddings (a row lookup and one multiply: exact)."""

    def __init__(self, x86: "QemuModuleRuntime", arm: "QemuModuleRuntime", pdir, ch: "Chains") -> None:
        self.x86, self.arm, self.pdir, self.ch = x86, arm, pdir, ch
        self.methods_loaded = x86.methods_loaded
        self.records: list = []

    def _n(self, method: str) -> float:
        role = self.pdir.methods[method].role
        if role.startswith("embed"):
            return 0.0
        if role == "head_logits":
            return 2.0 * self.pdir.arch.hidden
        return self.ch.n_f

    def execute(self, method, inputs):
        ref = self.x86.execute(method, inputs)
        got = self.arm.execute(method, inputs)
        worst, margin, same = 0.0, None, None
        for a, b in zip(got, ref):
            if not b.is_floating_point():
                worst = max(worst, 0.0 if torch.equal(a, b) else math.inf)
                continue
            diff = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
            bound = rel_bound(self._n(method)) * float(b.double().abs().max())
            worst = max(worst, diff / bound if bound > 0 else (0.0 if diff == 0 else math.inf))
        if self.pdir.methods[method].role == "head_logits":
            top = torch.topk(ref[0].reshape(-1).double(), 2)
            margin = float(top.values[0] - top.values[1])
            bound = rel_bound(self._n(method)) * float(ref[0].double().abs().max())
            same = int(got[0].reshape(-1).argmax()) == int(top.indices[0]) if margin > 2 * bound else None
        self.records.append((method, worst, margin, same))
        return ref


def run_session(pdir, prefix: list[str], binary: Path, fused: bool, plan: Plan,
                lockstep: tuple[Path, torch.Tensor] | None = None) -> Result:
    from toolchain.text.dataset import DataRow
    from toolchain.runtime.evaluate import evaluate_program
    from toolchain.runtime.generate import generate
    from toolchain.runtime.loop import LayerLoop
    from toolchain.runtime.program_runtime import role_methods

    res = Result()
    t0 = time.perf_counter()
    probe = subprocess.run([*prefix, str(binary), "--probe", KERNEL], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"{' '.join([*prefix, binary.name])} --probe exited {probe.returncode}: "
                           f"{(probe.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    res.probe = probe.stdout.strip()
    methods = role_methods(pdir, "all", fused=fused)
    runtime = QemuModuleRuntime(prefix, binary, pdir.path / pdir.programs[pdir.targets[0]].file, methods)
    try:
        loop = LayerLoop(pdir, runtime)
        state = pdir.state_init()
        for row, selected in plan.train:
            ids, labels = plan.rows[row]
            res.losses.append(loop.train_step(ids, labels, plan.lr, state, selected=selected,
                                              layers_per_checkpoint=plan.layers_per_checkpoint))
            res.states.append(state.clone())
        if plan.eval_rows:
            ev = evaluate_program(pdir, runtime, state, [DataRow(*r) for r in plan.eval_rows], loop=loop)
            res.eval_loss, res.eval_tokens = ev["loss"], ev["tokens"]
        if plan.new_tokens > 0 and pdir.generate is not None:
            res.ids = generate(pdir, runtime, state, plan.prompt, plan.new_tokens, loop=loop).output_ids
        res.logits = runtime.logits
        res.called = list(runtime.called)
        if lockstep is not None and res.ids:
            x86_binary, x86_state = lockstep
            x86 = QemuModuleRuntime([], x86_binary, pdir.path / pdir.programs[pdir.targets[0]].file, methods)
            try:
                pair = LockstepRuntime(x86, runtime, pdir, Chains.of(pdir))
                generate(pdir, pair, x86_state.clone(), plan.prompt, plan.new_tokens, loop=LayerLoop(pdir, pair))
                res.lockstep = pair.records
            finally:
                x86.close()
    finally:
        runtime.close()
    res.seconds = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------- the bounds

@dataclass
class Chains:
    """Reduction lengths of the program's chains (module docstring), in float32 terms: an fp16 program's
    float16 roundings of its frozen-weight products count U16 / U32 terms each."""
    n_f: float
    n_b: float
    n_h: float
    layers: int

    @classmethod
    def of(cls, pdir) -> "Chains":
        a, T, r = pdir.arch, pdir.seq_len, pdir.lora_config.rank
        d, hd, qd, I = a.hidden, a.head_dim, a.heads * a.head_dim, a.intermediate
        n_f = 2 * d + 2 * d + r + hd + T + qd + I + (hd if a.qk_norm else 0)
        fp16 = getattr(pdir.spec, "compute", "fp32") == "fp16"
        # fp16: each of a layer's FP16_PRODUCTS frozen-weight products is rounded to float16 once (float16 operands,
        # float32 accumulation): one float16 rounding, worth U16 / U32 float32 terms, on the chain per product
        extra = FP16_PRODUCTS * (U16 / U32) if fp16 else 0.0
        n_f_eff = n_f + extra
        n_b_eff = n_f_eff + T
        return cls(n_f_eff, n_b_eff, 2 * d + a.vocab + T, a.layers)

    @property
    def step(self) -> float:
        return self.layers * (self.n_f + self.n_b) + self.n_h

    def loss(self, s: int) -> float:
        return s * self.step + self.layers * self.n_f + self.n_h

    def state(self, s: int) -> float:
        return (s + 1) * self.step

    def logits(self, steps: int, d: int) -> float:
        return steps * self.step + self.layers * self.n_f + 2 * d


def rel_bound(n: float) -> float:
    return 2.0 * U32 * n


def adam_factor(t: int, betas: tuple[float, float]) -> float:
    """max |m_hat / sqrt(v_hat)| after t Adam steps over any gradients (Cauchy-Schwarz on the two moments'
    weights): 1 at t = 1, 1.0014 at t = 2, about 7.3 for large t with betas (0.9, 0.999)."""
    b1, b2 = betas
    w = [(1 - b1) * b1 ** (t - i) / (1 - b1 ** t) for i in range(1, t + 1)]
    u = [(1 - b2) * b2 ** (t - i) / (1 - b2 ** t) for i in range(1, t + 1)]
    return math.sqrt(sum(wi * wi / ui for wi, ui in zip(w, u)))


def adam_allowance(ref_states: list[torch.Tensor], s: int, m_entry, v_entry, ch: "Chains", lr: float,
                   betas: tuple[float, float]) -> torch.Tensor:
    """Per element of an Adam-driven param after step s: what the updates of steps 0..s may add to its difference.
    Step t's update is lr * m_hat / (sqrt(v_hat) + eps), at most c_t = adam_factor(t + 1) in size; to first order its
    relative error is dm / |m| + dv / (2 v), dm and dv the normwise bounds of the x86 moments after step t. So the
    update differs by at most lr * min(2 c_t, c_t (dm / |m| + dv / (2 v))): about nothing where the gradient's sign is
    decided, up to 2 lr c_t where the moment is within its own bound of zero (a near-zero gradient)."""
    total = torch.zeros(m_entry.numel, dtype=torch.float64)
    for t in range(s + 1):
        m = ref_states[t][m_entry.offset:m_entry.offset + m_entry.numel].double()
        v = ref_states[t][v_entry.offset:v_entry.offset + v_entry.numel].double()
        r = rel_bound(ch.state(t))
        dm, dv = r * float(m.abs().max()), r * float(v.abs().max())
        c = adam_factor(t + 1, betas)
        with torch.no_grad():
            rel = dm / m.abs() + dv / (2 * v)            # inf where a moment is 0
        total += lr * torch.clamp(c * rel.nan_to_num(nan=math.inf), max=2 * c)
    return total


# ---------------------------------------------------------------- comparison

@dataclass
class Verdict:
    ok: bool = True
    lines: list[str] = field(default_factory=list)
    worst: float = 0.0       # largest observed / bound over the bounded checks
    worst_at: str = ""

    def exact(self, what: str, same: bool, detail: str = "") -> None:
        self.ok &= same
        if not same:
            self.lines.append(f"{what}: differs {detail}".rstrip())

    def bounded(self, what: str, diff: float, bound: float) -> None:
        ratio = diff / bound if bound > 0 else (0.0 if diff == 0 else math.inf)
        if ratio >= self.worst:
            self.worst, self.worst_at = ratio, what
        if not ratio <= 1.0:
            self.ok = False
            self.lines.append(f"{what}: |diff| {diff:.3e} > bound {bound:.3e}")


def compare(pdir, ref: Result, got: Result, plan: Plan, fused: bool, lr: float,
            floats: bool = True) -> tuple[Verdict, dict]:
    """aarch64 `got` against x86 `ref`. `floats` False: only the exact checks (an fp16 program on a CPU with
    FEAT_FP16, whose float16-accumulating GEMMs have no usable summation-order bound, or an int8 program, whose
    int8 roundings are discontinuous in their float inputs: twin_gradient_check is their accuracy check)."""
    v = Verdict()
    ch = Chains.of(pdir)
    v.exact("kernel probe", got.probe == ("registered" if fused else "missing"), got.probe)
    v.exact("calls", got.called == ref.called, f"({len(got.called)} vs {len(ref.called)})")
    stats = {"loss_equal": 0, "state_equal": 0, "adam_fallback_entries": 0,
             "loss_equal_n": sum(a == b for a, b in zip(got.losses, ref.losses))}
    if not floats:
        v.exact("step count", len(got.losses) == len(ref.losses) == len(plan.train))
        v.exact("eval tokens", got.eval_tokens == ref.eval_tokens)
        stats["loss_equal"] = stats["loss_equal_n"]
        stats["state_equal"] = sum(torch.equal(a, b) for a, b in zip(got.states, ref.states))
        stats["ids_compared"] = "0 (not bounded)"
        stats["ids_equal"] = got.ids == ref.ids
        if fused:
            _lockstep(v, got, ref, stats)
        return v, stats
    entries = pdir.state_entries
    adam = any(e.role == "exp_avg" for e in entries)
    for s, (a, b) in enumerate(zip(got.losses, ref.losses)):
        stats["loss_equal"] += a == b
        v.bounded(f"loss {s}", abs(a - b), rel_bound(ch.loss(s)) * abs(b))
    moments = {(e.key, e.role): e for e in entries}
    betas = pdir.optimizer.betas
    for s, (a, b) in enumerate(zip(got.states, ref.states)):
        stats["state_equal"] += torch.equal(a, b)
        bound_rel = rel_bound(ch.state(s))
        for e in entries:
            x, y = a[e.offset:e.offset + e.numel].double(), b[e.offset:e.offset + e.numel].double()
            if not e.numel:
                continue
            diff = (x - y).abs()
            bound = bound_rel * float(y.abs().max())
            if adam and e.role == "param":
                extra = adam_allowance(ref.states, s, moments[(e.key, "exp_avg")], moments[(e.key, "exp_avg_sq")],
                                       ch, lr, betas)
                stats["adam_fallback_entries"] += int((diff > bound).sum())
                ratio = float((diff / (bound + extra)).max())
                v.bounded(f"state {s} {e.name}", ratio, 1.0)
            else:
                v.bounded(f"state {s} {e.name}", float(diff.max()), bound)
    v.exact("step count", len(got.losses) == len(ref.losses) == len(plan.train))
    if plan.eval_rows:
        v.exact("eval tokens", got.eval_tokens == ref.eval_tokens)
        v.bounded("eval loss", abs(got.eval_loss - ref.eval_loss),
                  rel_bound(ch.loss(len(plan.train))) * abs(ref.eval_loss))
    compared = 0
    if fused:
        # int8 activations (A8) make the fused generation discontinuous in its input: in the free run an upstream
        # difference of one ulp can move an activation across a rounding boundary. The fused generation is
        # therefore compared in lockstep (same inputs on both sides, LockstepRuntime), call by call.
        _lockstep(v, got, ref, stats)
        return v, stats
    for i, (lg_ref, lg_got) in enumerate(zip(ref.logits, got.logits)):
        bound = rel_bound(ch.logits(len(plan.train), pdir.arch.hidden)) * float(lg_ref.abs().max())
        v.bounded(f"logits {i}", float((lg_got.double() - lg_ref.double()).abs().max()), bound)
        top = torch.topk(lg_ref.double(), 2).values
        margin = float(top[0] - top[1])
        if margin <= 2 * bound or i >= len(ref.ids):
            break                       # undecided by the bound: this id and the rest are not compared
        v.exact(f"greedy id {i}", got.ids[i] == ref.ids[i], f"{got.ids[i]} vs {ref.ids[i]} (margin {margin:.3e})")
        compared += 1
        if got.ids[i] != ref.ids[i]:
            break
    stats["ids_compared"] = f"{compared}/{len(ref.ids)}"
    stats["ids_equal"] = got.ids == ref.ids
    return v, stats


def _lockstep(v: Verdict, got: Result, ref: Result, stats: dict) -> None:
    v.exact("lockstep generation ran", bool(got.lockstep) or not ref.ids)
    compared = 0
    for i, (method, ratio, margin, same) in enumerate(got.lockstep):
        v.bounded(f"lockstep call {i} {method}", ratio, 1.0)
        if same is not None:
            compared += 1
            v.exact(f"lockstep argmax {i}", same, f"(x86 margin {margin:.3e})")
    stats["ids_compared"] = f"{compared}/{sum(1 for r in got.lockstep if r[2] is not None)} lockstep"
    stats["ids_equal"] = got.ids == ref.ids


# the documented gradient bound of each reduced-precision compute against its float32 twin: (cosine min, rel L2 max)
TWIN_BOUNDS = {"fp16": (0.9999, 1e-2), "int8": (0.999, 5e-2)}


def _compute(pdir) -> str:
    return getattr(pdir.spec, "compute", "fp32")


def _sgd_gradient(pdir, prefix, binary: Path, fused: bool, plan: "Plan", init: torch.Tensor) -> torch.Tensor:
    r = run_session(pdir, prefix, binary, fused, plan)
    return (init.double() - r.states[0].double()) / plan.lr


def _cosine_rel(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """cosine of b against a and b's relative L2 error against a"""
    return float(a @ b / (a.norm() * b.norm())), float((b - a).norm() / a.norm())


def twin_gradient_check(pdir, pdir32, prefix, drivers: Path, lr: float = 1e-3,
                        x86_gradient: torch.Tensor | None = None) -> tuple[bool, str]:
    """One SGD step of the fp16 / int8 program and of its fp32 twin from the same state on the same row, both on
    aarch64 (`prefix`): gradient = (state_init - state) / lr against TWIN_BOUNDS; for int8 also against the x86
    int8 gradient `x86_gradient` (cosine >= 2 c^2 - 1, module docstring)."""
    compute = _compute(pdir)
    if compute not in TWIN_BOUNDS:
        return False, f"{pdir.path} computes in {compute}; --fp32-twin checks an fp16 or int8 program"
    for p in (pdir, pdir32):
        if p.optimizer.kind != "sgd":
            return False, f"{p.path} uses {p.optimizer.kind}; the gradient check needs SGD (state change = -lr g)"
    if _compute(pdir32) != "fp32":
        return False, f"{pdir32.path} computes in {_compute(pdir32)}; the twin must be an fp32 program"
    plan = twin_plan(pdir, lr)
    init = pdir32.state_init()
    if not torch.equal(init, pdir.state_init()):
        return False, "the two programs' initial states differ (export both with the same --seed)"
    fused = compute == "int8"       # the int8 products are the toolchain's kernels: the fused driver has them
    g = _sgd_gradient(pdir, prefix, drivers / f"module_check-arm64-{'fused' if fused else 'stock'}", fused, plan, init)
    g32 = _sgd_gradient(pdir32, prefix, drivers / "module_check-arm64-stock", False, plan, init)
    cos_min, rel_max = TWIN_BOUNDS[compute]
    cos, rel = _cosine_rel(g32, g)
    ok = cos >= cos_min and rel <= rel_max
    msg = (f"{compute} vs fp32 gradient on aarch64: cosine {cos:.7f} (>= {cos_min}), rel L2 {rel:.2e} "
           f"(<= {rel_max:g})")
    if x86_gradient is not None:
        pair_min = 2 * cos_min ** 2 - 1
        cos_x, rel_x = _cosine_rel(x86_gradient, g)
        ok &= cos_x >= pair_min
        msg += f"; vs the x86 {compute} gradient: cosine {cos_x:.7f} (>= {pair_min:.6f}), rel L2 {rel_x:.2e}"
    return ok, msg


def twin_plan(pdir, lr: float) -> "Plan":
    plan = plan_for_program(pdir, 1)
    plan.lr, plan.eval_rows, plan.new_tokens = lr, [], 0
    return plan


def x86_int8_gradient(pdir, drivers: Path, lr: float = 1e-3) -> torch.Tensor:
    """The int8 program's gradient of twin_gradient_check's step, on the native x86 fused driver."""
    return _sgd_gradient(pdir, [], drivers / "module_check-x86-fused", True, twin_plan(pdir, lr), pdir.state_init())


# ---------------------------------------------------------------- cases

def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def trace_reference_check(trace: dict, pdir, ref: Result, fused: bool) -> Verdict:
    """The x86 run against the recorded trace: bit for bit where this host is the recording's CPU class, else
    within the same bounds (another x86 vector width also sums in another order)."""
    v = Verdict()
    ch = Chains.of(pdir)
    steps = [s for s in trace["steps"] if s["kind"] == "train"]
    for s, (st, loss, state) in enumerate(zip(steps, ref.losses, ref.states)):
        if _sha(state) != st["state_sha256"]:
            v.lines.append(f"x86 state {s} is not the trace's bit for bit")
        v.bounded(f"x86 loss {s} vs trace", abs(loss - st["loss"]), rel_bound(ch.loss(s)) * abs(st["loss"]))
    ev = next((s for s in trace["steps"] if s["kind"] == "eval"), None)
    if ev is not None:
        v.exact("x86 eval tokens vs trace", ref.eval_tokens == ev["tokens"])
        v.bounded("x86 eval loss vs trace", abs(ref.eval_loss - ev["loss"]),
                  rel_bound(ch.loss(len(steps))) * abs(ev["loss"]))
    gen = next((s for s in trace["steps"] if s["kind"] == "generate"), None)
    if gen is not None:     # where this run's margin decides them (the trace's own logits are this run's on its CPU)
        for i, (lg, want) in enumerate(zip(ref.logits, gen["output_ids"])):
            top = torch.topk(lg.double(), 2).values
            if float(top[0] - top[1]) <= 2 * rel_bound(ch.logits(len(steps), pdir.arch.hidden)) * float(lg.abs().max()):
                break
            v.exact(f"x86 greedy id {i} vs trace", ref.ids[i] == want, f"{ref.ids[i]} vs {want}")
            if ref.ids[i] != want:
                break
    if not fused:
        v.exact("x86 calls vs trace", ref.called == [c["method"] for c in trace["calls"]])
    return v


def _stock_refusals(name: str, pdir, plan: Plan, drivers: Path, qemu_prefix, cpus) -> tuple[int, int]:
    """An int8 program on the stock drivers (no toolchain kernels): x86 and every CPU level must refuse it at load,
    naming the missing toolchain operator, before any step runs."""
    passed = failed = 0
    for label, prefix in [("x86", []), *((f"-cpu {c}", [*qemu_prefix, "-cpu", c]) for c in cpus)]:
        isa = "x86" if not prefix else "arm64"
        try:
            res = run_session(pdir, prefix, drivers / f"module_check-{isa}-stock", False, plan)
        except RuntimeError as e:
            ok = "Missing operator" in str(e) and "toolchain::" in str(e)
            what = ("refused the int8 program at load as the apps expect (no toolchain kernels): "
                    if ok else "failed otherwise than by the missing toolchain kernels: ")
            print(f"arm64: {'PASS' if ok else 'FAIL'} {name} stock {label}: {what}{e}", flush=True)
        else:
            ok = False
            print(f"arm64: FAIL {name} stock {label}: the int8 program ran {len(res.called)} calls without the "
                  f"toolchain kernels", flush=True)
        passed, failed = passed + ok, failed + (not ok)
    return passed, failed


def run_cases(name: str, pdir, plan: Plan, drivers: Path, qemu_prefix, cpus, modes, trace=None,
              verbose=False, jobs=2) -> tuple[int, int]:
    passed = failed = 0
    half = _compute(pdir) == "fp16"
    int8 = _compute(pdir) == "int8"
    for mode in modes:
        fused = mode == "fused"
        if int8 and not fused:      # the int8 products are the toolchain's kernels: a stock runtime must refuse
            p, f = _stock_refusals(name, pdir, plan, drivers, qemu_prefix, cpus)
            passed, failed = passed + p, failed + f
            continue
        try:
            ref = run_session(pdir, [], drivers / f"module_check-x86-{mode}", fused, plan)
        except RuntimeError as e:
            failed += len(cpus)
            print(f"arm64: FAIL {name} {mode}: the x86 reference run failed: {e}", flush=True)
            continue
        base = Verdict()
        base.exact("x86 kernel probe", ref.probe == ("registered" if fused else "missing"), ref.probe)
        note = ""
        if trace is not None:
            tv = trace_reference_check(trace, pdir, ref, fused)
            base.ok &= tv.ok
            base.lines += tv.lines
            same = not any("bit for bit" in line for line in tv.lines)
            note = f"; x86 run {'=' if same else 'within the bounds of, not bit-equal to,'} the recorded trace"
        runs = {}
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:     # the CPU levels side by side
            for cpu in cpus:
                runs[cpu] = pool.submit(run_session, pdir, [*qemu_prefix, "-cpu", cpu],
                                        drivers / f"module_check-arm64-{mode}", fused, plan,
                                        (drivers / "module_check-x86-fused", ref.states[-1]) if fused else None)
        for cpu in cpus:
            fp16_refusal = half and cpu not in FP16_CPUS
            try:
                got = runs[cpu].result()
            except RuntimeError as e:
                ok = fp16_refusal and "load_method" in str(e) and "failed: 0x1" in str(e)
                passed += ok
                failed += not ok
                what = ("refused the fp16 program at load as the apps expect (no FEAT_FP16: Error::Internal 0x1): "
                        if ok else "")
                print(f"arm64: {'PASS' if ok else 'FAIL'} {name} {mode} -cpu {cpu}: {what}{e}", flush=True)
                continue
            floats = not (half and cpu in FP16_CPUS) and not int8
            v, stats = compare(pdir, ref, got, plan, fused, plan.lr, floats=floats)
            ok = v.ok and base.ok
            passed += ok
            failed += not ok
            print(f"arm64: {'PASS' if ok else 'FAIL'} {name} {mode} -cpu {cpu}: {len(got.called)} calls, "
                  f"losses equal {stats['loss_equal']}/{len(got.losses)}, states equal "
                  f"{stats['state_equal']}/{len(got.states)}, worst diff/bound "
                  f"{f'{v.worst:.2e} ({v.worst_at})' if v.worst_at else 'n/a'}, greedy ids "
                  f"{'equal' if stats['ids_equal'] else 'differ'} ({stats['ids_compared']} decided by the margin)"
                  + (f", {stats['adam_fallback_entries']} Adam param values past the normwise bound within their update allowance"
                     if stats["adam_fallback_entries"] else "")
                  + (", ran without FEAT_FP16 (float32 accumulation)" if fp16_refusal else "")
                  + ("; floats not bounded: float16 accumulation on FEAT_FP16, see the fp16 gradient check"
                     if not floats and half else "")
                  + ("; floats not bounded: int8 roundings of float inputs, see the int8 gradient check"
                     if int8 else "")
                  + note + f" [{got.seconds:.1f} s under qemu, x86 {ref.seconds:.1f} s]", flush=True)
            for line in (base.lines + v.lines) if (verbose or not ok) else []:
                print(f"         {line}")
    return passed, failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=["trace", "program"])
    p.add_argument("dir", type=Path)
    p.add_argument("--drivers", type=Path, required=True)
    p.add_argument("--qemu", required=True)
    p.add_argument("--sysroot", required=True)
    p.add_argument("--cpus", default=",".join(DEFAULT_CPUS))
    p.add_argument("--modes", default=None, help="stock,fused (default: fused too when the program has it)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--fp32-twin", type=Path, default=None)
    p.add_argument("--counts", type=Path, default=None)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="CPU levels run at once (default: cores)")
    a = p.parse_args(argv)

    from toolchain.errors import ToolchainError
    from toolchain.program import ProgramDir

    qemu_prefix = [a.qemu, "-L", a.sysroot]
    cpus = [c for c in a.cpus.split(",") if c]
    trace = None
    try:
        if a.kind == "trace":
            trace = json.loads((a.dir / "trace.json").read_text())
            if trace.get("format") != "toolchain-trace":
                raise ToolchainError(f"{a.dir / 'trace.json'} is not a toolchain trace (format {trace.get('format')!r}, "
                                     "expected 'toolchain-trace'): re-record it with scripts/record_trace.py")
            pdir = ProgramDir(a.dir / trace["program"])
            plan = plan_from_trace(trace)
            name = f"trace {a.dir.name}"
        else:
            pdir = ProgramDir(a.dir)
            if a.steps < 1:
                raise ToolchainError(f"--steps must be >= 1, got {a.steps}")
            plan = plan_for_program(pdir, a.steps)
            name = f"program {a.dir.name}"
        if pdir.spec and pdir.programs[pdir.targets[0]].target != "executorch":
            raise ToolchainError(f"{pdir.path}: its program is {pdir.programs[pdir.targets[0]].target}, not executorch")
        pte = pdir.path / pdir.programs[pdir.targets[0]].file
        if not pte.is_file():
            raise ToolchainError(f"{pte} is missing (a trace of a large program ships without it)")
        twin = ProgramDir(a.fp32_twin) if a.fp32_twin else None
    except (ToolchainError, OSError, ValueError, KeyError) as e:
        print(f"Error: {e}")
        return 2
    gen = pdir.generate
    # an int8 program's training methods call the toolchain's kernels: fused (and the stock refusal) either way
    has_fused = (gen is not None and gen.fused is not None) or _compute(pdir) == "int8"
    modes = a.modes.split(",") if a.modes else (["stock", "fused"] if has_fused else ["stock"])
    if "fused" in modes and not has_fused:
        print(f"Error: {pdir.path} has no fused generation methods (generate.fused); drop fused from --modes")
        return 2
    passed, failed = run_cases(name, pdir, plan, a.drivers, qemu_prefix, cpus, modes, trace, a.verbose, a.jobs)
    if twin is not None:
        compute = _compute(pdir)
        x86_g = None
        if compute == "int8":
            try:
                x86_g = x86_int8_gradient(pdir, a.drivers)
            except RuntimeError as e:
                print(f"arm64: FAIL {name} int8 gradient bound: the x86 int8 step failed: {e}", flush=True)
                failed += 1
        for cpu in cpus:
            try:
                ok, msg = twin_gradient_check(pdir, twin, [*qemu_prefix, "-cpu", cpu], a.drivers, x86_gradient=x86_g)
            except RuntimeError as e:
                ok = compute == "fp16" and cpu not in FP16_CPUS and "failed: 0x1" in str(e)
                msg = f"refused at load (no FEAT_FP16): {e}" if ok else str(e)
            passed += ok
            failed += not ok
            print(f"arm64: {'PASS' if ok else 'FAIL'} {name} {compute} gradient bound -cpu {cpu}: {msg}", flush=True)
    if a.counts:
        a.counts.write_text(f"{passed} {failed}\n")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
