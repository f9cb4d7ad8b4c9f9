"""Test oracles and comparisons shared by the test suite.

The oracle of every gradient test is Hugging Face's model of the family (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`,
`LlamaForCausalLM`) + PEFT, run in float64.
Two things keep a stock float64 HF model from being a float64 reference, and both are handled here:

- the families' RMSNorms and `eager_attention_forward` compute in float32 (`.to(torch.float32)`,
  `softmax(..., dtype=torch.float32)`): upcasts for bf16/fp16 models, *downcasts* in a float64 one.
  `float64_faithful_hf()` swaps in the same formulas without the cast; `test_hf_oracle.py` checks that
  in float32 (where the cast is a no-op) the swapped forms give bit-identical logits.
- HF's loss upcasts logits with `.float()`: we compute the reference loss in float64 ourselves from
  HF's float64 logits (`hf_loss`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from toolchain.lora import (ALL_TARGETS, LoraConfig, LoraPair, LoraWeights, init_lora, lora_from_state_dict,
                            lora_state_dict)
from toolchain.models import ModelArch, ModelWeights, RopeScaling, weights_from_state_dict

__all__ = [
    "CASE_SEEDS", "Case", "CaseData", "Checkpoint", "HfReference", "assert_grads_close", "assert_rel_close",
    "build_case", "flat_grads", "float64_faithful_hf", "hf_loss", "hf_peft_sgd", "hf_reference", "lora_for", "max_op_output_numel",
    "our_weights", "peft_config", "peft_wrap", "random_arch", "random_case", "random_hf_model", "random_labels",
    "random_family_arch", "randomize_hf_params", "rel_error", "save_checkpoint", "saved_activation_nbytes", "small_arch",
]


# ---------------------------------------------------------------- random configurations (from seeds, untuned)

@dataclass(frozen=True)
class Case:
    """One whole-model test configuration: architecture, LoRA config and one labelled sequence."""

    seed: int
    arch: ModelArch
    lora: LoraConfig
    seq_len: int

    def __str__(self) -> str:
        a, c = self.arch, self.lora
        targets = "+".join(t.split("_")[0] for t in c.targets)
        return (f"seed{self.seed}-d{a.hidden}-L{a.layers}-H{a.heads}kv{a.kv_heads}-f{a.intermediate}-V{a.vocab}-"
                f"{'tied' if a.tie_embeddings else 'untied'}-r{c.rank}{'rs' if c.use_rslora else ''}-{targets}"
                f"-T{self.seq_len}")


def random_arch(seed: int) -> ModelArch:
    """A small random Qwen2 architecture.

    The GQA regime cycles with the seed (kv_heads = 1, kv_heads = heads, 1 < kv_heads < heads) and so
    does tying (even seeds tied), so any 6 consecutive seeds cover every combination; everything else
    is drawn from `random.Random(seed)`. hidden = heads * head_dim is always even (head_dim must be
    even for RoPE); heads, intermediate and vocab are often odd.
    """
    rng = random.Random(seed)
    regime = seed % 3
    if regime == 2:  # a proper GQA ratio needs a composite head count
        kv_heads = rng.choice([2, 3])
        heads = kv_heads * rng.choice([2, 3])
    else:
        heads = rng.choice([1, 2, 3, 5, 7])
        kv_heads = 1 if regime == 0 else heads
    head_dim = rng.choice([2, 4, 6, 8, 10, 12, 16])
    return ModelArch(
        hidden=heads * head_dim, layers=rng.randint(1, 3), heads=heads, kv_heads=kv_heads,
        intermediate=rng.randint(3, 61), vocab=rng.randint(11, 97), max_positions=rng.randint(65, 128),
        rms_eps=rng.choice([1e-6, 1e-5]), rope_theta=rng.choice([10_000.0, 1_000_000.0]),
        tie_embeddings=seed % 2 == 0,
    )


def random_family_arch(seed: int, family: str) -> ModelArch:
    """`random_arch(seed)` as a `family` architecture: qwen3 and llama get an explicit head_dim that differs
    from hidden / heads (hidden drawn apart from it), llama the llama3 rope scaling with random factors and an
    original context shorter than the sequences (so every band of the frequency interpolation is exercised)."""
    base = random_arch(seed)
    if family == "qwen2":
        return base
    rng = random.Random(20_000 + seed)
    head_dim = rng.choice([2, 4, 6, 8, 10, 12, 16])
    # LlamaConfig insists on hidden % heads == 0 even with an explicit head_dim; Qwen3Config does not
    step = base.heads if family == "llama" else 2
    hidden = rng.choice([h for h in range(step, 41, step) if h != base.heads * head_dim and h >= 4])
    scaling = None
    if family == "llama":
        low = rng.choice([1.0, 2.0])
        scaling = RopeScaling(factor=rng.choice([2.0, 8.0, 32.0]), low_freq_factor=low,
                              high_freq_factor=low * rng.choice([2.0, 4.0]), original_max_positions=rng.randint(4, 64))
    return dataclasses.replace(base, family=family, hidden=hidden, head_dim=head_dim, qkv_bias=None, qk_norm=None,
                               rope_scaling=scaling)


def random_case(seed: int, family: str = "qwen2") -> Case:
    rng = random.Random(10_000 + seed)
    targets = tuple(rng.sample(ALL_TARGETS, rng.randint(1, len(ALL_TARGETS))))
    rank = rng.randint(1, 8)
    lora = LoraConfig(rank=rank, alpha=rng.choice([float(rank), 2.0 * rank, 16.0, 5.5]), targets=targets,
                      use_rslora=rng.random() < 0.25)
    return Case(seed, random_family_arch(seed, family), lora, seq_len=rng.randint(2, 65))


def random_labels(input_ids: Tensor, gen: torch.Generator, *, ignore_frac: float = 0.25) -> Tensor:
    """labels = input_ids with about `ignore_frac` of the positions set to -100 (at least one target kept)."""
    labels = input_ids.clone()
    drop = torch.rand(labels.shape, generator=gen) < ignore_frac
    labels[drop] = -100
    if bool((labels[1:] == -100).all()):
        labels[-1] = input_ids[-1]
    return labels


# ---------------------------------------------------------------- the Hugging Face + PEFT oracle

def randomize_hf_params(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Every parameter random: norms ~ 1 + 0.1 N, biases 0.5 N, matrices N(0, 1/fan_in), so that
    activations are O(1) and every nonlinearity is exercised (HF's init std 0.02 would make the
    model nearly linear)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if "norm" in name:
                value = 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.5 * noise
            else:
                value = noise / math.sqrt(p.shape[-1])
            # Rounded through float32 so that a float32 run sees exactly the model the float64 reference
            # differentiates (its error is then arithmetic alone, not input rounding).
            p.copy_(value.to(torch.float32).to(p.dtype))


def random_hf_model(arch: ModelArch, gen: torch.Generator, dtype: torch.dtype = torch.float64):
    """A randomly initialized HF model of `arch`'s family (`Qwen2ForCausalLM`, ...; eager attention), in eval mode."""
    from toolchain.models.family import get_family

    config = arch.to_hf_config()
    config._attn_implementation = "eager"
    model = get_family(arch.family).causal_lm()(config).to(dtype).eval()
    randomize_hf_params(model, gen)
    if arch.tie_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def our_weights(arch: ModelArch, hf_model, dtype: torch.dtype) -> ModelWeights:
    """Our weight bundle read from the HF model's state dict (exercises the key table too)."""
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return weights_from_state_dict(arch, sd, dtype=dtype)


def peft_config(cfg: LoraConfig):
    import peft

    return peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.targets), lora_dropout=0.0,
                           use_rslora=cfg.use_rslora, task_type="CAUSAL_LM")


def peft_wrap(hf_model, cfg: LoraConfig, lora: LoraWeights):
    """`peft.get_peft_model` + our LoRA tensors set through PEFT's own state-dict loader."""
    import peft

    model = peft.get_peft_model(hf_model, peft_config(cfg))
    result = peft.set_peft_model_state_dict(model, lora_state_dict(lora))
    assert not result.unexpected_keys, result.unexpected_keys
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(loaded) == len(lora_state_dict(lora)), "PEFT adapted different modules than our config"
    for name, p in loaded.items():
        assert p.requires_grad and p.dtype == hf_model.dtype, (name, p.dtype)
    return model.eval()


def _rmsnorm_in_input_dtype(self, hidden_states: Tensor) -> Tensor:
    # Qwen2RMSNorm.forward without `.to(torch.float32)` (identical when the model is float32).
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _eager_attention_in_input_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    # transformers' eager_attention_forward without `softmax(..., dtype=torch.float32)`.
    from transformers.models.qwen2.modeling_qwen2 import repeat_kv

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


@contextlib.contextmanager
def float64_faithful_hf() -> Iterator[None]:
    """Within the block, every family's RMSNorm (Qwen3's q/k norms too) and eager attention compute in the input
    dtype (float64)."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    with pytest.MonkeyPatch.context() as mp:
        for module, norm in ((modeling_qwen2, "Qwen2RMSNorm"), (modeling_qwen3, "Qwen3RMSNorm"),
                             (modeling_llama, "LlamaRMSNorm")):
            mp.setattr(getattr(module, norm), "forward", _rmsnorm_in_input_dtype)
            mp.setattr(module, "eager_attention_forward", _eager_attention_in_input_dtype)
        yield


def hf_loss(model, input_ids: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross-entropy in the logits' own dtype (HF's loss would upcast to float32)."""
    logits = model(input_ids=input_ids[None]).logits                # [1, T, V]
    assert logits.dtype == model.dtype
    return F.cross_entropy(logits[0, :-1], labels[1:], ignore_index=-100)


@dataclass(frozen=True)
class HfReference:
    loss: Tensor          # [] float64
    grads: LoraWeights    # float64, our structure


def hf_reference(peft_model, arch: ModelArch, cfg: LoraConfig, input_ids: Tensor, labels: Tensor) -> HfReference:
    """Loss and LoRA gradients of HF + PEFT by autograd, in float64 throughout."""
    peft_model.zero_grad(set_to_none=True)
    with float64_faithful_hf():
        loss = hf_loss(peft_model, input_ids, labels)
    loss.backward()
    sd = {n.replace(".default.", "."): p.grad.detach().clone() for n, p in peft_model.named_parameters()
          if "lora_" in n}
    peft_model.zero_grad(set_to_none=True)
    return HfReference(loss.detach(), lora_from_state_dict(arch, cfg, sd, dtype=torch.float64))


# ---------------------------------------------------------------- seeded whole-model cases and checkpoints

# Whole-model configurations: seeds, not hand-picked shapes (see random_arch).
CASE_SEEDS = list(range(10))


@dataclass
class CaseData:
    """A case with its HF + PEFT oracle and our float64 inputs."""

    case: Case
    hf_model: torch.nn.Module      # Qwen2ForCausalLM, float64 (wrapped in place by PEFT)
    peft_model: torch.nn.Module
    weights: ModelWeights          # float64, read from the HF state dict
    lora: LoraWeights              # float64
    input_ids: torch.Tensor        # [T]
    labels: torch.Tensor           # [T]
    ref: HfReference               # float64 loss and gradients


def build_case(seed: int, family: str = "qwen2") -> CaseData:
    case = random_case(seed, family)
    gen = torch.Generator().manual_seed(seed)
    hf_model = random_hf_model(case.arch, gen)
    weights = our_weights(case.arch, hf_model, torch.float64)
    lora = lora_for(case.arch, case.lora, seed=seed)
    peft_model = peft_wrap(hf_model, case.lora, lora)
    input_ids = torch.randint(0, case.arch.vocab, (case.seq_len,), generator=gen)
    labels = random_labels(input_ids, gen)
    ref = hf_reference(peft_model, case.arch, case.lora, input_ids, labels)
    return CaseData(case, hf_model, peft_model, weights, lora, input_ids, labels, ref)


@dataclass
class Checkpoint:
    path: Path
    arch: ModelArch
    hf_model: torch.nn.Module   # float32, as saved


def save_checkpoint(path: Path, arch: ModelArch, seed: int = 0) -> Checkpoint:
    """A random float32 Qwen2ForCausalLM written with `save_pretrained` (config.json + model.safetensors)."""
    model = random_hf_model(arch, torch.Generator().manual_seed(seed), dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    return Checkpoint(path, arch, model)


def small_arch(*, tied: bool) -> ModelArch:
    return ModelArch(hidden=24, layers=2, heads=3, kv_heads=1, intermediate=37, vocab=67, max_positions=40,
                      rope_theta=10_000.0, tie_embeddings=tied)


# ---------------------------------------------------------------- comparisons

def flat_grads(grads: LoraWeights) -> dict[str, Tensor]:
    """PEFT-keyed flat view of per-layer gradients (layers with empty dicts contribute nothing)."""
    return lora_state_dict(grads)


def rel_error(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max |expected| (in float64); an all-zero `expected` (e.g. a gradient that
    vanishes structurally) must be matched exactly: 0.0 if so, inf otherwise."""
    diff = float((actual.double() - expected.double()).abs().max())
    scale = float(expected.double().abs().max())
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else float("inf")


def _report(actual: dict[str, Tensor], expected: dict[str, Tensor]) -> str:
    lines = []
    for k in expected:
        a, e = actual[k].double(), expected[k].double()
        abs_err = float((a - e).abs().max())
        lines.append(f"  {k}: max abs err {abs_err:.3e}, rel err {rel_error(a, e):.3e}")
    return "\n".join(lines)


def assert_grads_close(actual: LoraWeights | dict[str, Tensor], expected: LoraWeights | dict[str, Tensor],
                       **tolerances) -> None:
    """Same keys, dtypes and shapes, and values within `torch.testing.assert_close`'s default tolerances
    for the dtype (or the given ones). Prints max abs/rel error per tensor (shown with `pytest -s` or
    on failure)."""
    actual = actual if isinstance(actual, dict) else flat_grads(actual)
    expected = expected if isinstance(expected, dict) else flat_grads(expected)
    assert sorted(actual) == sorted(expected), (sorted(actual), sorted(expected))
    report = _report(actual, expected)
    print(report)
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], msg=lambda m, k=k: f"{k}: {m}\n{report}", **tolerances)


def assert_rel_close(actual: LoraWeights | dict[str, Tensor], expected: LoraWeights | dict[str, Tensor],
                     max_rel: float, *, zero_atol: float = 1e-6) -> None:
    """Per tensor: max|actual - expected| / max|expected| <= max_rel (dtypes may differ). A tensor whose
    reference is exactly zero (q/k gradients when every query can attend to itself only, T <= 2: dS = 0
    analytically, but the rowsum(dO * O) form leaves float32 rounding of terms of magnitude ~1 that cancel)
    has no relative error: it is measured against the largest |expected| of the step's other tensors, or,
    when every reference tensor is zero, absolutely (max|actual| <= zero_atol)."""
    actual = actual if isinstance(actual, dict) else flat_grads(actual)
    expected = expected if isinstance(expected, dict) else flat_grads(expected)
    assert sorted(actual) == sorted(expected)
    report = _report(actual, expected)
    print(report)
    overall = max(float(v.abs().max()) for v in expected.values())

    def err(k: str) -> float:
        if float(expected[k].abs().max()) > 0.0:
            return rel_error(actual[k], expected[k])
        diff = float((actual[k].double() - expected[k].double()).abs().max())
        return diff / overall if overall > 0 else diff * max_rel / zero_atol

    worst = max(err(k) for k in expected)
    assert worst <= max_rel, f"relative error {worst:.3e} > {max_rel:.0e}\n{report}"


# ---------------------------------------------------------------- memory accounting

def saved_activation_nbytes(saved_bundle, param_tensors) -> int:
    """Bytes of the tensors in a saved bundle (any pytree: NamedTuples, dicts, LoraPairs) that are not
    parameters. Parameters are recognized by identity, so a saved *copy* of a weight counts."""
    param_ids = {id(p) for p in tree_leaves(param_tensors) if isinstance(p, Tensor)}
    seen, total = set(), 0
    for leaf in tree_leaves(saved_bundle):
        if isinstance(leaf, Tensor) and id(leaf) not in param_ids and id(leaf) not in seen:
            seen.add(id(leaf))
            total += leaf.numel() * leaf.element_size()
    return total


class _OpOutputs(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):  # views allocate nothing
            for leaf in tree_leaves(out):
                if isinstance(leaf, Tensor):
                    self.shapes.append((str(func), tuple(leaf.shape)))
        return out


def max_op_output_numel(fn, *args, **kwargs) -> tuple[int, list[tuple[str, tuple[int, ...]]], object]:
    """Run `fn` recording the output shape of every ATen op that allocates (views and in-place ops
    are skipped). Returns (largest numel, the (op, shape) list in call order, fn's result)."""
    with _OpOutputs() as mode:
        result = fn(*args, **kwargs)
    largest = max((math.prod(s) for _, s in mode.shapes), default=0)
    return largest, mode.shapes, result


def lora_for(arch: ModelArch, cfg: LoraConfig, seed: int, dtype: torch.dtype = torch.float64) -> LoraWeights:
    """Random adapter with B != 0 too, so that both dA and dB are non-trivial. Drawn in float32 (then
    cast), so float32 and float64 runs start from the same values."""
    lora = init_lora(arch, cfg, seed=seed, dtype=torch.float32, zero_b=False)
    return tuple({t: LoraPair(p.a.to(dtype), p.b.to(dtype)) for t, p in layer.items()} for layer in lora)


def eager_program_run(pdir, program, lora: LoraWeights, examples, steps: int, lr: float) -> tuple[list[float], Tensor]:
    """The exported program's reference: the same `StepProgram` run by PyTorch, driven as the host runtime
    drives a runtime (phase schedule from the manifest, rows padded to seq_len, the flat state held as
    the app holds it). Returns (losses, final flat state)."""
    from toolchain.program.spec import flat_state
    from toolchain.training import pad_row

    flat = flat_state(program.layout, lora)
    pad_id = pdir.tokenizer.pad_token_id
    losses = []
    for s in range(steps):
        ids, labels = pad_row(examples[s % len(examples)], pdir.seq_len, pad_id, "row")
        _, phase = pdir.method_for_step(s)
        layers = None if phase is None else pdir.lcsb.phases[phase]
        losses.append(program.eager_step(ids, labels, lr, flat, layers))
    return losses, flat


def hf_peft_sgd(hf_model, cfg: LoraConfig, lora: LoraWeights, examples, steps: int, lr: float):
    """Reference for a training run: the float64 HF model + PEFT (float64-faithful RMSNorm/attention)
    trained with torch.optim.SGD, batch 1, row s % len(examples) at step s, unpadded (causal: trailing
    padding changes nothing). Returns (losses, the trained adapter as a PEFT-keyed state dict)."""
    model = peft_wrap(hf_model, cfg, tuple({t: p._replace(a=p.a.double(), b=p.b.double()) for t, p in layer.items()}
                                           for layer in lora))  # the float32 adapter, exactly, in float64
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for s in range(steps):
        ex = examples[s % len(examples)]
        with float64_faithful_hf():
            loss = hf_loss(model, ex.input_ids, ex.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {n.replace(".default", ""): p.detach() for n, p in model.named_parameters() if p.requires_grad}


def max_rel_diff(a: dict, b: dict) -> float:
    """max over keys of max|a - b| / max|b| (float64), the keys being the same."""
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max()) for k in b)
