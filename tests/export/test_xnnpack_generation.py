"""The XNNPACK generation variant (`export --xnnpack-generation`, export/xnnpack_generation.py): per-layer
block_prefill / block_decode methods and a head_logits holding their int4 weights, int8 dynamically quantized
activations x int4 weights delegated to XNNPACK, chosen when the native kernels are missing.

The reference is the same methods run eagerly (`xnnpack_method_module`: PyTorch's `quantized_decomposed`
ops, an implementation independent of XNNPACK's kernels, with the same quantized values): the ExecuTorch
logits equal it to float32 rounding of a differently ordered sum (bounded below), and the greedy ids are equal
wherever the reference's top-two logit margin exceeds twice that bound (checked for every generated token, so
the equality is not luck)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import lora_for, our_weights, random_hf_model

from toolchain.export.build import ExportSpec, export_program
from toolchain.export.xnnpack_generation import xnnpack_method_module
from toolchain.lora import LoraConfig
from toolchain.mesp.ops.int8da_int4w import int4_constant, linear_8da4w, unpack_int4
from toolchain.mesp.ops.quant import QuantWeight, dequantize, quantize
from toolchain.models import ModelArch
from toolchain.program import ProgramDir
from toolchain.program.spec import QuantSpec, method_specs
from toolchain.runtime import LayerLoop
from toolchain.runtime.generate import generate, generation_names
from toolchain.runtime.program_runtime import open_runtime

T = 24
CFG = LoraConfig(rank=4, alpha=8.0)
# hidden 64, intermediate 96, q_dim 64: group 32 (XNNPACK's blockwise int4 takes group sizes that are multiples of 32)
ARCH = ModelArch(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=90, max_positions=64)
GROUP = 32


class EagerVariant:
    """The variant's methods run in PyTorch (the reference): `execute(name, inputs)` like the host runtimes."""

    backend = "eager"

    def __init__(self, pdir: ProgramDir, names: list[str]) -> None:
        spec = pdir.spec
        methods = method_specs(spec)
        from toolchain.runtime.eager_runtime import EagerRuntime

        self.stock = EagerRuntime(spec, [n for n in names if methods[n].variant is None])
        self.mods = {n: xnnpack_method_module(spec, methods[n], pdir.weights()) for n in names
                     if methods[n].variant is not None}
        self.methods_loaded = tuple(names)

    def execute(self, name, inputs):
        if name in self.mods:
            with torch.no_grad():
                return [t.clone() for t in self.mods[name](*inputs)]
        return self.stock.execute(name, inputs)


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    gen = torch.Generator().manual_seed(5)
    weights = our_weights(ARCH, random_hf_model(ARCH, gen), torch.float32)
    lora = lora_for(ARCH, CFG, 5, torch.float32)       # B != 0 too: the variant's LoRA inputs matter
    out = tmp_path_factory.mktemp("xnn") / "prog"
    spec = ExportSpec(source="test", init="random", seed=5, seq_len=T, quant=QuantSpec("int4", GROUP),
                      targets=("executorch",), generation=True, pad_token_id=0, prefill_chunk=5,
                      xnnpack_generation=True)
    export_program(ARCH, weights, CFG, lora, spec, out)
    return ProgramDir(out)


def test_8da4w_linear_is_int8_rows_times_the_int4_weight_with_bfloat16_scales():
    """linear_8da4w against a hand computation: x rounded per row to 256 levels between its min and max (zero
    included), W = q * bfloat16(scale)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(48, 64, generator=g), torch.randn(3, 64, generator=g) * 3
    qw = quantize(w, "int4", 32)
    c = int4_constant(qw.q, qw.scale)
    assert torch.equal(unpack_int4(qw.q).float() * qw.scale.repeat_interleave(32, 1),
                       dequantize(QuantWeight(qw.q, qw.scale, 4)))
    lo, hi = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
    s = (hi - lo) / 255
    zp = (-128 - torch.round(lo / s)).clamp(-128, 127)
    xd = (torch.clamp(torch.round(x / s) + zp, -128, 127) - zp) * s
    wd = c.q.float() * qw.scale.to(torch.bfloat16).float().repeat_interleave(32, 1)
    torch.testing.assert_close(linear_8da4w(x, c), xd @ wd.T, rtol=1e-5, atol=1e-5)


def test_manifest_names_the_variant_and_every_layer_method(prog):
    m = json.loads((prog.path / "manifest.json").read_text())
    variant = {d["name"]: d for d in m["methods"] if d.get("variant") == "xnnpack"}
    assert set(variant) == {f"{r}_xnnpack_{i}" for r in ("block_prefill", "block_decode") for i in range(2)} | \
        {"head_logits_xnnpack"}
    assert [variant[f"block_decode_xnnpack_{i}"]["layer"] for i in range(2)] == [0, 1]
    assert "layer" not in variant["head_logits_xnnpack"]
    assert all(io["bind"] != "weight" for d in variant.values() for io in d["inputs"])
    x = m["generate"]["xnnpack"]
    assert x["methods"] == {"block_prefill": "block_prefill_xnnpack_{layer}",
                            "block_decode": "block_decode_xnnpack_{layer}", "head_logits": "head_logits_xnnpack"}
    per_layer = sum(o * i // 2 + o * i // GROUP * 2 for o, i in
                    (ARCH.linear_shape(t) for t in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj")))
    assert x["weight_bytes"] == 2 * 2 * per_layer + ARCH.vocab * ARCH.hidden // 2 + ARCH.vocab * ARCH.hidden // GROUP * 2
    # the variant's methods are XNNPACK delegates in the .pte
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary((prog.path / "model.pte").read_bytes())
    pte = getattr(pte, "program", pte)
    plans = {p.name: p for p in pte.execution_plan}
    for name in variant:
        assert [d.id for d in plans[name].delegates] and all(d.id == "XnnpackBackend" for d in plans[name].delegates)
    assert not plans["block_decode"].delegates


def test_without_the_native_kernels_generation_runs_the_variant(prog, monkeypatch):
    monkeypatch.setenv("TOOLCHAIN_NATIVE_KERNELS", "0")
    r = open_runtime(prog, "executorch", threads=1, use="generate")
    assert r.generation_variant == "xnnpack"
    assert set(r.methods_loaded) == {"embed_token", "embed_prefill", "head_logits_xnnpack"} | \
        {f"{role}_xnnpack_{i}" for role in ("block_prefill", "block_decode") for i in range(2)}
    names = generation_names(prog, r.methods_loaded)
    assert names["block_decode"] == "block_decode_xnnpack_{layer}" and names["head_logits"] == "head_logits_xnnpack"
    got = generate(prog, r, prog.state_init(), [3, 1, 4], 3)
    assert got.variant == "xnnpack" and not got.fused and got.timings()["variant"] == "xnnpack"
    monkeypatch.setenv("TOOLCHAIN_XNNPACK_GENERATION", "0")
    r = open_runtime(prog, "executorch", threads=1, use="generate")
    assert r.generation_variant == "stock" and set(r.methods_loaded) == {"embed_token", "embed_prefill",
                                                                        "block_prefill", "block_decode", "head_logits"}
    # training loads none of it
    t = open_runtime(prog, "executorch", threads=1, use="train")
    assert not any("xnnpack" in n or n.endswith("_fused") for n in t.methods_loaded)


def test_with_the_native_kernels_the_fused_methods_win(prog):
    from toolchain.native import KernelUnavailable, load_kernels

    try:
        load_kernels()
    except KernelUnavailable as e:
        pytest.skip(f"native kernels unavailable here: {e}")
    r = open_runtime(prog, "executorch", threads=1, use="generate")
    assert r.generation_variant == "fused" and not any("xnnpack" in n for n in r.methods_loaded)


def test_variant_greedy_ids_and_logits_equal_the_eager_reference(prog, monkeypatch):
    """ExecuTorch (XNNPACK qd8 x qb4w kernels) against the same methods in PyTorch: head logits and block
    outputs to float32 rounding, greedy ids equal with a margin checked at every step."""
    monkeypatch.setenv("TOOLCHAIN_NATIVE_KERNELS", "0")
    et = open_runtime(prog, "executorch", threads=1, use="generate")
    ref = EagerVariant(prog, list(et.methods_loaded))
    state = prog.state_init()
    prompt = [4, 9, 2, 33, 1, 8, 70]
    a = generate(prog, et, state, prompt, 12)
    b = generate(prog, ref, state, prompt, 12)
    assert a.variant == b.variant == "xnnpack"
    # per-method agreement on random inputs at a few positions: the bound the ids rely on
    views = prog.state_views(state)
    la, lb = LayerLoop(prog, et), LayerLoop(prog, ref)
    g = torch.Generator().manual_seed(2)
    worst = 0.0
    for _ in range(3):
        x = torch.randn(1, ARCH.hidden, generator=g)
        xa = la.call_method("head_logits_xnnpack", None, {"x": x}, views)["logits"]
        xb = lb.call_method("head_logits_xnnpack", None, {"x": x}, views)["logits"]
        worst = max(worst, float((xa - xb).abs().max()))
        torch.testing.assert_close(xa, xb, rtol=1e-4, atol=1e-4 * float(xb.abs().max()))
    cache = {f"{w}_{i}": torch.randn(ARCH.kv_heads, T, ARCH.head_dim, generator=g) for i in range(2) for w in "kv"}
    for i in range(2):
        for name, rows in ((f"block_decode_xnnpack_{i}", 1), (f"block_prefill_xnnpack_{i}", 5)):
            x = torch.randn(rows, ARCH.hidden, generator=g)
            p = torch.tensor([7])
            oa = la.call_method(name, i, {"x": x, "pos": p}, views, dict(cache), 7)["x"]
            ob = lb.call_method(name, i, {"x": x, "pos": p}, views, dict(cache), 7)["x"]
            torch.testing.assert_close(oa, ob, rtol=1e-4, atol=1e-4 * float(ob.abs().max()))
    # greedy: the reference's margin between its best and second-best logit at every step exceeds twice the
    # logits' disagreement bound, so the ids must agree
    logits_seen = []
    orig = ref.execute

    def spy(name, inputs):
        out = orig(name, inputs)
        if name == "head_logits_xnnpack":
            logits_seen.append(out[0].clone())
        return out

    ref.execute = spy
    b2 = generate(prog, ref, state, prompt, 12)
    assert b2.output_ids == b.output_ids
    bound = max(worst, 1e-5) * 4
    margins = [float(torch.topk(lg, 2).values[0] - torch.topk(lg, 2).values[1]) for lg in logits_seen]
    assert min(margins) > 2 * bound, (margins, bound)
    assert a.output_ids == b.output_ids


def test_bad_requests_are_refused():
    from toolchain.errors import BadInput
    from toolchain.program.spec import ProgramSpec

    for quant in (QuantSpec("int8", GROUP), QuantSpec("int4", GROUP, head=False)):
        with pytest.raises(BadInput, match="xnnpack-generation"):
            ProgramSpec(ARCH, CFG, T, quant=quant, generation=True, xnnpack_generation=True)
    with pytest.raises(BadInput, match="xnnpack-generation"):
        ProgramSpec(ARCH, CFG, T, quant=QuantSpec("int4", GROUP), generation=False, xnnpack_generation=True)
    spec = ExportSpec(source="test", init="random", seed=5, seq_len=T, quant=QuantSpec("int4", GROUP),
                      targets=("onnx",), generation=True, xnnpack_generation=True)
    with pytest.raises(BadInput, match="--target executorch"):
        spec.check(ARCH)
    assert dataclasses.replace(spec, targets=("executorch", "onnx")).check(ARCH) is None
