"""scripts/arm64_runtime.py's comparison, without qemu (scripts/check_arm64.sh runs it for real in .ci/run): the
bounds are the stated formula, a difference beyond a bound fails, a greedy id is compared only where the x86
margin decides it, the calls and the kernel probe are exact, and the LCSB plan of `--program` is what it says."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import arm64_runtime as ar  # noqa: E402

from toolchain.program import ProgramDir  # noqa: E402


def _trace_dirs() -> list[Path]:
    return sorted(d for d in (REPO / "shared_schemas/traces").glob("*/") if (d / "trace.json").is_file())


@pytest.fixture(scope="module")
def case():
    import json

    d = next(d for d in _trace_dirs() if (d / "program").is_dir())
    trace = json.loads((d / "trace.json").read_text())
    return ProgramDir(d / trace["program"]), ar.plan_from_trace(trace)


def _result(pdir, plan, *, logits_rows=None) -> ar.Result:
    g = torch.Generator().manual_seed(0)
    state = pdir.state_init()
    r = ar.Result(probe="missing", eval_loss=4.5, eval_tokens=30, called=["embed", "block_forward"] * 3)
    for s in range(len(plan.train)):
        state = state + 0.01 * torch.randn(state.shape, generator=g)
        r.states.append(state.clone())
        r.losses.append(4.0 + 0.1 * s)
    r.logits = logits_rows or [torch.randn(pdir.arch.vocab, generator=g) for _ in range(plan.new_tokens)]
    r.ids = [int(t.argmax()) for t in r.logits]
    return r


def test_the_chain_lengths_are_the_stated_formula(case):
    pdir, plan = case
    a, T, r = pdir.arch, pdir.seq_len, pdir.lora_config.rank
    d, hd, qd, inter = a.hidden, a.head_dim, a.heads * a.head_dim, a.intermediate
    n_f = 4 * d + r + hd + T + qd + inter + (hd if a.qk_norm else 0)
    ch = ar.Chains.of(pdir)
    assert (ch.n_f, ch.n_b, ch.n_h) == (n_f, n_f + T, 2 * d + a.vocab + T)
    assert ch.step == a.layers * (2 * n_f + T) + 2 * d + a.vocab + T
    assert ch.loss(0) == a.layers * n_f + ch.n_h and ch.state(2) == 3 * ch.step
    assert ar.rel_bound(1000) == pytest.approx(2 * 1000 * 2.0 ** -24)


def test_equal_results_pass_and_a_loss_beyond_its_bound_fails(case):
    pdir, plan = case
    ref = _result(pdir, plan)
    v, stats = ar.compare(pdir, ref, copy.deepcopy(ref), plan, fused=False, lr=plan.lr)
    assert v.ok and v.worst == 0.0 and stats["ids_equal"]
    bound = ar.rel_bound(ar.Chains.of(pdir).loss(2)) * abs(ref.losses[2])
    for factor, ok in ((0.5, True), (2.0, False)):
        got = copy.deepcopy(ref)
        got.losses[2] += factor * bound
        v, _ = ar.compare(pdir, ref, got, plan, fused=False, lr=plan.lr)
        assert v.ok is ok and v.worst == pytest.approx(factor, rel=1e-6)


def test_a_state_entry_beyond_its_bound_fails(case):
    pdir, plan = case
    ref = _result(pdir, plan)
    e = pdir.state_entries[1]
    got = copy.deepcopy(ref)
    scale = float(ref.states[0][e.offset:e.offset + e.numel].abs().max())
    # beyond the normwise bound and (the program is AdamW) beyond the 2 lr per step of an Adam-driven param
    got.states[0][e.offset] += ar.rel_bound(ar.Chains.of(pdir).state(0)) * scale + 3 * plan.lr
    v, _ = ar.compare(pdir, ref, got, plan, fused=False, lr=plan.lr)
    assert not v.ok and any(e.name in line for line in v.lines)


def test_calls_and_the_kernel_probe_are_exact(case):
    pdir, plan = case
    ref = _result(pdir, plan)
    got = copy.deepcopy(ref)
    got.called = got.called[:-1]
    assert not ar.compare(pdir, ref, got, plan, fused=False, lr=plan.lr)[0].ok
    assert not ar.compare(pdir, ref, copy.deepcopy(ref), plan, fused=True, lr=plan.lr)[0].ok   # probe says missing


def test_the_fused_generation_is_compared_in_lockstep(case):
    """Fused: each lockstep call within its one-call bound, and its argmax equal where x86's margin decides it;
    no lockstep at all is a failure."""
    pdir, plan = case
    ref = _result(pdir, plan)
    ref.probe = "registered"
    good = [("block_decode", 0.2, None, None), ("head_logits", 0.0, 3.0, True)]
    for records, ok in ((good, True), ([], False), ([("block_decode", 1.5, None, None)], False),
                        ([("head_logits", 0.0, 3.0, False)], False)):
        got = copy.deepcopy(ref)
        got.lockstep = records
        assert ar.compare(pdir, ref, got, plan, fused=True, lr=plan.lr)[0].ok is ok, records


def test_a_greedy_id_is_compared_only_where_the_margin_decides_it(case):
    pdir, plan = case
    vocab = pdir.arch.vocab
    wide = torch.zeros(vocab)
    wide[3] = 10.0                                   # margin 10: far above any bound
    tight = torch.zeros(vocab)
    tight[5], tight[6] = 10.0, 10.0 - 1e-7           # margin 1e-7: below twice the logit bound
    ref = _result(pdir, plan, logits_rows=[wide.clone(), tight.clone(), wide.clone()])
    got = copy.deepcopy(ref)
    got.ids[1] = 6                                   # undecided position: a different id is allowed ...
    got.ids[2] = 4                                   # ... and what follows it is not compared
    v, stats = ar.compare(pdir, ref, got, plan, fused=False, lr=plan.lr)
    assert v.ok and stats["ids_compared"] == f"1/{len(ref.ids)}"
    got = copy.deepcopy(ref)
    got.ids[0] = 4                                   # a decided position must be equal
    v, _ = ar.compare(pdir, ref, got, plan, fused=False, lr=plan.lr)
    assert not v.ok


@pytest.mark.parametrize("layers, steps", [(1, 3), (3, 5), (8, 5), (24, 7)])
def test_program_plan_starts_full_then_lcsb_phases_cover_every_layer(layers, steps):
    sel = ar.lcsb_selections(layers, steps)
    assert len(sel) == steps and sel[0] == tuple(range(layers))
    k = max(1, layers // 2)
    assert all(len(s) == k and set(s) <= set(range(layers)) for s in sel[1:])
    if steps - 1 >= -(-layers // k):
        assert set().union(*sel[1:]) == set(range(layers))


# ---------------------------------------------------------------- fp16 / int8 programs against their fp32 twin

def _program(compute: str, optimizer: str = "sgd", init=None):
    from types import SimpleNamespace

    init = torch.zeros(64, dtype=torch.float32) if init is None else init
    return SimpleNamespace(spec=SimpleNamespace(compute=compute), optimizer=SimpleNamespace(kind=optimizer),
                           state_init=lambda: init.clone(), path=Path(f"/programs/{compute}"))


def _twin_check(monkeypatch, compute, g_q, g32, x86=None):
    """twin_gradient_check with the two aarch64 steps' gradients given (no qemu): g_q for the fp16 / int8
    program, g32 for its twin; the driver each runs on is recorded."""
    drivers = []

    def fake(pdir, prefix, binary, fused, plan, init):
        drivers.append((pdir.spec.compute, binary.name, fused))
        return g_q if pdir.spec.compute == compute else g32

    monkeypatch.setattr(ar, "_sgd_gradient", fake)
    monkeypatch.setattr(ar, "twin_plan", lambda pdir, lr: None)
    ok, msg = ar.twin_gradient_check(_program(compute), _program("fp32"), ["qemu"], Path("/d"), x86_gradient=x86)
    return ok, msg, drivers


def _near(g: torch.Tensor, cosine: float, seed: int = 1) -> torch.Tensor:
    """a vector of g's norm at the given cosine to g"""
    g = g.double()
    r = torch.randn(g.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    r -= (r @ g) / (g @ g) * g
    r *= g.norm() / r.norm()
    return cosine * g + (1 - cosine ** 2) ** 0.5 * r


def test_int8_twin_check_holds_the_documented_bound_and_runs_the_fused_driver(monkeypatch):
    g32 = torch.randn(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ok, msg, drivers = _twin_check(monkeypatch, "int8", _near(g32, 0.9995), g32, x86=_near(g32, 0.9995))
    assert ok, msg
    assert ("int8", "module_check-arm64-fused", True) in drivers and ("fp32", "module_check-arm64-stock", False) in drivers
    ok, msg, _ = _twin_check(monkeypatch, "int8", _near(g32, 0.998), g32)     # below cosine 0.999: fails
    assert not ok and "cosine 0.998" in msg


def test_int8_twin_check_fails_when_aarch64_and_x86_int8_gradients_part(monkeypatch):
    g32 = torch.randn(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    arm = _near(g32, 0.9995, seed=1)
    # the x86 int8 gradient at cosine 0.995 from aarch64's: beyond 2 * 0.999^2 - 1 = 0.996002
    ok, msg, _ = _twin_check(monkeypatch, "int8", arm, g32, x86=_near(arm, 0.995, seed=2))
    assert not ok and "0.996002" in msg
    ok, msg, _ = _twin_check(monkeypatch, "int8", arm, g32, x86=_near(arm, 0.9965, seed=2))
    assert ok, msg


def test_fp16_twin_check_keeps_its_tighter_bound_on_the_stock_driver(monkeypatch):
    g32 = torch.randn(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ok, msg, drivers = _twin_check(monkeypatch, "fp16", _near(g32, 0.9995), g32)   # int8 would pass; fp16 must not
    assert not ok and "(>= 0.9999)" in msg
    assert ("fp16", "module_check-arm64-stock", False) in drivers


def test_twin_check_refuses_what_it_cannot_check(monkeypatch):
    monkeypatch.setattr(ar, "twin_plan", lambda pdir, lr: None)
    ok, msg = ar.twin_gradient_check(_program("fp32"), _program("fp32"), [], Path("/d"))
    assert not ok and "fp16 or int8" in msg
    ok, msg = ar.twin_gradient_check(_program("int8"), _program("fp16"), [], Path("/d"))
    assert not ok and "must be an fp32 program" in msg
    ok, msg = ar.twin_gradient_check(_program("int8", "adamw"), _program("fp32"), [], Path("/d"))
    assert not ok and "needs SGD" in msg
    ok, msg = ar.twin_gradient_check(_program("int8"), _program("fp32", init=torch.ones(64)), [], Path("/d"))
    assert not ok and "initial states differ" in msg


def test_an_int8_program_passes_on_stock_drivers_only_when_refused_for_the_missing_kernels(monkeypatch, capsys):
    def refuse(pdir, prefix, binary, fused, plan):
        raise RuntimeError("embed: ...; the runtime said: Missing operator: [17] toolchain::int4_linear_a8.out")

    monkeypatch.setattr(ar, "run_session", refuse)
    assert ar._stock_refusals("p", None, None, Path("/d"), ["qemu"], ["max", "cortex-a53"]) == (3, 0)

    def other(pdir, prefix, binary, fused, plan):
        raise RuntimeError("head_loss: the pipe closed")

    monkeypatch.setattr(ar, "run_session", other)
    assert ar._stock_refusals("p", None, None, Path("/d"), ["qemu"], ["max"]) == (0, 2)
    monkeypatch.setattr(ar, "run_session", lambda *a: ar.Result(called=["embed"]))
    assert ar._stock_refusals("p", None, None, Path("/d"), ["qemu"], ["max"]) == (0, 2)
    assert "without the toolchain kernels" in capsys.readouterr().out
