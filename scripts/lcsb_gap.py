"""Why LCSB's loss gap grows: the experiments behind docs/lcsb.md ("What limits the gap").

  PYTHONPATH=. .venv/bin/python scripts/lcsb_gap.py [--steps 300] [--cache DIR] [--seed N]
      [--pretrain-steps 300] [--pretrain-corpus bundled|demo] [--base-checkpoint DIR] [--json OUT]
      VARIANT [VARIANT ...]

Runs `toolchain bench lcsb`'s default workload (the `mid` model, the same stand-in pretrained base, the
same rows in the same order, AdamW lr 2e-4, wd 0.01, r16 x 7, 1 thread) with full backprop once, then the
LCSB arm in the VARIANTs below, and prints per variant the bench's `loss_gap` (mean over the last 10% of
steps of (loss_lcsb - loss_full) / loss_full), the held-out gap and the gap per tenth of the run. The
base and the full arm's losses are cached in --cache (deterministic: the same numbers every run), so a
variant costs one LCSB run (~1 min on this host). Nothing here is timed (step times: `bench lcsb`).

The stand-in base (the base study: docs/lcsb-gap-base-study.json): `--pretrain-steps N` pretrains it for N steps
(the bench's `--pretrain-steps`; the fine-tuning rows then start at row N, as in the bench), and
`--pretrain-corpus demo` pretrains it on toolchain/assets/demo_corpus.txt (723 KB of other text, windows in a
seeded order: `text_pretrain_rows`) instead of the fine-tuning split; the fine-tuning data (corpus.txt, its
split) is the same either way. Every regime other than the bench's (bundled, 300) has its own cache
subdirectory. `--json OUT` writes the pretraining cost (wall and CPU seconds), the full arm's losses and every
variant's gaps. `--base-checkpoint DIR` takes the base from a Hugging Face checkpoint of the `mid` arch instead
(`scripts/pretrain_demo_model.py --arch lcsb-mid` makes one; no stand-in pretraining; the rows start at row 0).

Variants (cyclic k = 4 of 12 layers unless said; "unselected" = outside the step's selection):
  cyclic        the bench's LCSB arm (zero gradient for unselected layers: moments decay, they move)
  exact         the same selection, but selected layers get their exact gradient (full backward, only
                the selected layers updated): removes the stop-gradient surrogate, keeps the sparsity
  frozen        unselected layers and their moments untouched (`frozen_unselected`)
  hold          unselected layers keep moving by their frozen moments (no decay; per-layer bias
                correction) - an update the exported programs do not have (block_skip_update decays)
  comp          host-side approximation of `hold`: the zero-gradient update with lr * (sqrt(b2)/b1)^j,
                j = steps since the layer's last gradient (moves as `hold`, moments decay as `cyclic`)
  sel_lr_sqrt3, sel_lr_x3   selected layers' lr x sqrt(3) / x 3
  strided, random, reverse  other selections (random: a fresh draw of 4 layers per step)
  comp_random   comp with the random policy
  full_every6   cyclic, every 6th step full backprop
  top_twice, bottom_twice   the top (bottom) group at every second step, the other two alternating
  block3, block10, block30  each group for 3 / 10 / 30 consecutive steps
  full_lr_sqrt3 the FULL arm at lr x sqrt(3) (is full backprop lr-limited here?)
Direct-path and lr variants:
  direct_b, direct_ab   cyclic, and every unselected layer's o_proj / down_proj LoRA also gets its direct-path
                gradient (their outputs add to the residual stream: dB = s dY^T h with dY the residual gradient
                passing by; direct_ab: dA = s (dY B)^T x too); *_random: with the random policy
  lcsb_lr_sqrt3, lcsb_lr_x2, lcsb_lr_x3   the whole LCSB arm at a higher lr (full_lr_x2, full_lr_x3: the full arm)
  always0, always1, always2   the cycle plus group j at every step (more than k layers: diagnostic only)
  top1, top2, top3   the top t layers every step + k - t cycling over the others (top3 = policy `anchored`);
                top2_random: the k - t drawn at random; top3_comp: top3 with comp's skip-update lr
  last, comp_random_lr2, hold_random   the `last` policy; combinations
Anchored variants (`--seed N` runs the same workload at seed N, cached per seed):
  top3_frozen, top3_hold   `anchored` with unselected layers frozen (moments too) / moving by frozen moments
  top3_imp      `anchored`, but the slot goes to the lower layer with the largest staleness x gradient norm
                at its last selection (dynamic: not a plan; diagnostic)
  top3_w        `anchored` with a static weighted slot: lower layer j (0..L-k) visited j + 1 times per period
  top3_pair     top k-1 every step, the slot covering 2 lower layers every other step (4 layers on average)
  top3_tail10   `anchored`, the last 10% of steps full backprop (costs speed; diagnostic)
  top3_mix      top k-1 every step + 1 cycling lower layer on odd steps, 2 on even steps (k + 0.5 layers on
                average; each lower layer 1 step in (L-k+1)/1.5)
  anchored_k5   `anchored` at k = 5 (top 4 + 1 cycling over the other 8)
Anchored with direct paths and warm-ups:
  top3_direct_b, top3_direct_ab   `anchored` plus the direct-path o/down LoRA gradients of the
                unselected layers (B only; A and B)
  top3_upper    `anchored` with the slot cycling over layers L/3 .. L-k only (the lowest third never trained:
                their surrogate gradients are the furthest from the exact ones)
  top3_head5, top3_head10, top3_head13   the first 5 / 10 / 13% of steps full backprop, then `anchored` (ideal
                speedup at a 1.76x arm: 1.70x / 1.64x / 1.60x); cyclic_head10: the same warm-up before `cyclic`
On a pretrained base (`--base-checkpoint DIR`: a pretrained base instead of the stand-in):
  top3_lowlrC, top3_head10_lowlrC   `anchored` (the second: after top3_head10's warm-up) with lr x C (C in 0,
                0.5, 1.5, 2, 3) for every update of the lower layers 0..L-k, the top k-1 unchanged
  top3_head10_direct_b, top3_head10_direct_ab   the warm-up, then top3_direct_b / top3_direct_ab
  last_head10   the warm-up, then the `last` policy (the top k layers only)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import time
from pathlib import Path

import torch

from toolchain.bench.lcsb import LcsbBenchConfig, pretrain_base, split_rows, text_pretrain_rows
from toolchain.text.dataset import demo_corpus
from toolchain.lcsb import make_plan
from toolchain.lora import LoraConfig, LoraPair, init_lora
from toolchain.mesp import mesp_step
from toolchain.mesp.block import attention_half, block_backward, block_forward, block_rope
from toolchain.mesp.ops import linear_forward, rmsnorm_forward, swiglu_forward
from toolchain.mesp.step import block_params, embedding_rows, head_loss_and_grad
from toolchain.models import random_weights
from toolchain.models.load import load_checkpoint
from toolchain.optim import OptimizerConfig, OptState, update_layer
from toolchain.training import TrainRun, evaluate, start_run
from toolchain.training.eager import RunState, assign_update

B1, B2, EPS = 0.9, 0.999, 1e-8


def _hold(lr: float, wd: float, p: LoraPair, slots, count: int) -> LoraPair:
    """One step of an unselected layer moving by its frozen moments (bias correction by its own count)."""
    if count == 0:
        return p
    m, v = slots
    bc1, bc2 = 1 - B1 ** count, 1 - B2 ** count
    return LoraPair(*(x * (1 - lr * wd) - (lr / bc1) * mm / (vv.sqrt() / bc2 ** 0.5 + EPS)
                      for x, mm, vv in ((p.a, m.a, v.a), (p.b, m.b, v.b))))


def _direct_step(arch, weights, cfg, lora, ex, sel, with_a):
    """An LCSB step (the same surrogate as mesp_step with backward_layers=sel) that also returns, for
    every unselected layer, the direct-path gradients of its o_proj and down_proj LoRA: their outputs add
    to the residual stream, so with dY the residual gradient passing the layer (identity in backward),
    dB = s dY^T h (h = x A^T, the [T, r] LoRA hidden the forward computes anyway) and, with_a,
    dA = s (dY B)^T x (needs the projection input x: o [T, d] / act [T, f])."""
    t = ex.input_ids.shape[0]
    rope = block_rope(arch, torch.arange(t), weights.final_norm.dtype)
    x = embedding_rows(weights.embed, ex.input_ids)
    inputs, kept = [], {}
    for i in range(arch.layers):
        inputs.append(x)
        p = block_params(arch, weights, cfg, lora, i)
        if i not in sel:
            x1, k = attention_half(x, p, rope)
            w, s = p.weights, p.scale
            n2, _ = rmsnorm_forward(x1, w.post_norm, arch.rms_eps)
            g = linear_forward(n2, w.gate_proj, None, p.lora.get("gate_proj"), s)[0]
            u = linear_forward(n2, w.up_proj, None, p.lora.get("up_proj"), s)[0]
            kept[i] = (k.o, swiglu_forward(g, u)[0])
        x = block_forward(x, p, rope)
    loss, dx = head_loss_and_grad(x, weights.final_norm, weights.lm_head, ex.labels, arch.rms_eps)
    out = {}
    for i in reversed(range(arch.layers)):
        p = block_params(arch, weights, cfg, lora, i)
        if i in sel:
            dx, out[i] = block_backward(dx, inputs[i], p, rope)
            continue
        g = {}
        for tgt, xin in (("o_proj", kept[i][0]), ("down_proj", kept[i][1])):
            pr = p.lora[tgt]
            db = p.scale * (dx.T @ (xin @ pr.a.T))
            da = (p.scale * (dx @ pr.b)).T @ xin if with_a else torch.zeros_like(pr.a)
            g[tgt] = LoraPair(da, db)
        out[i] = {tgt: g.get(tgt, LoraPair(torch.zeros_like(pp.a), torch.zeros_like(pp.b)))
                  for tgt, pp in p.lora.items()}
    return loss, out


def _weighted_slots(n: int) -> list[int]:
    """A static schedule over n lower layers where layer j appears j + 1 times, spread evenly (stride
    scheduling: each step picks the layer furthest behind its share)."""
    total, seq, done = n * (n + 1) // 2, [], [0] * n
    for s in range(total):
        j = max(range(n), key=lambda j: ((j + 1) * (s + 1) / total - done[j], j))
        done[j] += 1
        seq.append(j)
    return seq


def run_arm(ctx, name, select, *, lr=None, sel_lr=1.0, unsel="zero", exact=False, full_every=0, direct=None,
            importance=False, full_first=0, low_lr=1.0):
    config, arch, weights, cfg, lora0, rows, val = ctx
    lr = config.lr if lr is None else lr
    wd, layers = config.weight_decay, arch.layers
    opt = OptimizerConfig("adamw", lr=lr, weight_decay=wd, frozen_unselected=unsel == "frozen")
    st = start_run(TrainRun(steps=config.steps, optimizer=opt), lora0)
    counts, since, losses = [0] * layers, [0] * layers, []
    norms, stale = [math.inf] * layers, [0] * layers
    t0 = time.perf_counter()
    for s in range(config.steps):
        ex = rows[(config.pretrain_steps + s) % len(rows)]
        if importance:
            low = layers - config.k + 1
            j = max(range(low), key=lambda j: (stale[j] * norms[j] if norms[j] < math.inf else math.inf, -j))
            sel = {j, *range(low, layers)}
            for i in range(low):
                stale[i] = 0 if i == j else stale[i] + 1
        elif s < full_first:
            sel = set(range(layers))
        elif full_every < 0:
            sel = set(range(layers)) if s >= config.steps + full_every else set(select(s))
        else:
            sel = set(range(layers)) if full_every and (s + 1) % full_every == 0 else set(select(s))
        step = st.opt.step + 1
        for i in sel:
            counts[i] += 1

        def update(i, grads):
            o = opt
            if low_lr != 1.0 and len(sel) < layers and i < layers - config.k + 1:
                o = dataclasses.replace(opt, lr=lr * low_lr)
            if grads is not None:
                since[i] = 0
                norms[i] = math.sqrt(sum(float(t.double().pow(2).sum()) for p in grads.values() for t in p))
                if sel_lr != 1.0 and len(sel) < layers:
                    o = dataclasses.replace(opt, lr=lr * sel_lr)
            elif unsel == "frozen":
                return
            elif unsel == "hold":
                new = {t: _hold(lr, wd, p, st.opt.slots[i][t], counts[i]) for t, p in st.lora[i].items()}
                assign_update(st.lora[i], st.opt.slots[i], new, st.opt.slots[i])
                return
            elif unsel == "comp":
                since[i] += 1
                o = dataclasses.replace(opt, lr=lr * (math.sqrt(B2) / B1) ** since[i])
            assign_update(st.lora[i], st.opt.slots[i], *update_layer(o, st.lora[i], grads, st.opt.slots[i], step))

        with torch.no_grad():
            if direct is not None:
                loss, gr = _direct_step(arch, weights, cfg, st.lora, ex, sel, direct == "ab")
                r = argparse.Namespace(loss=loss)
                for i in sorted(sel, reverse=True):
                    update(i, gr[i])
                for i in sorted(set(range(layers)) - sel):
                    assign_update(st.lora[i], st.opt.slots[i],
                                  *update_layer(opt, st.lora[i], gr[i], st.opt.slots[i], step))
            elif exact:
                r = mesp_step(arch, weights, cfg, st.lora, ex.input_ids, ex.labels)
                for i in range(layers):
                    update(i, r.grads[i] if i in sel else None)
            else:
                r = mesp_step(arch, weights, cfg, st.lora, ex.input_ids, ex.labels, backward_layers=sel,
                              on_layer_grads=update, keep_grads=False)
                for i in sorted(set(range(layers)) - sel):
                    update(i, None)
        st = RunState(st.lora, OptState(step, st.opt.slots))
        losses.append(float(r.loss))
    return {"name": name, "losses": losses, "val": evaluate(arch, weights, cfg, st.lora, val),
            "seconds": time.perf_counter() - t0}


def gaps(res, full, steps) -> dict:
    """The bench's loss_gap, the held-out gap and the gap per tenth of the run (%) of `res` against `full`."""
    tail, n = max(1, math.ceil(steps / 10)), steps // 10
    gap = statistics.fmean((b - a) / a for a, b in zip(full["losses"][-tail:], res["losses"][-tail:]))
    tenths = [round(100 * statistics.fmean((b - a) / a for a, b in zip(full["losses"][j * n:(j + 1) * n],
                                                                    res["losses"][j * n:(j + 1) * n])), 2)
              for j in range(10)]
    return {"loss_gap": gap, "val_loss_gap": (res["val"] - full["val"]) / full["val"], "tenths_pct": tenths,
            "final_loss": statistics.fmean(res["losses"][-tail:]), "val_loss": res["val"], "seconds": res["seconds"]}


def report(name, g) -> str:
    return (f"{name:<14} loss_gap {100 * g['loss_gap']:+.2f}%  val_gap {100 * g['val_loss_gap']:+.2f}%"
            f"  ({g['seconds']:.0f} s)  per tenth {g['tenths_pct']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/lcsb_gap"))
    ap.add_argument("--seed", type=int, default=0, help="the bench's --seed (base, LoRA init); cached per seed")
    ap.add_argument("--pretrain-steps", type=int, default=LcsbBenchConfig.pretrain_steps,
                    help="steps of the stand-in pretraining (the bench's --pretrain-steps)")
    ap.add_argument("--pretrain-corpus", choices=("bundled", "demo"), default="bundled",
                    help="pretrain on the fine-tuning split (bundled: the bench's) or on demo_corpus.txt")
    ap.add_argument("--json", type=Path, default=None, help="write the regime's results here")
    ap.add_argument("--base-checkpoint", type=Path, default=None,
                    help="a Hugging Face checkpoint of the `mid` arch as the base instead of the stand-in pretraining "
                         "(fine-tuning rows start at row 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.base_checkpoint is not None:
        if args.pretrain_corpus != "bundled" or args.pretrain_steps != LcsbBenchConfig.pretrain_steps:
            ap.error("--base-checkpoint replaces the stand-in pretraining: no --pretrain-corpus / --pretrain-steps")
        args.pretrain_steps = 0
    config = LcsbBenchConfig(steps=args.steps, seed=args.seed, pretrain_steps=args.pretrain_steps)
    regime = (args.pretrain_corpus, args.pretrain_steps)
    if args.base_checkpoint is not None:
        regime = ("checkpoint", str(args.base_checkpoint))
        digest = hashlib.sha256((args.base_checkpoint / "model.safetensors").read_bytes()).hexdigest()[:12]
        args.cache = args.cache / f"checkpoint-{digest}"  # another checkpoint at the same path: another cache
    elif regime != ("bundled", LcsbBenchConfig.pretrain_steps):  # the bench's regime keeps the old cache layout
        args.cache = args.cache / f"pretrain-{args.pretrain_corpus}-{args.pretrain_steps}"
    if args.seed:
        args.cache = args.cache / f"seed{args.seed}"
    arch = config.arch
    rows, val = split_rows(config)
    args.cache.mkdir(parents=True, exist_ok=True)
    base, base_info = args.cache / "base.pt", args.cache / "base.json"
    if base.exists():
        weights = torch.load(base, weights_only=False)
    elif args.base_checkpoint is not None:
        ck_arch, weights = load_checkpoint(args.base_checkpoint)
        if ck_arch != arch:
            raise SystemExit(f"{args.base_checkpoint}: not the bench's `mid` arch ({ck_arch})")
        torch.save(weights, base)
        base_info.write_text(json.dumps({"checkpoint": str(args.base_checkpoint)}))
    else:
        pre_rows = rows if args.pretrain_corpus == "bundled" else text_pretrain_rows(config, demo_corpus())
        weights, info = random_weights(arch, seed=config.seed), None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if config.pretrain_steps:
            weights, info = pretrain_base(config, arch, weights, pre_rows, None)
        info = {**(info or {}), "corpus": args.pretrain_corpus, "rows": len(pre_rows),
                "wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0}
        torch.save(weights, base)
        base_info.write_text(json.dumps(info))
    cfg = LoraConfig(rank=config.rank, alpha=config.alpha)
    ctx = (config, arch, weights, cfg, init_lora(arch, cfg, seed=config.seed), rows, val)
    L = arch.layers
    cyc = make_plan(L, config.k, "cyclic")
    g = len(cyc.phases)
    variants = {
        "cyclic": dict(select=cyc.layers_at),
        "exact": dict(select=cyc.layers_at, exact=True),
        "frozen": dict(select=cyc.layers_at, unsel="frozen"),
        "hold": dict(select=cyc.layers_at, unsel="hold"),
        "comp": dict(select=cyc.layers_at, unsel="comp"),
        "sel_lr_sqrt3": dict(select=cyc.layers_at, sel_lr=math.sqrt(3)),
        "sel_lr_x3": dict(select=cyc.layers_at, sel_lr=3.0),
        "strided": dict(select=make_plan(L, config.k, "strided").layers_at),
        "random": dict(select=make_plan(L, config.k, "random", period=args.steps).layers_at),
        "comp_random": dict(select=make_plan(L, config.k, "random", period=args.steps).layers_at, unsel="comp"),
        "reverse": dict(select=lambda s: cyc.phases[(-1 - s) % g]),
        "full_every6": dict(select=cyc.layers_at, full_every=6),
        "top_twice": dict(select=lambda s: [cyc.phases[2], cyc.phases[0], cyc.phases[2], cyc.phases[1]][s % 4]),
        "bottom_twice": dict(select=lambda s: [cyc.phases[0], cyc.phases[1], cyc.phases[0], cyc.phases[2]][s % 4]),
        "block3": dict(select=lambda s: cyc.phases[(s // 3) % g]),
        "block10": dict(select=lambda s: cyc.phases[(s // 10) % g]),
        "block30": dict(select=lambda s: cyc.phases[(s // 30) % g]),
        "direct_b": dict(select=cyc.layers_at, direct="b"),
        "direct_ab": dict(select=cyc.layers_at, direct="ab"),
        "direct_b_random": dict(select=make_plan(L, config.k, "random", period=args.steps).layers_at, direct="b"),
        "direct_ab_random": dict(select=make_plan(L, config.k, "random", period=args.steps).layers_at, direct="ab"),
        **{f"always{j}": dict(select=lambda s, j=j: sorted(set(cyc.layers_at(s)) | set(cyc.phases[j])))
           for j in range(g)},
        "comp_random_lr2": dict(select=make_plan(L, config.k, "random", period=args.steps).layers_at, unsel="comp",
                                lr=config.lr * 2),
        "hold_random": dict(select=make_plan(L, config.k, "random", period=args.steps).layers_at, unsel="hold"),
        **{f"top{t}": dict(select=lambda s, t=t: sorted(set(make_plan(L - t, config.k - t, "cyclic").layers_at(s))
                                                           | set(range(L - t, L)))) for t in (1, 2, 3)},
        "top2_random": dict(select=lambda s: sorted(set(make_plan(L - 2, config.k - 2, "random", period=args.steps)
                                                        .layers_at(s)) | {L - 2, L - 1})),
        "last": dict(select=make_plan(L, config.k, "last").layers_at),
        "last_head10": dict(select=make_plan(L, config.k, "last").layers_at, full_first=max(1, args.steps // 10)),
        "top3_comp": dict(select=lambda s: sorted(set(make_plan(L - 3, 1, "cyclic").layers_at(s)) | {L - 3, L - 2, L - 1}),
                          unsel="comp"),
        "top3_frozen": dict(select=make_plan(L, config.k, "anchored").layers_at, unsel="frozen"),
        "top3_hold": dict(select=make_plan(L, config.k, "anchored").layers_at, unsel="hold"),
        "top3_direct_b": dict(select=make_plan(L, config.k, "anchored").layers_at, direct="b"),
        "top3_direct_ab": dict(select=make_plan(L, config.k, "anchored").layers_at, direct="ab"),
        **{f"top3_head10_direct_{d}": dict(select=make_plan(L, config.k, "anchored").layers_at, direct=d,
                                           full_first=max(1, args.steps // 10)) for d in ("b", "ab")},
        "top3_upper": dict(select=lambda s, lo=L // 3: sorted({lo + s % (L - config.k + 1 - lo), *range(L - config.k + 1, L)})),
        **{f"top3_head{pc}": dict(select=make_plan(L, config.k, "anchored").layers_at,
                                  full_first=max(1, args.steps * pc // 100)) for pc in (5, 10, 13)},
        "cyclic_head10": dict(select=cyc.layers_at, full_first=max(1, args.steps // 10)),
        "top3_imp": dict(select=None, importance=True),
        "top3_w": dict(select=lambda s, w=_weighted_slots(L - config.k + 1): sorted(
            {w[s % len(w)], *range(L - config.k + 1, L)})),
        "top3_pair": dict(select=lambda s: sorted({*range(L - config.k + 1, L)} | (
            {(s % (L - config.k + 1)), (s + 1) % (L - config.k + 1)} if s % 2 == 0 else set()))),
        "top3_tail10": dict(select=make_plan(L, config.k, "anchored").layers_at, full_every=-max(1, args.steps // 10)),
        "top3_mix": dict(select=lambda s, n=L - config.k + 1: sorted({*range(n, L)} | (
            {(3 * (s // 2)) % n, (3 * (s // 2) + 1) % n} if s % 2 == 0 else {(3 * (s // 2) + 2) % n}))),
        **{f"top3{h}_lowlr{c}": dict(select=make_plan(L, config.k, "anchored").layers_at, low_lr=float(c),
                                       full_first=max(1, args.steps // 10) if h else 0)
           for h in ("", "_head10") for c in (0, 0.5, 1.5, 2, 3)},
        "anchored_k5": dict(select=make_plan(L, config.k + 1, "anchored").layers_at),
        "lcsb_lr_sqrt3": dict(select=cyc.layers_at, lr=config.lr * math.sqrt(3)),
        "lcsb_lr_x2": dict(select=cyc.layers_at, lr=config.lr * 2),
        "lcsb_lr_x3": dict(select=cyc.layers_at, lr=config.lr * 3),
        "full_lr_x2": dict(select=lambda s: range(L), lr=config.lr * 2),
        "full_lr_x3": dict(select=lambda s: range(L), lr=config.lr * 3),
        "full_lr_sqrt3": dict(select=lambda s: range(L), lr=config.lr * math.sqrt(3)),
    }
    unknown = [v for v in args.variants if v not in variants]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; choose {', '.join(variants)}")
    ref = args.cache / f"full-{args.steps}.json"
    if ref.exists():
        full = json.loads(ref.read_text())
    else:
        full = run_arm(ctx, "full", lambda s: range(L))
        ref.write_text(json.dumps(full))
    tail = max(1, math.ceil(args.steps / 10))
    out = {"pretrain_corpus": args.pretrain_corpus, "pretrain_steps": args.pretrain_steps, "seed": args.seed,
           "steps": args.steps, "pretrain": json.loads(base_info.read_text()) if base_info.exists() else None,
           "full": {"final_loss": statistics.fmean(full["losses"][-tail:]), "val_loss": full["val"],
                    "initial_loss": full["losses"][0], "seconds": full["seconds"],
                    "val_loss_initial": evaluate(arch, weights, ctx[3], ctx[4], val)},
           "variants": {}}
    print(f"regime {regime} seed {args.seed}: pretrain {out['pretrain']}; full {out['full']}", flush=True)
    for name in args.variants:
        out["variants"][name] = g = gaps(run_arm(ctx, name, **variants[name]), full, args.steps)
        print(report(name, g), flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
