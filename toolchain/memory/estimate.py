"""Analytic peak memory of one training step, by named parts: MeSP (`toolchain.mesp.step.mesp_step`),
and the MeBP / autograd baselines (`estimate_autograd.py`).

The model counts the tensors the step's code keeps alive at each candidate peak, then takes the
largest. Notation: T seq_len, d hidden, kv = kv_heads * head_dim, G query heads per kv head,
f intermediate, V vocab, L layers, C a token chunk (mlp_chunk or T; loss_chunk), Vc vocab_chunk, r rank.
MeSP candidates:

  forward, layer i   checkpoints x_0..x_i; attention one kv group at a time (n1, q, q_rope: 3 T*d;
                     k, k_rope, v: 3 T*kv; the last group's scores and softmax [G,T,T] x2 and the
                     [T,T] mask; the other groups' outputs), or the o projection (o, o regrouped, its
                     output + LoRA term + sum); then the MLP per chunk: x1, the chunk outputs done,
                     n2 and max(4 [C,f], 3 [C,f] + the down projection's outputs).
  loss (ce_online)   L checkpoints, x and hn, the scaled dh chunks done and the previous chunk's unscaled
                     dh, then per token chunk either the vocabulary loop (E[y], the running sum A: 2 [C,d];
                     ONE [C,Vc] logits block; seven [C,1] running vectors) or its end (A, E[y], A / S,
                     dh: 4 [C,d]); or the final torch.cat of dh.
  loss (ce_chunked)  (vocab_chunk None) as above with ONE [C,V] buffer per token chunk.
  final norm         L checkpoints, x, dh and four [T,d] temporaries of rmsnorm_backward.
  backward, layer i  checkpoints x_0..x_i, dout, the recomputed attention half (n1, q_rope, k_rope,
                     v, o, x1), and the largest of: the MLP chunk at swiglu_backward's dg (8 [C,f]:
                     g, u, the down projection's dx, sigmoid, du, two products, dg; n2 [C,d]; the dx
                     chunks done); attention_backward of the last kv group at ds (4 [G,T,T]: p, dp,
                     dp - rowsum, ds; the other groups' dq/dk/dv; dout, dx1, d_o); the q/k/v tail (11 [T,d]).
  end                every selected layer's gradients, when the step returns them (grads="all").
  everywhere         LoRA params, their grads (all selected layers' kept until the step returns, or
                     one layer's when the update is applied right after each layer), optimizer state
                     (AdamW: 2 moments), rope tables 2 [T, head_dim].

tests/memory/test_memory_estimate.py checks these counts against the live tensors of the real step
(overall and per phase, to 0.2%): when the step changes, that test says which count to update.
Not modelled: the few [T, r] LoRA transients, dequantization transients of int8/int4 weights
(`--program` memory plans include them), allocator slack and the runtime itself: the caller passes
`overhead_mb` (calibrated against `toolchain bench memory`, see docs/planner.md), reported as its own
part. Frozen weights are not counted (memory-mapped clean pages, which the phones' footprint does not
count). MB = 2^20 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from toolchain.errors import BadInput
from toolchain.lora.config import ALL_TARGETS
from toolchain.mesp.step import StepOptions
from toolchain.models.presets import Qwen25Arch

__all__ = ["BYTES_PER_MB", "METHODS", "StepShape", "MemoryEstimate", "estimate_peak", "largest_fitting"]

BYTES_PER_MB = 1 << 20
METHODS = ("mesp", "mebp", "autograd")
Method = Literal["mesp", "mebp", "autograd"]
Parts = dict[str, float]
_MLP = ("gate_proj", "up_proj", "down_proj")
_OPTIONS = StepOptions()


@dataclass(frozen=True)
class StepShape:
    """What the peak of a training step depends on.

    Args:
        seq_len: tokens per step, T.
        rank: LoRA rank.
        targets: adapted projections. Default: all seven.
        method: "mesp" (`mesp_step`), "mebp" (per-block checkpointing + autograd, full logits) or
            "autograd" (everything stored, full logits), as `toolchain bench memory` runs them.
            Default: "mesp".
        loss_chunk: tokens per LM-head chunk (StepOptions.loss_chunk; MeSP only). Default: StepOptions'.
        vocab_chunk: vocabulary entries per LM-head chunk (StepOptions.vocab_chunk: the online-softmax
            loss); None = whole rows (`ce_chunked`). Default: StepOptions'.
        mlp_chunk: tokens per MLP chunk in forward and backward (StepOptions.mlp_chunk); None = T.
            Default: StepOptions'.
        lcsb_k: layers backpropagated per step; the worst selection (the top k) is assumed (MeSP only).
        backward_layers: the exact selection (overrides lcsb_k).
        grads: "layer" drops each layer's gradients after its update (the exported program, `bench
            memory`); "all" keeps every selected layer's gradients until the step returns (eager
            `mesp_step` with keep_grads=True). MeBP and autograd always hold all. Default: "layer".
        optimizer: "adamw" adds two moments per LoRA parameter. Default: "sgd".
        dtype_bytes: bytes per activation and LoRA element. Default: 4 (fp32).
    """

    arch: Qwen25Arch
    seq_len: int
    rank: int
    targets: tuple[str, ...] = ALL_TARGETS
    method: Method = "mesp"
    loss_chunk: int = _OPTIONS.loss_chunk
    vocab_chunk: int | None = _OPTIONS.vocab_chunk
    mlp_chunk: int | None = _OPTIONS.mlp_chunk
    lcsb_k: int | None = None
    backward_layers: tuple[int, ...] | None = None
    grads: Literal["all", "layer"] = "layer"
    optimizer: Literal["sgd", "adamw"] = "sgd"
    dtype_bytes: int = 4

    def __post_init__(self) -> None:
        for name in ("seq_len", "rank", "loss_chunk", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1, got {getattr(self, name)}")
        for name in ("mlp_chunk", "vocab_chunk"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise BadInput(f"`{name}` must be >= 1 or None, got {getattr(self, name)}")
        if self.method not in METHODS:
            raise BadInput(f"unknown method {self.method!r}; choose {', '.join(METHODS)}")
        if self.lcsb_k is not None and not 1 <= self.lcsb_k <= self.arch.layers:
            raise BadInput(f"`lcsb_k` must be in 1..{self.arch.layers} (the layer count), got {self.lcsb_k}")
        if self.backward_layers is not None and not set(self.backward_layers) <= set(range(self.arch.layers)):
            raise BadInput(f"`backward_layers` must be within 0..{self.arch.layers - 1}")
        if self.method != "mesp" and (self.lcsb_k is not None or self.backward_layers is not None):
            raise BadInput(f"LCSB (`lcsb_k`, `backward_layers`) is modelled for mesp only, not {self.method}")
        unknown = [t for t in self.targets if t not in ALL_TARGETS]
        if unknown:
            raise BadInput(f"unknown LoRA target(s) {', '.join(unknown)}; choose from {','.join(ALL_TARGETS)}")

    def selected(self) -> list[int]:
        """Layers backpropagated, descending (the order backward visits them)."""
        if self.backward_layers is not None:
            return sorted(set(self.backward_layers), reverse=True)
        k = self.arch.layers if self.lcsb_k is None else self.lcsb_k
        return list(range(self.arch.layers - 1, self.arch.layers - 1 - k, -1))


@dataclass(frozen=True)
class MemoryEstimate:
    peak_mb: float                 # sum of parts_mb
    phase: str                     # where the peak is: "forward", "loss", "backward", ...
    layer: int | None              # the layer of a forward/backward peak
    parts_mb: dict[str, float]     # named parts of the peak (MB each)
    phases_mb: dict[str, float] = field(default_factory=dict)   # each phase's own peak

    def as_dict(self) -> dict:
        return {"peak_mb": self.peak_mb, "phase": self.phase, "layer": self.layer, "parts_mb": dict(self.parts_mb),
                "phases_mb": dict(self.phases_mb)}


def chunk_starts(t: int, chunk: int) -> list[int]:
    """Starts of the chunks that can hold a phase's peak: the held part grows with the start and
    the working set is equal for all full chunks, so the last full chunk and the last chunk."""
    last = (t - 1) // chunk * chunk
    last_full = (t // chunk - 1) * chunk
    return sorted({s for s in (last_full, last) if s >= 0})


def lora_elems(s: StepShape, targets) -> int:
    """LoRA parameters of one layer on `targets` (those of them that are adapted)."""
    return sum(s.rank * sum(s.arch.linear_shape(t)) for t in targets if t in s.targets)


def state_parts(s: StepShape, grads_elems: float) -> Parts:
    """Held through the whole step (elements)."""
    a = s.arch
    n = lora_elems(s, ALL_TARGETS) * a.layers
    return {"lora_params": n, "lora_grads": grads_elems, "optimizer_state": 2 * n if s.optimizer == "adamw" else 0,
            "rope_tables": 2 * s.seq_len * a.head_dim}


class _Replay:
    """The live tensors of one piece of the step, replayed allocation by allocation with CPython's
    reference semantics (a tensor dies with its last reference; `x = f(x)` frees the old x after the new
    one exists): `peak_parts` are the parts at the largest live total seen at an allocation."""

    def __init__(self) -> None:
        self._objs: dict[int, list] = {}          # id -> [part, elements, references]
        self._names: dict[str, int] = {}
        self._next = 0
        self._parts: Parts = {}
        self._total = 0.0
        self.peak_total, self.peak_parts = 0.0, {}

    def new(self, part: str, n: float, name: str | None = None) -> int:
        """Allocate n elements of `part`; bound to `name` if given, else a temporary to `release`."""
        obj, self._next = self._next, self._next + 1
        self._objs[obj] = [part, n, 1]
        self._parts[part] = self._parts.get(part, 0.0) + n
        self._total += n
        if self._total > self.peak_total:
            self.peak_total, self.peak_parts = self._total, dict(self._parts)
        if name is not None:
            self._bind(name, obj)
            self.release(obj)
        return obj

    def release(self, obj: int) -> None:
        entry = self._objs[obj]
        entry[2] -= 1
        if not entry[2]:
            del self._objs[obj]
            self._parts[entry[0]] -= entry[1]
            self._total -= entry[1]

    def _bind(self, name: str, obj: int) -> None:
        self._objs[obj][2] += 1
        old = self._names.get(name)
        self._names[name] = obj
        if old is not None:
            self.release(old)

    def alias(self, name: str, other: str) -> None:
        """name = other (the same tensor)."""
        self._bind(name, self._names[other])

    def drop(self, *names: str) -> None:
        for name in names:
            self.release(self._names.pop(name))

    def keep_only(self, *names: str) -> None:
        """A function returns: its locals die, except what it returns."""
        self.drop(*[n for n in list(self._names) if n not in names])

    def chain(self, part: str, n: float, steps: int, name: str | None = None) -> None:
        """`steps` elementwise ops in a row, each freeing its temporary input: y = f3(f2(f1(.)))."""
        prev = self.new(part, n)
        for _ in range(steps - 1):
            cur = self.new(part, n)
            self.release(prev)
            prev = cur
        if name is not None:
            self._bind(name, prev)
        self.release(prev)


def mlp_chunks(s: StepShape) -> list[int]:
    """Sizes of the MLP's column chunks of the intermediate dimension (block._f_chunks for float weights)."""
    f = s.arch.intermediate
    step = f if s.mlp_chunk is None else min(f, s.mlp_chunk)
    return [step] * (f // step) + ([f % step] if f % step else [])


def _replayed(sizes: list[int]) -> list[tuple[int, int, int]]:
    """(index, size, full chunks skipped before it): chunks 0, 1, 2 and the last two. The chunks after the
    third differ only by the LoRA gradient slices collected so far (growing) while their size is the same,
    so the largest of the skipped ones is never above chunk n-2; only the last chunk may be shorter."""
    n = len(sizes)
    keep = sorted({k for k in (0, 1, 2, n - 2, n - 1) if 0 <= k < n})
    out, prev = [], -1
    for k in keep:
        out.append((k, sizes[k], k - prev - 1))
        prev = k
    return out


def _rstd(r: _Replay, t: int, d: int, part: str) -> None:
    """rmsnorm's r = rsqrt(mean(x^2) + eps): x^2 [T, d], then three [T, 1]; r is bound to "_r"."""
    sq = r.new(part, t * d)
    mean = r.new(part, t)
    r.release(sq)
    eps = r.new(part, t)
    r.release(mean)
    r.new(part, t, "_r")
    r.release(eps)


def _rmsnorm_forward(r: _Replay, t: int, d: int, part: str, name: str) -> None:
    """rmsnorm_forward: r; x * r [T, d] (r dies); y = w * (x * r)."""
    _rstd(r, t, d, part)
    xr = r.new(part, t * d)
    r.drop("_r")
    r.new(part, t * d, name)
    r.release(xr)


def _rmsnorm_backward(r: _Replay, t: int, d: int, part: str, name: str) -> None:
    """rmsnorm_backward: r recomputed; xhat, g = dy * w, g * xhat (and its mean), xhat * mean, g - .., r * ..;
    then the caller's residual add."""
    _rstd(r, t, d, part)
    r.new(part, t * d, "_xhat")
    r.new(part, t * d, "_g")
    gx = r.new(part, t * d)
    m = r.new(part, t)
    r.release(gx)
    xm = r.new(part, t * d)
    r.release(m)
    diff = r.new(part, t * d)
    r.release(xm)
    r.new(part, t * d, "_dx")
    r.release(diff)
    r.drop("_r", "_xhat", "_g")
    r.new(part, t * d, name)            # dout + dx
    r.drop("_dx")


def _lora_update(r: _Replay, part: str, n: float, name: str) -> None:
    """name = name + s * F.linear(h, B[c]): the product, its scaled copy, the sum."""
    a = r.new(part, n)
    b = r.new(part, n)
    r.release(a)
    r.new(part, n, name)
    r.release(b)


def mlp_forward_peak(s: StepShape) -> Parts:
    """block._mlp and the block's residual add, replayed: the parts (elements) at their peak, on top of
    what the block holds (checkpoints, x1)."""
    t, d, rank = s.seq_len, s.arch.hidden, s.rank
    gate, up, down = (name in s.targets for name in _MLP)
    r = _Replay()
    _rmsnorm_forward(r, t, d, "block_hidden", "n2")
    for name, on in (("hg", gate), ("hu", up)):
        if on:
            r.new("lora_sums", t * rank, name)                         # h = n2 A^T [T, r]
    for k, c, _ in _replayed(mlp_chunks(s)):
        p = t * c
        r.new("mlp_working_set", p, "g")
        r.new("mlp_working_set", p, "u")
        for name, on in (("g", gate), ("u", up)):
            if on:
                _lora_update(r, "mlp_working_set", p, name)
        silu = r.new("mlp_working_set", p)
        r.new("mlp_working_set", p, "act")
        r.release(silu)
        r.alias("_g", "g")                                             # `act, _ = swiglu_forward(g, u)`: _ holds g, u
        r.alias("_u", "u")
        r.drop("g", "u")
        r.new("block_hidden", t * d, "part")
        if k == 0:
            r.alias("out", "part")
        else:
            r.new("block_hidden", t * d, "out")
        if down:
            r.new("lora_sums", t * rank, "h_c")
            if k == 0:
                r.alias("hd", "h_c")
            else:
                r.new("lora_sums", t * rank, "hd")
    if down:
        _lora_update(r, "block_hidden", t * d, "out")
    r.keep_only("out")
    r.new("block_hidden", t * d)                                       # x1 + mlp(x1)
    return r.peak_parts


def mlp_backward_peak(s: StepShape) -> Parts:
    """block._mlp_backward replayed: the parts (elements) at its peak, on top of what block_backward holds
    (checkpoints, dout, the attention half's saved tensors). Its LoRA gradients: the chunks' slices
    collected in lists, then concatenated (both alive until it returns)."""
    t, d, f, rank = s.seq_len, s.arch.hidden, s.arch.intermediate, s.rank
    gate, up, down = (name in s.targets for name in _MLP)
    w, h, g_, lr = "mlp_working_set", "hidden_grads", "lora_grads", "lora_sums"
    r = _Replay()
    _rmsnorm_forward(r, t, d, "block_hidden", "n2")
    for name, on in (("hg", gate), ("hu", up)):
        if on:
            r.new(lr, t * rank, name)
    if down:
        r.chain(lr, t * rank, 2, "dhd")                                # s * (dout @ Bd)
    full = mlp_chunks(s)[0]
    for k, c, skipped in _replayed(mlp_chunks(s)):
        if skipped:                                                    # the skipped chunks' gradient slices
            r.new(g_, skipped * full * rank * (gate + up + down), f"slices_before_{k}")
        p = t * c
        r.new(w, p, "g")
        r.new(w, p, "u")
        for name, on in (("g", gate), ("u", up)):
            if on:
                _lora_update(r, w, p, name)
        silu = r.new(w, p)
        r.new(w, p, "act")
        r.release(silu)
        r.alias("_g", "g")
        r.alias("_u", "u")
        r.new(w, p, "da")                                              # dout Wd[:, c]
        if down:
            r.chain(w, p, 2, "da")                                     # da + dhd Ad[:, c]
            r.new(g_, rank * c, f"dad{k}")                             # dhd^T a_c [r, C]
            r.new(lr, t * rank, "h_c")
            if k == 0:
                r.alias("hd", "h_c")
            else:
                r.new(lr, t * rank, "hd")
        r.drop("act")
        # swiglu_backward: sg; du = da * (g sg); dg = da * u * sg * (1 + g * (1 - sg))
        sg = r.new(w, p)
        gs = r.new(w, p)
        r.new(w, p, "du")
        r.release(gs)
        r.chain(w, p, 2, "_dus")
        r.chain(w, p, 3, "_tail")
        r.new(w, p, "dg")
        r.drop("_dus", "_tail")
        r.release(sg)
        r.drop("g", "u", "da")
        a, b = r.new(h, t * d), r.new(h, t * d)                        # dg Wg[c] + du Wu[c]
        r.new(h, t * d, "part")
        r.release(a)
        r.release(b)
        if k == 0:
            r.alias("dn2", "part")
        else:
            r.new(h, t * d, "dn2")
        for on, lst, acc in ((gate, "dbg", "dhg"), (up, "dbu", "dhu")):
            if on:
                r.chain(g_, c * rank, 2, f"{lst}{k}")                  # s * (dg^T hg) [C, r]
                r.chain(lr, t * rank, 2, "c")                          # s * (dg Bg[c]) [T, r]
                if k == 0:
                    r.alias(acc, "c")
                else:
                    r.new(lr, t * rank, acc)
        r.drop("dg", "du")
    if down:
        r.new(g_, rank * f, "grad_down_a")                             # torch.cat of the slices
        r.chain(g_, d * rank, 2, "grad_down_b")                        # s * (dout^T hd)
    for on, name in ((gate, "gate"), (up, "up")):
        if on:
            r.chain(h, t * d, 2, "dn2")                                # dn2 + dh A
            r.new(g_, rank * d, f"grad_{name}_a")
            r.new(g_, f * rank, f"grad_{name}_b")
    _rmsnorm_backward(r, t, d, h, "dx1")
    return r.peak_parts


def _plus(*parts: Parts) -> Parts:
    out: Parts = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _forward_parts(s: StepShape, i: int, mlp: Parts) -> list[Parts]:
    a, t = s.arch, s.seq_len
    d, kv, dh = a.hidden, a.kv_dim, a.head_dim
    g = a.heads // a.kv_heads                                        # query heads per kv head
    base = {**state_parts(s, 0), "checkpoints": (i + 1) * t * d}
    mask = t * t / s.dtype_bytes                                     # bool [T, T]
    # attention one kv group at a time: the last group's scores + softmax [G,T,T] x2, the outputs of the others;
    # then the o projection: n1, q, q_rope, o, o regrouped [T, d], its output and LoRA term and their sum, or
    # (not adapted) its output and x1 = x + output
    o_out = 3 if "o_proj" in s.targets else 2
    out = [{**base, "attention_saved": 3 * t * d + 3 * t * kv, "attention_outputs": (a.kv_heads - 1) * g * t * dh,
            "attention_scores": 2 * g * t * t + mask},
           {**base, "attention_saved": 3 * t * d + 3 * t * kv, "attention_outputs": (2 + o_out) * t * d}]
    # the MLP (column chunks, replayed) on top of the checkpoints and x1
    out.append(_plus(base, {"block_hidden": t * d}, mlp))
    return out


def _loss_base(s: StepShape) -> Parts:
    """Held through the loss: the checkpoints, x and hn, the shifted int64 [T] targets and N."""
    a, t = s.arch, s.seq_len
    return {**state_parts(s, 0), "checkpoints": a.layers * t * a.hidden, "final_hidden": 2 * t * a.hidden,
            "loss_vectors": 8 * t / s.dtype_bytes + 1}


def _loss_chunked_parts(s: StepShape) -> list[Parts]:
    """`ce_chunked` (vocab_chunk None): one [C, V] buffer per token chunk."""
    a, t, e = s.arch, s.seq_len, s.dtype_bytes
    n_chunks = -(-t // s.loss_chunk)
    base = _loss_base(s)
    out = []
    for start in chunk_starts(t, s.loss_chunk):
        c = min(s.loss_chunk, t - start)
        # per chunk: valid (bool), tgt (int64), picked, max, sum, lse, weights [C]; the losses so far
        vectors = base["loss_vectors"] + c * (1 + 8) / e + 5 * c + start // s.loss_chunk + 1
        # the chunk's one [C, V] buffer (z, exp'd and turned into dz in place) while dz @ E is written
        out.append({**base, "hidden_grads": (start + c) * a.hidden, "loss_logits": c * a.vocab,
                    "loss_vectors": vectors})
    # torch.cat of the dh chunks (after the losses are stacked)
    out.append({**base, "hidden_grads": 2 * t * a.hidden, "loss_vectors": base["loss_vectors"] + n_chunks + 2})
    return out


def _loss_online_parts(s: StepShape) -> list[Parts]:
    """`ce_online`: token chunks of loss_chunk rows, each looping over [C, Vc] vocabulary blocks."""
    a, t, e, lc = s.arch, s.seq_len, s.dtype_bytes, s.loss_chunk
    d, vc = a.hidden, min(s.vocab_chunk, a.vocab)
    base = _loss_base(s)
    out = []
    for start in chunk_starts(t, lc):
        c, prev = min(lc, t - start), (lc if start else 0)
        # held: scaled dh of the chunks done, the previous chunk's dh, lse, z[y] and weights, the losses so far
        done = {"hidden_grads": start * d + prev * d}
        held = base["loss_vectors"] + 3 * prev + start // lc + c * (1 + 8) / e + c   # + valid, tgt, z[y] [C]
        # the vocabulary loop at A <- A a + p E_j: E[y], A, A a, p E_j, the new A [C, d]; the [C, Vc] block;
        # m, S, m', a [C, 1]
        out.append({**base, **done, "loss_rows": 5 * c * d, "loss_logits": c * vc, "loss_vectors": held + 4 * c})
        # its end: A, E[y], A / S and dh [C, d]; m, S, a, lse [C, 1]
        out.append({**base, **done, "loss_rows": 4 * c * d, "loss_vectors": held + 4 * c})
    # torch.cat of the dh chunks; the last chunk's dh, lse, z[y] and weights are still bound; the losses and their sum
    last = t - chunk_starts(t, lc)[-1]
    out.append({**base, "hidden_grads": 2 * t * d + last * d,
                "loss_vectors": base["loss_vectors"] + 3 * last + -(-t // lc) + 1})
    return out


def _final_norm_parts(s: StepShape) -> list[Parts]:
    """The final RMSNorm's backward: x, dh, and its [T, d] temporaries (xhat, g, two more)."""
    a, t = s.arch, s.seq_len
    return [{**state_parts(s, 0), "checkpoints": a.layers * t * a.hidden, "final_hidden": 6 * t * a.hidden}]


def _backward_parts(s: StepShape, i: int, grads_above: float, mlp: Parts) -> list[Parts]:
    a, t = s.arch, s.seq_len
    d, kv, dh = a.hidden, a.kv_dim, a.head_dim
    g = a.heads // a.kv_heads
    mlp_grads = lora_elems(s, _MLP)
    base = {"checkpoints": (i + 1) * t * d, "attention_saved": 4 * t * d + 2 * t * kv, "loss_vectors": 1}  # + loss []
    # the MLP's recompute and backward (replayed) on top of dout and the attention half's saved tensors
    out = [_plus(state_parts(s, grads_above), base, {"hidden_grads": t * d}, mlp)]
    # attention backward of the last kv group: its [G,T,T] p, dp, dp - rowsum, ds; the other groups' dq, dk, dv
    partial = mlp_grads + lora_elems(s, ("o_proj",))
    others = (a.kv_heads - 1) * (g * t * dh + 2 * t * dh)
    out.append({**state_parts(s, grads_above + partial), **base, "attention_saved": 3 * t * d + 2 * t * kv,
                "hidden_grads": 3 * t * d + t * dh + others, "attention_scores": 4 * g * t * t})
    # the q/k/v tail, in the input norm's backward: n1 and o still held; dout, dx1, dq/dk/dv (one [T, d] +
    # two [T, kv]), the three projections' dx, their sum and rmsnorm_backward's four [T, d] temporaries
    out.append({**state_parts(s, grads_above + lora_elems(s, ALL_TARGETS)), "checkpoints": (i + 1) * t * d,
                "attention_saved": 2 * t * d, "hidden_grads": 11 * t * d + 2 * t * kv + t, "loss_vectors": 1})
    return out


def _mesp_candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    fwd_mlp, bwd_mlp = mlp_forward_peak(s), mlp_backward_peak(s)
    out = [("forward", i, p) for i in range(s.arch.layers) for p in _forward_parts(s, i, fwd_mlp)]
    loss = _loss_chunked_parts(s) if s.vocab_chunk is None else _loss_online_parts(s)
    out += [("loss", None, p) for p in loss]
    out += [("final_norm", None, p) for p in _final_norm_parts(s)]
    per_layer = lora_elems(s, ALL_TARGETS)
    for n_done, i in enumerate(s.selected()):
        grads_above = n_done * per_layer if s.grads == "all" else 0
        out += [("backward", i, p) for p in _backward_parts(s, i, grads_above, bwd_mlp)]
    if s.grads == "all":   # the step returns every selected layer's gradients
        out.append(("end", None, {**state_parts(s, len(s.selected()) * per_layer), "checkpoints": 0}))
    return out


def _candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    if s.method == "mesp":
        return _mesp_candidates(s)
    from toolchain.memory.estimate_autograd import autograd_candidates  # imports this module: not at the top

    return autograd_candidates(s)


def estimate_peak(shape: StepShape, *, overhead_mb: float = 0.0) -> MemoryEstimate:
    """Peak memory of one training step of `shape.method`, with its breakdown.

    Args:
        overhead_mb: runtime and allocator memory on top of the live tensors (a calibration
            constant measured with `toolchain bench memory`), reported as the part
            `runtime_overhead`. Default: 0.

    Returns:
        The largest candidate (see the module docstring), parts in MB.
    """
    scale = shape.dtype_bytes / BYTES_PER_MB
    phases: dict[str, float] = {}
    best = None
    for phase, layer, parts in _candidates(shape):
        total = sum(parts.values())
        phases[phase] = max(phases.get(phase, 0.0), total * scale + overhead_mb)
        if best is None or total > best[0]:
            best = (total, phase, layer, parts)
    total, phase, layer, parts = best
    parts_mb = {k: v * scale for k, v in parts.items() if v}
    if overhead_mb:
        parts_mb["runtime_overhead"] = overhead_mb
    return MemoryEstimate(sum(parts_mb.values()), phase, layer, parts_mb, phases)


def largest_fitting(shape: StepShape, budget_mb: float, field_name: Literal["seq_len", "rank"], hi: int, *,
                    overhead_mb: float = 0.0,
                    estimate: Callable[[StepShape], float] | None = None) -> int | None:
    """The largest value of `seq_len` or `rank` in [1, hi] whose estimated peak fits `budget_mb`
    (the peak grows with both), or None when even 1 does not fit."""
    peak = estimate or (lambda s: estimate_peak(s, overhead_mb=overhead_mb).peak_mb)

    def fits(v: int) -> bool:
        return peak(replace(shape, **{field_name: v})) <= budget_mb

    if not fits(1):
        return None
    lo, top = 1, hi
    while lo < top:
        mid = (lo + top + 1) // 2
        lo, top = (mid, top) if fits(mid) else (lo, mid - 1)
    return lo
