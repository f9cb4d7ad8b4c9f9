"""The XNNPACK generation variant (`export --xnnpack-generation`): generation at a usable speed on a runtime
without the native kernels (the published Android AAR; the Python bindings without libtoolchain_kernels).

The stock generation methods take every weight as an input and dequantize int4 chunk by chunk with portable
operators (~1 token/s at Qwen2.5-0.5B); XNNPACK has int8 x int4 kernels, but only for constant weights, which it
packs once at load. So this variant is what ExecuTorch's own `export_llama -qmode 8da4w` program is: per layer a
`block_prefill_xnnpack_{i}` and a `block_decode_xnnpack_{i}` holding layer i's frozen weights as constants, and
`head_logits_xnnpack` holding the final norm and the whole int4 head; every int4 matmul is int8 dynamically
quantized activations x int4 weights (mesp/ops/int8da_int4w.py), delegated whole to XNNPACK. The LoRA pairs,
the KV cache and the activations stay inputs (the live adapter, as the other variants).

Costs (docs/export.md "Generation"): the weights are in the .pte a second time (beside the weights file the
training methods read), and XNNPACK's packed copy of every weight a method holds is anonymous memory from the
method's load on; a block_prefill and a block_decode of one layer are packed separately.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from toolchain.contract import LAYER, MethodSpec
from toolchain.program.spec import QUANTIZED_FIELDS, ProgramSpec, method_specs
from toolchain.lora.weights import LoraPair
from toolchain.mesp.block import BlockParams
from toolchain.mesp.decode import block_decode, decode_rope, head_logits
from toolchain.mesp.ops.int8da_int4w import Int4Constant, int4_constant
from toolchain.models.weights import LayerWeights

__all__ = ["xnnpack_method_module"]


def _tensor(weights: Mapping[str, Tensor], key: str, rows: tuple[int, int] | None) -> Tensor:
    t = weights[key]
    return t if rows is None else t[rows[0]:rows[1]]


class _ConstMethod(nn.Module):
    """One XNNPACK-variant method: forward(the MethodSpec's inputs) with the stock method's weight inputs (the
    layer's, or the head's) as buffers: int4 matrices as `Int4Constant`s, the rest float32 copies."""

    def __init__(self, spec: ProgramSpec, method: MethodSpec, stock: MethodSpec, weights: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.spec, self.method = spec, method
        self.names = [io.name for io in method.inputs]
        layer = "0" if method.layer is None else str(method.layer)
        self.matrices: list[str] = []
        self.plain: list[str] = []
        ios = {io.name: io for io in stock.inputs if io.bind == "weight"}
        for name, io in ios.items():
            key = io.ref.replace(LAYER, layer)
            if name.endswith("_scale"):
                continue
            if name.endswith("_q"):
                base = name.removesuffix("_q")
                c = int4_constant(_tensor(weights, key, io.rows),
                                  _tensor(weights, ios[base + "_scale"].ref.replace(LAYER, layer), io.rows))
                for field, t in zip(("q", "scale", "zero"), c):
                    self.register_buffer(f"{base}__{field}", t)
                self.matrices.append(base)
            else:
                self.register_buffer(name, _tensor(weights, key, io.rows).to(torch.float32).clone())
                self.plain.append(name)

    def _matrix(self, base: str) -> Int4Constant:
        return Int4Constant(*(getattr(self, f"{base}__{f}") for f in ("q", "scale", "zero")))

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        ins = dict(zip(self.names, inputs))
        spec, arch = self.spec, self.spec.arch
        if self.method.role == "head_logits":
            return (head_logits(ins["x"], self.final_norm, [self._matrix("head")], arch.rms_eps),)
        fields = {name: None for name in LayerWeights._fields}
        for name in arch.layer_shapes():
            fields[name] = self._matrix(f"w_{name}") if name in QUANTIZED_FIELDS else getattr(self, f"w_{name}")
        lora = {t: LoraPair(ins[f"lora_{t}_a"], ins[f"lora_{t}_b"]) for t in spec.lora.targets}
        x, pos = ins["x"], ins["pos"]
        p = BlockParams(LayerWeights(**fields), lora, spec.lora.scale, arch)
        rope = decode_rope(pos, x.shape[0], arch.head_dim, arch.rope_theta, x.dtype, arch.rope_inv_freq())
        return block_decode(x, pos, ins["k_cache"], ins["v_cache"], p, rope)


def _stock_of(spec: ProgramSpec, method: MethodSpec) -> MethodSpec:
    """The method whose weights the variant holds: the stock block method, or head_logits_fused (the whole head)."""
    specs = method_specs(spec)
    return specs["head_logits_fused"] if method.role == "head_logits" else specs[method.role]


def xnnpack_method_module(spec: ProgramSpec, method: MethodSpec, weights: Mapping[str, Tensor]) -> nn.Module:
    """The module of XNNPACK-variant `method`, its weights copied from `weights` (the program's weights file,
    keys as the manifest's `ref`s). Run eagerly it is the reference of the delegated method's numerics."""
    if method.variant is None:
        raise ValueError(f"{method.name} is not an XNNPACK-variant method")
    return _ConstMethod(spec, method, _stock_of(spec, method), weights)
