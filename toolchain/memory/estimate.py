"""Analytic peak memory of one training step, by named parts: MeSP (`toolchain.mesp.step.mesp_step`),
and the MeBP / autograd baselines (`estimate_autograd.py`).

The model counts the tensors the step's code keeps alive at each candidate peak, then takes the
largest. Notation: T seq_len, d hidden, kv = kv_heads * head_dim, f intermediate, V vocab, L layers,
C a chunk (of the loss: loss_chunk tokens; of the MLP: mlp_chunk intermediate columns), Vc vocab_chunk,
r rank. MeSP candidates:

  forward, layer i   the kept checkpoints (the selected layers' inputs below i) and x_i, plus block_forward
                     REPLAYED tensor by tensor (`_Replay`): the attention half (the block's bool mask, n1,
                     q, k, v and their LoRA terms, rope, attention one query head at a time: c q, [T, T]
                     scores and softmax, the heads' outputs, their concatenation and regrouping, the o
                     projection, x1), then the MLP over column chunks of f ([T, C] g, u, act and their LoRA
                     terms, [T, d] partial sums, [T, r] LoRA sums), then the block output.
  loss (ce_online)   the kept checkpoints (L, or k under LCSB), x and hn, the scaled dh chunks done and the
                     previous chunk's unscaled dh, then per token chunk either the vocabulary loop at
                     A <- A a + p E_j (E[y], A, A a, p E_j, the new A: 5 [C,d]; ONE [C,Vc] logits block; four
                     [C,1] running vectors) or its end (A, E[y], A / S, dh: 4 [C,d]); or the final torch.cat.
  loss (ce_chunked)  (vocab_chunk None) as above with ONE [C,V] buffer per token chunk.
  final norm         the kept checkpoints, x, dh and four [T,d] temporaries of rmsnorm_backward.
  recompute, layer j (layers_per_checkpoint > 1) the forward rerun of a checkpoint group: the kept checkpoints
                     below the group, the group's inputs so far and x_j, dout, the loss, the gradients made so
                     far, plus block_forward REPLAYED as in the forward.
  backward, layer i  the kept checkpoints up to x_i (under checkpoint groups: those below the group and the
                     group's inputs below i), dout, the loss, plus block_backward REPLAYED: the
                     recomputed attention half (q_rope, k_rope, v, o regrouped, the mask and x1 kept; n1 is
                     recomputed after the MLP), the MLP's recompute and backward chunk by chunk (swiglu's
                     backward: 8 [T, C]; dg Wg[c] + du Wu[c]: [T, d] sums; the chunks' LoRA gradient
                     slices, concatenated at the end), the o projection's backward, attention backward one
                     query head at a time (c q, dO * O and its row sums, p, ds [T, T]), rope and the q/k/v
                     projections' backward, the input norm's backward; the layer's gradients as made.
  end                every selected layer's gradients, when the step returns them (grads="all").
  everywhere         LoRA params, their grads (all selected layers' kept until the step returns, or
                     one layer's when the update is applied right after each layer), optimizer state
                     (AdamW: 2 moments), rope tables 2 [T, head_dim].

The replays follow the code's Python names (a tensor dies with its last reference, so e.g. a chunk's
`part` lives until `del part`, or would until the next chunk rebinds it): where the step's
code changes, its replay here must change the same way. Only the MLP chunks whose held set differs are
replayed (the first three and the last two; see `_replayed`), so a replay costs O(1) in the chunk count.
tests/memory/test_memory_estimate.py checks these against the live tensors of the real step (overall and
per phase, to 0.2%; in practice exact to the element): when the step changes, that test says so.
Not modelled: dequantization transients of int8/int4 weights (eager `--quant`; `--program` memory plans
include them), the loss scalars of ce_chunked, allocator slack and the runtime itself: the caller passes
`overhead_mb` (calibrated against `toolchain bench memory`, see docs/planner.md), reported as its own
part. Frozen weights are not counted (memory-mapped clean pages, which the phones' footprint does not
count). MB = 2^20 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from toolchain.lora.config import ALL_TARGETS
from toolchain.memory.estimate_autograd import autograd_candidates
from toolchain.memory.shape import BYTES_PER_MB, METHODS, Parts, StepShape, lora_elems, state_parts

__all__ = ["BYTES_PER_MB", "METHODS", "StepShape", "MemoryEstimate", "estimate_peak", "largest_fitting"]

_MLP = ("gate_proj", "up_proj", "down_proj")


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


class _Replay:
    """The live tensors of a piece of the step, replayed allocation by allocation with CPython's reference
    semantics (a tensor dies with its last reference; `x = f(x)` frees the old x once the new one exists; a
    function's locals die when it returns): `peak_parts` are the parts at the largest live total seen at an
    allocation. Names stand for Python variables; a function's locals share a prefix (`ret` ends them)."""

    def __init__(self) -> None:
        self._objs: dict[int, list] = {}          # id -> [part, elements, references]
        self._names: dict[str, int] = {}
        self._next = 0
        self._parts: Parts = {}
        self._total = 0.0
        self.peak_total, self.peak_parts = 0.0, {}

    def new(self, part: str, n: float, name: str | None = None) -> int:
        """Allocate n elements of `part`, bound to `name` if given, else a temporary to `release`."""
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

    def ret(self, prefix: str, keep: dict[str, str] | None = None) -> None:
        """The function whose locals start with `prefix` returns; `keep`: local -> the caller's name."""
        for local, outer in (keep or {}).items():
            self.alias(outer, local)
        self.drop(*[n for n in self._names if n.startswith(prefix)])

    def chain(self, part: str, n: float, steps: int, name: str | None = None) -> None:
        """`steps` ops in a row, each consuming the previous temporary: y = f3(f2(f1(.)))."""
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
    third differ only by the LoRA gradient slices collected so far (growing), at the same size (only the
    last chunk may be shorter), so none of the skipped ones peaks above chunk n - 2."""
    n = len(sizes)
    keep = sorted({k for k in (0, 1, 2, n - 2, n - 1) if 0 <= k < n})
    out, prev = [], -1
    for k in keep:
        out.append((k, sizes[k], k - prev - 1))
        prev = k
    return out


def _rstd(r: _Replay, pre: str, t: int, d: int, part: str) -> None:
    """rmsnorm's r = rsqrt(mean(x^2) + eps): x^2 [T, d], then three [T, 1]; bound to pre + "r"."""
    sq = r.new(part, t * d)
    mean = r.new(part, t)
    r.release(sq)
    eps = r.new(part, t)
    r.release(mean)
    r.new(part, t, pre + "r")
    r.release(eps)


def _rmsnorm_forward(r: _Replay, pre: str, t: int, d: int, part: str, name: str) -> None:
    """rmsnorm_forward: r; x * r [T, d] (r dies); y = w * (x * r)."""
    _rstd(r, pre, t, d, part)
    xr = r.new(part, t * d)
    r.drop(pre + "r")
    r.new(part, t * d, name)
    r.release(xr)


def _rmsnorm_backward(r: _Replay, pre: str, t: int, d: int, part: str, name: str) -> None:
    """rmsnorm_backward: r recomputed; xhat, g = dy * w, g * xhat (and its mean), xhat * mean, g - ..,
    r * (..) -> name."""
    _rstd(r, pre, t, d, part)
    r.new(part, t * d, pre + "xhat")
    r.new(part, t * d, pre + "g")
    gx = r.new(part, t * d)
    m = r.new(part, t)
    r.release(gx)
    xm = r.new(part, t * d)
    r.release(m)
    diff = r.new(part, t * d)
    r.release(xm)
    r.new(part, t * d, name)
    r.release(diff)
    r.drop(pre + "r", pre + "xhat", pre + "g")


def _lora_update(r: _Replay, part: str, n: float, name: str) -> None:
    """name = name + s * F.linear(h, B): the product, its scaled copy, the sum."""
    a = r.new(part, n)
    b = r.new(part, n)
    r.release(a)
    r.new(part, n, name)
    r.release(b)


def _linear_forward(r: _Replay, s: StepShape, target: str, o: int, part: str, name: str, *, bias: bool) -> None:
    """linear_forward: x W^T, + bias, + s (x A^T) B^T when adapted ([T, r] h dies after the B product)."""
    t = s.seq_len
    r.new(part, t * o, name)
    if bias:
        r.new(part, t * o, name)
    if target in s.targets:
        h = r.new("lora_sums", t * s.rank)
        hb = r.new(part, t * o)
        r.release(h)
        r.new(part, t * o, "_scaled")
        r.release(hb)
        r.new(part, t * o, name)
        r.drop("_scaled")


def _linear_backward(r: _Replay, s: StepShape, target: str, i: int, o: int, *, part: str, name: str) -> None:
    """linear_backward(dy [T, o]) -> name (dx [T, i]); the LoRA gradients dA [r, i], dB [o, r] (kept in the
    block's grads as "grad.<target>")."""
    t, rank = s.seq_len, s.rank
    r.new(part, t * i, "lb.dx")                                       # dy W
    if target in s.targets:
        r.new("lora_sums", t * rank, "lb.h")                          # x A^T
        r.chain("lora_sums", t * rank, 2, "lb.dh")                    # s * (dy B)
        r.chain(part, t * i, 2, "lb.dx2")                             # dx + dh A
        r.new("lora_grads", rank * i, f"grad.{target}.a")             # dh^T x
        r.chain("lora_grads", o * rank, 2, f"grad.{target}.b")        # s * (dy^T h)
        r.ret("lb.", {"lb.dx2": name})
    else:
        r.ret("lb.", {"lb.dx": name})


def _rope_forward(r: _Replay, n: float, part: str, name: str) -> None:
    """x * cos + rot(x) * sin; rot: -x[.., half:] [n/2] and the cat."""
    a = r.new(part, n)
    neg = r.new(part, n / 2)
    rot = r.new(part, n)
    r.release(neg)
    b = r.new(part, n)
    r.release(rot)
    r.new(part, n, name)
    r.release(a)
    r.release(b)


def _rope_backward(r: _Replay, n: float, part: str, name: str) -> None:
    """dy * cos + rot^T(dy * sin); rot^T: -z[.., :half] [n/2] and the cat."""
    a = r.new(part, n)
    b = r.new(part, n)
    neg = r.new(part, n / 2)
    c = r.new(part, n)
    r.release(neg)
    r.release(b)
    r.new(part, n, name)
    r.release(a)
    r.release(c)


def _mask(r: _Replay, s: StepShape, name: str) -> None:
    """causal_mask(T), once per block: ones [T, T] bool, triu (bool: 1 byte per element)."""
    tt = s.seq_len ** 2 / s.dtype_bytes
    ones = r.new("attention_scores", tt)
    r.new("attention_scores", tt, name)
    r.release(ones)


def _probs(r: _Replay, s: StepShape, name: str) -> None:
    """One head's causal softmax [T, T]: (c q) k^T, masked_fill_ in place with the block's mask, softmax."""
    tt, part = s.seq_len ** 2, "attention_scores"
    qk = r.new(part, tt)
    r.new(part, tt, name)
    r.release(qk)


def _attention_half(r: _Replay, s: StepShape) -> None:
    """block._attention_half from the block input (a checkpoint) to x1; its locals (a.*) are left for the
    caller to end (the forward keeps x1 only, the backward the saved bundles too)."""
    a, t = s.arch, s.seq_len
    d, kv, dh = a.hidden, a.kv_dim, a.head_dim
    sv, out = "attention_saved", "attention_outputs"
    _mask(r, s, "a.mask")
    _rmsnorm_forward(r, "a.", t, d, sv, "a.n1")
    for name, o in (("q", d), ("k", kv), ("v", kv)):
        _linear_forward(r, s, f"{name}_proj", o, sv, f"a.{name}", bias=True)
    r.drop("a.n1")                                                    # del n1
    _rope_forward(r, t * d, sv, "a.q_rope")
    _rope_forward(r, t * kv, sv, "a.k_rope")
    r.drop("a.q", "a.k")                                              # q, k rebound to their rope
    for h in range(a.heads):                                          # _attention_by_head
        qc = r.new(out, t * dh)                                       # c * q
        _probs(r, s, "a.p")
        r.new(out, t * dh, f"a.o{h}")                                 # p @ v
        r.drop("a.p")
        r.release(qc)
    r.new(out, t * d, "a.ocat")                                       # torch.cat of the heads
    r.drop(*[f"a.o{h}" for h in range(a.heads)])
    r.new(out, t * d, "a.oflat")                                      # _unheads(o): a copy
    r.drop("a.ocat")
    _linear_forward(r, s, "o_proj", d, out, "a.ao", bias=False)
    r.new("block_hidden", t * d, "x1")                                # x + ao


def _gate_up_act(r: _Replay, w: str, p: int, pre: str, gate: bool, up: bool) -> None:
    """One chunk's g, u (with their LoRA terms) and act = silu(g) * u, as block._mlp and block._mlp_backward
    both compute them (`act = swiglu_forward(g, u)[0]`)."""
    r.new(w, p, pre + "g")
    r.new(w, p, pre + "u")
    for name, on in ((pre + "g", gate), (pre + "u", up)):
        if on:
            _lora_update(r, w, p, name)
    silu = r.new(w, p)
    r.new(w, p, pre + "act")
    r.release(silu)


def _mlp_forward(r: _Replay, s: StepShape) -> None:
    """block._mlp on x1 -> "mlp_out" (names m.*)."""
    t, d, rank = s.seq_len, s.arch.hidden, s.rank
    gate, up, down = (name in s.targets for name in _MLP)
    w, hid = "mlp_working_set", "block_hidden"
    _rmsnorm_forward(r, "m.", t, d, hid, "m.n2")
    for name, on in (("m.hg", gate), ("m.hu", up)):
        if on:
            r.new("lora_sums", t * rank, name)                        # h = n2 A^T [T, r]
    for k, c, _ in _replayed(mlp_chunks(s)):
        p = t * c
        _gate_up_act(r, w, p, "m.", gate, up)
        r.drop("m.g", "m.u")
        r.new(hid, t * d, "m.part")
        if k == 0:
            r.alias("m.out", "m.part")
        else:
            r.new(hid, t * d, "m.out")
        r.drop("m.part")                                              # del part
        if down:
            r.new("lora_sums", t * rank, "m.h_c")
            if k == 0:
                r.alias("m.hd", "m.h_c")
            else:
                r.new("lora_sums", t * rank, "m.hd")
    if down:
        _lora_update(r, hid, t * d, "m.out")
    r.ret("m.", {"m.out": "mlp_out"})


def _mlp_backward(r: _Replay, s: StepShape) -> None:
    """block._mlp_backward on x1 and dout -> "dx1" (names mb.*); its LoRA gradients: the chunks' slices
    collected in lists, then concatenated into the block's grads (the lists die when it returns)."""
    t, d, f, rank = s.seq_len, s.arch.hidden, s.arch.intermediate, s.rank
    gate, up, down = (name in s.targets for name in _MLP)
    w, h, g_, lr = "mlp_working_set", "hidden_grads", "lora_grads", "lora_sums"
    _rmsnorm_forward(r, "mb.", t, d, "block_hidden", "mb.n2")
    for name, on in (("mb.hg", gate), ("mb.hu", up)):
        if on:
            r.new(lr, t * rank, name)
    if down:
        r.chain(lr, t * rank, 2, "mb.dhd")                            # s * (dout @ Bd)
    full = mlp_chunks(s)[0]
    for k, c, skipped in _replayed(mlp_chunks(s)):
        if skipped:                                                   # the skipped chunks' gradient slices
            r.new(g_, skipped * full * rank * (gate + up + down), f"mb.slices_before_{k}")
        p = t * c
        r.new(w, p, "mb.da")                                          # dout Wd[:, c]
        if down:
            r.chain(w, p, 2, "mb.da")                                 # da + dhd Ad[:, c]
        _gate_up_act(r, w, p, "mb.", gate, up)
        if down:
            r.new(g_, rank * c, f"mb.dad{k}")                         # dhd^T a_c [r, C]
            r.new(lr, t * rank, "mb.h_c")
            if k == 0:
                r.alias("mb.hd", "mb.h_c")
            else:
                r.new(lr, t * rank, "mb.hd")
        r.drop("mb.act")
        # swiglu_backward: sg; du = da * (g sg); dg = da * u * sg * (1 + g * (1 - sg))
        sg = r.new(w, p)
        gs = r.new(w, p)
        r.new(w, p, "mb.du")
        r.release(gs)
        r.chain(w, p, 2, "mb._dus")
        r.chain(w, p, 3, "mb._tail")
        r.new(w, p, "mb.dg")
        r.drop("mb._dus", "mb._tail")
        r.release(sg)
        r.drop("mb.g", "mb.u", "mb.da")
        a, b = r.new(h, t * d), r.new(h, t * d)                       # dg Wg[c] + du Wu[c]
        r.new(h, t * d, "mb.part")
        r.release(a)
        r.release(b)
        if k == 0:
            r.alias("mb.dn2", "mb.part")
        else:
            r.new(h, t * d, "mb.dn2")
        r.drop("mb.part")                                             # del part
        for on, lst, acc in ((gate, "mb.dbg", "mb.dhg"), (up, "mb.dbu", "mb.dhu")):
            if on:
                r.chain(g_, c * rank, 2, f"{lst}{k}")                 # s * (dg^T hg) [C, r]
                r.chain(lr, t * rank, 2, "mb.c")                      # s * (dg Bg[c]) [T, r]
                if k == 0:
                    r.alias(acc, "mb.c")
                else:
                    r.new(lr, t * rank, acc)
        r.drop("mb.dg", "mb.du")
    if down:
        r.new(g_, rank * f, "grad.down_proj.a")                       # torch.cat of the slices
        r.chain(g_, d * rank, 2, "grad.down_proj.b")                  # s * (dout^T hd)
    for on, name in ((gate, "gate_proj"), (up, "up_proj")):
        if on:
            r.chain(h, t * d, 2, "mb.dn2")                            # dn2 + dh A
            r.new(g_, rank * d, f"grad.{name}.a")
            r.new(g_, f * rank, f"grad.{name}.b")
    _rmsnorm_backward(r, "mb.n_", t, d, h, "mb.dnorm")
    r.new(h, t * d, "mb.dx1")                                         # dout + rmsnorm_backward(dn2)
    r.ret("mb.", {"mb.dx1": "dx1"})


def _attention_backward(r: _Replay, s: StepShape) -> None:
    """_attention_backward_by_head(d_o): per query head, attention_backward (p recomputed, dv, dp, ds,
    dq, dk); the previous head's grads stay bound (`ga`) during the next; the kv heads' dk, dv summed;
    then the three torch.cat -> "ga.dq", "ga.dk", "ga.dv" (names h.*, ab.*)."""
    a, t = s.arch, s.seq_len
    dh, tt, g = a.head_dim, s.seq_len ** 2, a.heads // a.kv_heads
    hg, sc = "hidden_grads", "attention_scores"
    for h in range(a.heads):
        j = h // g
        r.new(hg, t * dh, "ab.qc")                                    # c * q
        prod = r.new(hg, t * dh)                                      # dO * O
        r.new(sc, t, "ab.rows")                                       # its row sums
        r.release(prod)
        _probs(r, s, "ab.p")
        tmp = r.new(hg, t * dh)                                       # dO^T P [D, T]
        r.new(hg, t * dh, "ab.dv")                                    # (..)^T.sum(1)
        r.release(tmp)
        r.new(sc, tt, "ab.ds")                                        # dO V^T, then - rows, * p in place
        r.drop("ab.p")
        r.chain(hg, t * dh, 2, "ab.dq")                               # (ds K) * c
        r.chain(hg, t * dh, 2, "ab.dk")                               # ((cQ)^T ds)^T.sum(1)
        r.ret("ab.", {"ab.dq": "h.ga_dq", "ab.dk": "h.ga_dk", "ab.dv": "h.ga_dv"})
        r.alias(f"h.dq{h}", "h.ga_dq")
        for name in ("dk", "dv"):
            if h % g == 0:
                r.alias(f"h.{name}{j}", f"h.ga_{name}")
            else:
                r.new(hg, t * dh, f"h.{name}{j}")
    r.new(hg, t * a.hidden, "h.dq")
    r.new(hg, t * a.kv_dim, "h.dk")
    r.new(hg, t * a.kv_dim, "h.dv")
    r.ret("h.", {"h.dq": "ga.dq", "h.dk": "ga.dk", "h.dv": "ga.dv"})


def block_forward_peak(s: StepShape) -> Parts:
    """block_forward replayed (the attention half, then the MLP; the output): the parts (elements) at its
    peak, on top of what the step holds (state, checkpoints x_0..x_i)."""
    r = _Replay()
    _attention_half(r, s)
    r.ret("a.")
    _mlp_forward(r, s)
    r.new("block_hidden", s.seq_len * s.arch.hidden)                 # x1 + mlp(x1)
    return r.peak_parts


def block_backward_peak(s: StepShape) -> Parts:
    """block_backward replayed: the recomputed attention half (its saved bundles kept: n1, q_rope, k_rope,
    v, o regrouped, x1), the MLP's recompute and backward, the o projection's backward, attention by
    head, rope and the q/k/v projections' backward, the input norm's backward and the residual sum; the
    parts (elements) at its peak, on top of what the step holds (state, checkpoints x_0..x_i, dout)."""
    a, t = s.arch, s.seq_len
    d, kv = a.hidden, a.kv_dim
    hg = "hidden_grads"
    r = _Replay()
    _attention_half(r, s)
    r.ret("a.", {name: f"saved.{name[2:]}" for name in ("a.q_rope", "a.k_rope", "a.v", "a.oflat", "a.mask")})
    _mlp_backward(r, s)
    r.drop("x1")
    _linear_backward(r, s, "o_proj", d, d, part=hg, name="go.dx")
    _attention_backward(r, s)
    r.drop("go.dx", "saved.q_rope", "saved.k_rope", "saved.v", "saved.oflat", "saved.mask")   # del go, kept
    _rmsnorm_forward(r, "n1.", t, d, "attention_saved", "saved.n1")  # recomputed after the MLP
    for target, n, rope in (("q_proj", d, True), ("k_proj", kv, True), ("v_proj", kv, False)):
        if rope:
            _rope_backward(r, t * n, hg, "tmp.rope")
            r.new(hg, t * n, "tmp.dy")                                # _unheads: a copy
            r.drop("tmp.rope")
        else:
            r.new(hg, t * n, "tmp.dy")
        _linear_backward(r, s, target, d, n, part=hg, name=f"g{target[0]}.dx")
        r.drop("tmp.dy")
    r.drop("ga.dq", "ga.dk", "ga.dv")                                 # del ga
    r.new(hg, t * d, "tmp.sum")                                      # gq.dx + gk.dx
    r.new(hg, t * d, "tmp.sum")                                      # + gv.dx
    _rmsnorm_backward(r, "n1_", t, d, hg, "tmp.dnorm")
    r.drop("tmp.sum")
    r.new(hg, t * d, "dx")                                           # dx1 + ...
    return r.peak_parts


def _plus(*parts: Parts) -> Parts:
    out: Parts = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _kept(s: StepShape) -> list[int]:
    """The layers whose input the forward keeps: each checkpoint group's first (every selected one when
    layers_per_checkpoint = 1)."""
    return [g[0] for g in s.groups()]


def _kept_below(s: StepShape, i: int) -> int:
    return sum(1 for j in _kept(s) if j < i)


def _forward_parts(s: StepShape, i: int, block: Parts) -> list[Parts]:
    """Layer i's forward: the block's replayed peak on top of the state, the kept checkpoints below i
    and x_i (the block's input)."""
    return [_plus(state_parts(s, 0), {"checkpoints": (_kept_below(s, i) + 1) * s.seq_len * s.arch.hidden}, block)]


def _loss_base(s: StepShape) -> Parts:
    """Held through the loss: the checkpoints, x and hn, the shifted int64 [T] targets and N."""
    a, t = s.arch, s.seq_len
    return {**state_parts(s, 0), "checkpoints": len(_kept(s)) * t * a.hidden, "final_hidden": 2 * t * a.hidden,
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
    return [{**state_parts(s, 0), "checkpoints": len(_kept(s)) * t * a.hidden, "final_hidden": 6 * t * a.hidden}]


def _backward_parts(s: StepShape, held: int, grads_above: float, block: Parts) -> list[Parts]:
    """A block's forward rerun or backward within a checkpoint group: the block's replayed peak (with the
    gradients made so far) on top of the state, `held` [T, d] inputs (the kept checkpoints below the
    group, the group's inputs so far and the block's own input), dout and the loss []."""
    t, d = s.seq_len, s.arch.hidden
    return [_plus(state_parts(s, grads_above), {"checkpoints": held * t * d, "hidden_grads": t * d,
                                                "loss_vectors": 1}, block)]


def _mesp_candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    fwd, bwd = block_forward_peak(s), block_backward_peak(s)
    out = [("forward", i, p) for i in range(s.arch.layers) for p in _forward_parts(s, i, fwd)]
    loss = _loss_chunked_parts(s) if s.vocab_chunk is None else _loss_online_parts(s)
    out += [("loss", None, p) for p in loss]
    out += [("final_norm", None, p) for p in _final_norm_parts(s)]
    per_layer = lora_elems(s, ALL_TARGETS)
    n_done = 0
    for group in reversed(s.groups()):
        below = _kept_below(s, group[0])
        grads_above = n_done * per_layer if s.grads == "all" else 0
        for j in range(group[0], group[-1]):   # the forward rerun up to the group's last layer
            held = below + sum(1 for m in group if m <= j) + (j not in group)
            out += [("recompute", j, p) for p in _backward_parts(s, held, grads_above, fwd)]
        for i in reversed(group):
            grads_above = n_done * per_layer if s.grads == "all" else 0
            held = below + sum(1 for m in group if m < i) + 1
            out += [("backward", i, p) for p in _backward_parts(s, held, grads_above, bwd)]
            n_done += 1
    if s.grads == "all":   # the step returns every selected layer's gradients
        out.append(("end", None, {**state_parts(s, len(s.selected()) * per_layer), "checkpoints": 0}))
    return out


def _candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    if s.method == "mesp":
        return _mesp_candidates(s)
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
