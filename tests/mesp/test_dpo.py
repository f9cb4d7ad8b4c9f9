"""DPO loss and gradients (toolchain.mesp.dpo) against Hugging Face + PEFT autograd in float64, on seeded random
configs of every family (qwen2: q/k/v biases; qwen3, llama: none), tied and untied heads. The oracle computes the
DPO loss its own way: log-softmax of HF's logits gathered at the response tokens and summed (lp), the same under
PEFT's `disable_adapter()` for the reference (lp0), `-logsigmoid(beta * ...)`, and `backward()`."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from helpers import (assert_rel_close, float64_faithful_hf, lora_for, our_weights, peft_wrap, random_case,
                     random_hf_model)

from toolchain.errors import BadInput
from toolchain.lora import lora_from_state_dict
from toolchain.mesp import StepOptions, mesp_step
from toolchain.mesp.dpo import check_beta, dpo_step, pair_rows, reference_logps, sequence_logp

FAMILIES = ["qwen2", "qwen3", "llama"]
SEEDS = list(range(4))      # even seeds tied, odd untied (helpers.random_arch)
CASES = [pytest.param(f, s, id=f"{f}-{random_case(s, f)}") for f in FAMILIES for s in SEEDS]


def _pair(case, gen):
    """Random prompt / chosen / rejected ids whose sequences fit the model (lengths drawn from the seed)."""
    v, limit = case.arch.vocab, min(case.arch.max_positions, 40)
    n_p = int(torch.randint(1, 12, (), generator=gen))
    n_c, n_r = (int(torch.randint(1, limit - n_p, (), generator=gen)) for _ in range(2))
    ids = lambda n: torch.randint(0, v, (n,), generator=gen).tolist()  # noqa: E731
    return ids(n_p), ids(n_c), ids(n_r)


def _hf_logp(model, prompt, resp) -> torch.Tensor:
    ids = torch.tensor(prompt + resp)[None]
    logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)        # [T, V], float64
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(resp) - 1)  # the positions predicting resp
    return logp[positions, torch.tensor(resp)].sum()


def _oracle(peft_model, arch, cfg, prompt, chosen, rejected, beta):
    peft_model.zero_grad(set_to_none=True)
    with float64_faithful_hf():
        with torch.no_grad(), peft_model.disable_adapter():
            ref = (_hf_logp(peft_model, prompt, chosen), _hf_logp(peft_model, prompt, rejected))
        lp_c, lp_r = _hf_logp(peft_model, prompt, chosen), _hf_logp(peft_model, prompt, rejected)
        loss = -F.logsigmoid(beta * ((lp_c - ref[0]) - (lp_r - ref[1])))
    loss.backward()
    sd = {n.replace(".default.", "."): p.grad.detach().clone() for n, p in peft_model.named_parameters()
          if "lora_" in n}
    peft_model.zero_grad(set_to_none=True)
    return loss.detach(), (float(ref[0]), float(ref[1])), (lp_c.detach(), lp_r.detach()), \
        lora_from_state_dict(arch, cfg, sd, dtype=torch.float64)


_STORE: dict = {}


def _case(family, seed):
    if (family, seed) not in _STORE:
        case = random_case(seed, family)
        gen = torch.Generator().manual_seed(100 + seed)
        hf = random_hf_model(case.arch, gen)
        weights = our_weights(case.arch, hf, torch.float64)
        lora = lora_for(case.arch, case.lora, seed=seed)
        peft_model = peft_wrap(hf, case.lora, lora)
        prompt, chosen, rejected = _pair(case, gen)
        beta = [0.1, 0.5, 2.0, 7.0][seed % 4]
        _STORE[family, seed] = (case, weights, lora, peft_model, (prompt, chosen, rejected), beta,
                                _oracle(peft_model, case.arch, case.lora, prompt, chosen, rejected, beta))
    return _STORE[family, seed]


def test_the_cases_cover_families_tying_and_biases():
    archs = [random_case(s, f).arch for f in FAMILIES for s in SEEDS]
    assert {a.family for a in archs} == set(FAMILIES)
    assert {a.tie_embeddings for a in archs} == {True, False}
    assert {a.qkv_bias for a in archs} == {True, False}


@pytest.mark.parametrize("options", [StepOptions(), StepOptions(loss_chunk=3, vocab_chunk=5, mlp_chunk=4)],
                         ids=["default", "chunks"])
@pytest.mark.parametrize(("family", "seed"), CASES)
def test_dpo_step_matches_hf_peft_float64(family, seed, options):
    case, weights, lora, _, (prompt, chosen, rejected), beta, (loss, ref, lps, grads) = _case(family, seed)
    c, r = pair_rows(prompt, chosen, rejected)
    ours_ref = reference_logps(case.arch, weights, case.lora, lora, c, r, options=options)
    assert ours_ref == pytest.approx(ref, rel=1e-10, abs=1e-10)
    res = dpo_step(case.arch, weights, case.lora, lora, c, r, ours_ref, beta=beta, options=options)
    torch.testing.assert_close(res.loss, loss)
    torch.testing.assert_close(res.logps[0], lps[0])
    torch.testing.assert_close(res.logps[1], lps[1])
    assert 0 < float(res.loss) < math.inf
    assert_rel_close(res.grads, grads, max_rel=1e-5)


@pytest.mark.parametrize(("family", "seed"), CASES[::3])
def test_checkpoint_groups_lcsb_hook_and_scale(family, seed):
    """Checkpoint groups leave the gradients as they are; the hook sees each selected layer once, top-down, with
    the summed gradient; `scale` multiplies loss and gradients; unselected layers get none."""
    case, weights, lora, _, (prompt, chosen, rejected), beta, (loss, ref, _, grads) = _case(family, seed)
    c, r = pair_rows(prompt, chosen, rejected)
    full = dpo_step(case.arch, weights, case.lora, lora, c, r, ref, beta=beta)
    grouped = dpo_step(case.arch, weights, case.lora, lora, c, r, ref, beta=beta, layers_per_checkpoint=2)
    for a, b in zip(full.grads, grouped.grads):
        for t in a:
            assert torch.equal(a[t].a, b[t].a) and torch.equal(a[t].b, b[t].b)
    seen = []
    top = case.arch.layers - 1
    res = dpo_step(case.arch, weights, case.lora, lora, c, r, ref, beta=beta, scale=0.25, backward_layers=[top],
                   on_layer_grads=lambda i, g: seen.append((i, g)), keep_grads=False)
    assert [i for i, _ in seen] == [top] and all(g == {} for g in res.grads)
    torch.testing.assert_close(res.loss, 0.25 * loss)
    for t, p in seen[0][1].items():
        torch.testing.assert_close(p.a, 0.25 * full.grads[top][t].a)
        torch.testing.assert_close(p.b, 0.25 * full.grads[top][t].b)


def test_dpo_gradient_is_the_weighted_difference_of_two_sft_gradients():
    """The identity the step rests on, checked with `mesp_step` (mean CE) on its own."""
    case, weights, lora, _, (prompt, chosen, rejected), beta, (loss, ref, lps, grads) = _case("qwen2", 1)
    c, r = pair_rows(prompt, chosen, rejected)
    gc = mesp_step(case.arch, weights, case.lora, lora, c.input_ids, c.labels).grads
    gr = mesp_step(case.arch, weights, case.lora, lora, r.input_ids, r.labels).grads
    margin = beta * ((lps[0] - ref[0]) - (lps[1] - ref[1]))
    s = float(torch.sigmoid(-margin))
    w_c, w_r = beta * s * len(chosen), -beta * s * len(rejected)
    combo = tuple({t: type(p)(w_c * p.a + w_r * gr[i][t].a, w_c * p.b + w_r * gr[i][t].b) for t, p in layer.items()}
                  for i, layer in enumerate(gc))
    assert_rel_close(combo, grads, max_rel=1e-5)
    lp = sequence_logp(case.arch, weights, case.lora, lora, c)
    torch.testing.assert_close(lp, lps[0])


@pytest.mark.parametrize("beta", [0.0, -1.0, math.nan, math.inf])
def test_beta_must_be_finite_and_positive(beta):
    with pytest.raises(BadInput, match="--beta must be a finite number > 0"):
        check_beta(beta)


def _alive_counts(n: int, every: int) -> list[int]:
    """Both sequences' layer inputs alive at each point of a DPO step over n selected layers, simulated from the
    groups exactly as `dpo_step` / `LayerLoop.pair_step` keep, rebuild and pop them: after the second forward,
    then at each layer's backward (rebuilt inputs added at a group's top, one input of each popped after)."""
    from toolchain.mesp.step import checkpoint_groups, second_sequence_groups

    groups = (checkpoint_groups(list(range(n)), every), second_sequence_groups(list(range(n)), every))
    alive = [{g[0] for g in gs} for gs in groups]
    counts = [len(alive[0]) + len(alive[1])]
    for i in reversed(range(n)):
        for k in range(2):
            top = next((g for g in groups[k] if g[-1] == i), None)
            if top is not None:
                alive[k] |= set(top)
        counts.append(len(alive[0]) + len(alive[1]))
        alive[0].discard(i)
        alive[1].discard(i)
    return counts


@pytest.mark.parametrize("n", [*range(1, 41), 64])
def test_second_sequence_groups_partition_and_bound(n):
    """The graded groups cover the selected layers once, in order, each contiguous among them; both sequences
    together never hold more than n + G inputs (G: the second's groups, the fewest for which 1, 3, 7, ... from the
    top covers n), which is `pair_inputs_alive_bound`; with groups (every > 1) both sequences use the same ones."""
    from toolchain.mesp.step import checkpoint_groups, pair_inputs_alive_bound, second_sequence_groups

    sel = sorted(random.Random(n).sample(range(2 * n), n))            # an LCSB-like subset of layers
    groups = second_sequence_groups(sel, 1)
    assert [layer for g in groups for layer in g] == sel
    g_count = len(groups)
    assert 2 ** (g_count + 1) - g_count - 2 >= n and (g_count == 1 or 2 ** g_count - g_count - 1 < n)
    assert max(_alive_counts(n, 1)) == n + g_count == pair_inputs_alive_bound(n, 1)
    assert max(_alive_counts(n, 1)) <= 2 * n
    for every in (2, 5):
        assert second_sequence_groups(sel, every) == checkpoint_groups(sel, every)
        assert max(_alive_counts(n, every)) <= pair_inputs_alive_bound(n, every)
    if n == 24:      # Qwen2.5-0.5B: 28 inputs instead of 48
        assert [len(g) for g in groups] == [13, 7, 3, 1] and pair_inputs_alive_bound(24, 1) == 28


@pytest.mark.parametrize("family", FAMILIES)
def test_graded_groups_on_a_deeper_model_match_hf_peft_float64(family):
    """Seven layers (the rejected sequence's groups 3, 3, 1 from the bottom, so two of them are rebuilt): the
    default step equals the HF + PEFT oracle, and bit for bit the step that keeps every input of both."""
    import dataclasses

    base = random_case(3, family)
    case = dataclasses.replace(base, arch=dataclasses.replace(base.arch, layers=7))
    gen = torch.Generator().manual_seed(7)
    hf = random_hf_model(case.arch, gen)
    weights = our_weights(case.arch, hf, torch.float64)
    lora = lora_for(case.arch, case.lora, seed=3)
    peft_model = peft_wrap(hf, case.lora, lora)
    prompt, chosen, rejected = _pair(case, gen)
    loss, ref, lps, grads = _oracle(peft_model, case.arch, case.lora, prompt, chosen, rejected, 0.5)
    c, r = pair_rows(prompt, chosen, rejected)
    graded = dpo_step(case.arch, weights, case.lora, lora, c, r, ref, beta=0.5)
    same = dpo_step(case.arch, weights, case.lora, lora, c, r, ref, beta=0.5, second_groups="same")
    torch.testing.assert_close(graded.loss, loss)
    assert_rel_close(graded.grads, grads, max_rel=1e-5)
    for a, b in zip(graded.grads, same.grads):
        for t in a:
            assert torch.equal(a[t].a, b[t].a) and torch.equal(a[t].b, b[t].b)
