"""The target-neutral program contract (no exporter involved): the method signatures, the flat state layout,
the weights file, and the method bodies against the MeSP primitives they chain."""

from __future__ import annotations

import json

import pytest
import torch

from toolchain.contract import LAYER
from toolchain.export.bodies import example_inputs, method_module
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import StepOptions, mesp_step
from toolchain.models import ModelArch, random_weights
from toolchain.optim import OptimizerConfig
from toolchain.program.spec import ProgramSpec, QuantSpec, flat_state, method_specs, state_layout, unflatten_state
from toolchain.program.weights_file import ALIGN, map_weights, model_weights, weight_tensors, write_weights

ARCH = ModelArch(hidden=24, layers=3, heads=3, kv_heads=1, intermediate=40, vocab=50, max_positions=32)
CFG = LoraConfig(rank=2, alpha=4, targets=("k_proj", "up_proj"))
T = 10


def _spec(**kw) -> ProgramSpec:
    return ProgramSpec(ARCH, CFG, T, options=StepOptions(vocab_chunk=16, mlp_chunk=4), **kw)


def test_methods_and_their_bindings():
    sgd = method_specs(_spec())
    assert list(sgd) == ["embed", "block_forward", "head_loss", "block_backward"]  # SGD: unselected layers stay
    adamw = method_specs(_spec(optimizer=OptimizerConfig("adamw")))
    assert "block_skip_update" in adamw
    assert "block_skip_update" in method_specs(_spec(optimizer=OptimizerConfig("sgd", weight_decay=0.1)))
    assert "block_skip_update" not in method_specs(_spec(optimizer=OptimizerConfig("adamw", frozen_unselected=True)))
    bb = adamw["block_backward"]
    names = [io.name for io in bb.inputs]
    assert names[:4] == ["dout", "x", "lr", "step"]
    state_in = [io for io in bb.inputs if io.bind == "state" and io.name != "step"]
    # the layer's LoRA pairs, then both moments, in state_layout's order, with {layer} in the entry name
    assert [io.ref for io in state_in][:2] == [f"lora_{LAYER}_k_proj_a", f"lora_{LAYER}_k_proj_b"]
    assert [io.ref for io in state_in][-1] == f"adam_v_{LAYER}_up_proj_b"
    assert [o.name for o in bb.outputs] == ["dx"] + [io.name + "_out" for io in state_in]
    assert all(o.ref == i.ref and o.shape == i.shape for o, i in zip(bb.outputs[1:], state_in))
    layer0 = {e.name for e in state_layout(ARCH, CFG, OptimizerConfig("adamw")) if e.layer == 0}
    assert {io.ref.replace(LAYER, "0") for io in state_in} == layer0
    # the LM head comes in vocabulary chunks, views of the same weight (no slice inside the program)
    chunks = [io for io in sgd["head_loss"].inputs if io.name.startswith("head_")]
    assert [c.rows for c in chunks] == [(0, 16), (16, 32), (32, 48), (48, 50)] and chunks[-1].shape == (2, 24)
    # int4: projections as packed nibbles + scales
    q = {io.name: io for io in method_specs(_spec(quant=QuantSpec("int4", 8)))["block_forward"].inputs}
    assert (q["w_up_proj_q"].dtype, q["w_up_proj_q"].shape, q["w_up_proj_scale"].shape) == ("uint8", (40, 12), (40, 3))


def test_flat_state_layout_round_trip():
    layout = state_layout(ARCH, CFG, OptimizerConfig("adamw"))
    lora = init_lora(ARCH, CFG, seed=2, zero_b=False)
    flat = flat_state(layout, lora)
    assert flat.numel() == layout[-1].offset + 1
    views = unflatten_state(layout, flat)
    assert torch.equal(views["lora_2_up_proj_b"], lora[2]["up_proj"].b.float())
    assert float(views["adam_step"][0]) == 0.0 and float(views["adam_v_1_k_proj_a"].abs().sum()) == 0.0
    views["lora_0_k_proj_a"].fill_(3.0)  # views write through
    assert float(flat[layout[0].offset]) == 3.0


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_weights_file_round_trip_is_aligned_and_mapped(tmp_path, quant):
    weights = random_weights(ARCH, seed=1)
    spec = QuantSpec(quant, 8)
    tensors = weight_tensors(weights, spec)
    path = tmp_path / "w.safetensors"
    write_weights(path, tensors)
    mapped = map_weights(path)
    assert set(mapped) == set(tensors)
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8:8 + header_len])
    for key, t in tensors.items():
        assert torch.equal(mapped[key], t), key
        assert (8 + header_len + header[key]["data_offsets"][0]) % ALIGN == 0, key
    from safetensors.torch import load_file

    assert set(load_file(str(path))) >= set(tensors)  # a plain safetensors file (padding tensors start with __)
    back = model_weights(mapped, ARCH, spec)
    for lw_back, lw in zip(back.layers, weights.layers):
        assert set(lw_back.present()) == set(lw.present()) == set(ARCH.layer_shapes())
        for name in lw.present():
            got = getattr(lw_back, name)
            if quant == "none":
                assert torch.equal(got, getattr(lw, name))
            elif name.endswith("_proj"):
                assert got.bits == spec.bits and got.chunk_rows >= 1


def test_method_bodies_chain_the_mesp_primitives():
    """block_forward / block_backward / head_loss / the loop order against mesp_step (float64)."""
    weights = random_weights(ARCH, seed=1).to(torch.float64)
    lora = init_lora(ARCH, CFG, seed=3, zero_b=False, dtype=torch.float64)
    spec = _spec()
    methods = method_specs(spec)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, ARCH.vocab, (T,), generator=g)
    ref = mesp_step(ARCH, weights, CFG, lora, ids, ids.clone(), options=spec.options)

    def bind(name: str, layer: int | None, values: dict) -> list:
        out = []
        for io in methods[name].inputs:
            if io.bind == "weight":
                key = io.ref.replace(LAYER, str(layer))
                t = weight_tensors(weights, QuantSpec())[key].double() if "layers" in key else \
                    {"embed": weights.embed, "final_norm": weights.final_norm}[key]
                out.append(t[io.rows[0]:io.rows[1]] if io.rows else t)
            elif io.bind == "state":
                i, t_, w = layer, *io.ref.split("_", 2)[2].rsplit("_", 1)
                out.append(getattr(lora[i][t_], w))
            else:
                out.append(values[io.ref])
        return out

    run = {n: method_module(spec, n) for n in methods}
    x = run["embed"](*bind("embed", None, {"input_ids": ids}))[0]
    ckpts = []
    for i in range(ARCH.layers):
        ckpts.append(x)
        x = run["block_forward"](*bind("block_forward", i, {"x": x}))[0]
    loss, d = run["head_loss"](*bind("head_loss", None, {"x": x, "labels": ids.clone()}))
    torch.testing.assert_close(loss[0], ref.loss)
    lr = torch.tensor([0.25], dtype=torch.float64)
    for i in reversed(range(ARCH.layers)):
        out = run["block_backward"](*bind("block_backward", i, {"d": d, "checkpoint": ckpts[i], "lr": lr}))
        d = out[0]
        for io, new in zip(methods["block_backward"].outputs[1:], out[1:]):
            t_, w = io.ref.split("_", 2)[2].rsplit("_", 1)
            torch.testing.assert_close(new, getattr(lora[i][t_], w) - 0.25 * getattr(ref.grads[i][t_], w))


def test_every_method_traces_with_torch_export():
    spec = _spec(quant=QuantSpec("int4", 8), optimizer=OptimizerConfig("adamw"))
    for name, m in method_specs(spec).items():
        ep = torch.export.export(method_module(spec, name), example_inputs(m), strict=False)
        assert len(ep.graph_signature.user_outputs) == len(m.outputs), name
        assert not ep.graph_signature.parameters and not ep.graph_signature.buffers, name  # no weight inside
