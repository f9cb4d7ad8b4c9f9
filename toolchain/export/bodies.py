"""What each method of a program computes: one body per role over the named inputs of its `MethodSpec`
(program/spec.py `method_specs`), from the MeSP block, head and decode functions (mesp/), and the module the
exporters trace (`method_module`) with its tracing inputs (`example_inputs`).

No math here: the bodies unpack inputs into the mesp functions' arguments and pack their results.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from toolchain.contract import GENERATION_ROLES, STATE_ROLE_PREFIX, MethodSpec
from toolchain.errors import BadInput
from toolchain.lora.weights import LoraPair
from toolchain.mesp.block import BlockParams, block_backward, block_forward, block_rope
from toolchain.mesp.decode import block_decode, decode_rope, head_logits
from toolchain.mesp.ops.compute import Compute
from toolchain.mesp.ops.quant import QuantWeight, embedding_rows, with_chunk_rows
from toolchain.mesp.step import head_loss_and_grad
from toolchain.models.weights import LayerWeights
from toolchain.optim import update_tensor
from toolchain.program.spec import ProgramSpec, layer_state_inputs, method_specs, state_roles

__all__ = ["method_module", "method_compute", "example_inputs"]


def _matrix(ins: dict[str, Tensor], name: str, bits: int, executorch: bool) -> Tensor | QuantWeight:
    """The matrix `matrix_inputs(name, ...)` passed: the float tensor, or the quantized pair (int4 dequantized
    by ExecuTorch's `embedding_4bit` if `executorch`: see mesp/ops/quant.py)."""
    if f"{name}_q" in ins:
        return QuantWeight(ins[f"{name}_q"], ins[f"{name}_scale"], bits, executorch=executorch)
    return ins[name]


def _head_chunks(ins: dict[str, Tensor], bits: int, executorch: bool) -> list[Tensor | QuantWeight]:
    """The `head_{j}` chunks of program/spec.py `_head_inputs`, in vocabulary order."""
    js = sorted({int(n.split("_")[1]) for n in ins if n.startswith("head_") and n.split("_")[1].isdigit()})
    return [_matrix(ins, f"head_{j}", bits, executorch) for j in js]


def _layer_weights(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool) -> LayerWeights:
    quant = spec.quant
    fields = {name: None for name in LayerWeights._fields}
    for name in spec.arch.layer_shapes():
        w = _matrix(ins, f"w_{name}", quant.bits, executorch)
        fields[name] = with_chunk_rows(w, quant.chunk_elems) if isinstance(w, QuantWeight) else w
    return LayerWeights(**fields)


def _layer_lora(spec: ProgramSpec, ins: dict[str, Tensor], prefix: str = "lora") -> dict[str, LoraPair]:
    return {t: LoraPair(ins[f"{prefix}_{t}_a"], ins[f"{prefix}_{t}_b"]) for t in spec.lora.targets}


def _rope(spec: ProgramSpec, dtype: torch.dtype):
    return block_rope(spec.arch, torch.arange(spec.seq_len), dtype)


def _update(spec: ProgramSpec, ins: dict[str, Tensor], grads: dict[str, LoraPair] | None) -> tuple[Tensor, ...]:
    """New layer state (in `layer_state_inputs` order) after one optimizer step; grads None = zero gradient."""
    o, lr = spec.optimizer, ins["lr"]
    new: dict[str, Tensor] = {}
    for t in spec.lora.targets:
        for which in ("a", "b"):
            p = ins[f"lora_{t}_{which}"]
            g = torch.zeros_like(p) if grads is None else getattr(grads[t], which)
            slots = tuple(ins[f"{STATE_ROLE_PREFIX[r]}_{t}_{which}"] for r in o.slot_roles)
            new[f"lora_{t}_{which}"], slots = update_tensor(o, p, g, slots, ins.get("step"), lr=lr)
            new.update((f"{STATE_ROLE_PREFIX[r]}_{t}_{which}", v) for r, v in zip(o.slot_roles, slots))
    return tuple(new[s.name] for s in layer_state_inputs(spec, state_roles(o)))


def _embed(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute) -> tuple[Tensor, ...]:
    ids = ins.get("input_ids", ins.get("tokens", ins.get("token")))
    return (embedding_rows(_matrix(ins, "embed", spec.quant.bits, executorch), ids),)


def _block_params(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute) -> BlockParams:
    return BlockParams(_layer_weights(spec, ins, executorch), _layer_lora(spec, ins), spec.lora.scale, spec.arch,
                       compute)


def _block_forward(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute
                   ) -> tuple[Tensor, ...]:
    x = ins["x"]
    p = _block_params(spec, ins, executorch, compute)
    return (block_forward(x, p, _rope(spec, x.dtype), spec.options.mlp_chunk),)


def _head_loss(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute) -> tuple[Tensor, ...]:
    chunks = _head_chunks(ins, spec.quant.bits, executorch)
    head = _matrix(ins, "head", spec.quant.bits, executorch)
    loss, dx = head_loss_and_grad(ins["x"], ins["final_norm"], head, ins["labels"], spec.arch.rms_eps,
                                  spec.options, head_chunks=chunks if spec.options.vocab_chunk else None,
                                  compute=compute)
    return loss.reshape(1), dx


def _block_backward(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute
                    ) -> tuple[Tensor, ...]:
    x = ins["x"]
    p = _block_params(spec, ins, executorch, compute)
    dx, grads = block_backward(ins["dout"], x, p, _rope(spec, x.dtype), spec.options.mlp_chunk)
    return (dx,) + _update(spec, ins, grads)


def _block_backward_pair(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute
                         ) -> tuple[Tensor, ...]:
    """block_backward of two sequences through this layer, one update on the sum of their gradients."""
    p = _block_params(spec, ins, executorch, compute)
    rope = _rope(spec, ins["x"].dtype)
    dx, grads = block_backward(ins["dout"], ins["x"], p, rope, spec.options.mlp_chunk)
    dx_pair, grads_pair = block_backward(ins["dout_pair"], ins["x_pair"], p, rope, spec.options.mlp_chunk)
    total = {t: LoraPair(g.a + grads_pair[t].a, g.b + grads_pair[t].b) for t, g in grads.items()}
    return (dx, dx_pair) + _update(spec, ins, total)


def _block_skip_update(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute
                       ) -> tuple[Tensor, ...]:
    return _update(spec, ins, None)


def _block_decode(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute
                  ) -> tuple[Tensor, ...]:
    x, arch = ins["x"], spec.arch
    p = _block_params(spec, ins, executorch, compute)
    rope = decode_rope(ins["pos"], x.shape[0], arch.head_dim, arch.rope_theta, x.dtype, arch.rope_inv_freq())
    return block_decode(x, ins["pos"], ins["k_cache"], ins["v_cache"], p, rope)


def _head_logits(spec: ProgramSpec, ins: dict[str, Tensor], executorch: bool, compute: Compute
                 ) -> tuple[Tensor, ...]:
    chunks = _head_chunks(ins, spec.quant.bits, executorch) or [_matrix(ins, "head", spec.quant.bits, executorch)]
    return (head_logits(ins["x"], ins["final_norm"], chunks, spec.arch.rms_eps, compute),)


# a method body: (spec, inputs, executorch, compute) -> outputs
_Body = Callable[[ProgramSpec, dict[str, Tensor], bool, Compute], tuple[Tensor, ...]]


def method_compute(spec: ProgramSpec, method: MethodSpec) -> Compute:
    """How `method` computes: --compute fp16 / int8 in the training methods' frozen-weight matmuls
    (mesp/ops/half.py, mesp/ops/quant.py; generation is not changed by it), and the native kernels' ops in the
    generation methods that list kernels (the `_fused` ones)."""
    training = method.role not in GENERATION_ROLES
    precision = spec.compute if training else "fp32"
    return Compute(precision=precision, fused=bool(method.kernels) and not training)


_BODIES: dict[str, _Body] = {
    "embed": _embed, "block_forward": _block_forward, "head_loss": _head_loss,
    "block_backward": _block_backward, "block_skip_update": _block_skip_update,
    "block_backward_pair": _block_backward_pair,
    "embed_token": _embed, "embed_prefill": _embed, "block_prefill": _block_decode, "block_decode": _block_decode,
    "head_logits": _head_logits,
}


def method_body(spec: ProgramSpec, role: str, inputs: dict[str, Tensor], *, executorch: bool,
                compute: Compute) -> tuple[Tensor, ...]:
    """The body of a method of `role` on named inputs: what `method_module`'s forward computes, for callers that
    trace a variant of it (scripts/xnnpack_generation_prototype.py)."""
    return _BODIES[role](spec, inputs, executorch, compute)


class _Method(nn.Module):
    """One method as a plain `forward(*inputs) -> tuple(outputs)`, in its MethodSpec's order, for the
    exporters (which trace a module's forward) and the eager reference runtime."""

    def __init__(self, spec: ProgramSpec, method: MethodSpec, executorch: bool) -> None:
        super().__init__()
        self.spec, self.method, self.executorch = spec, method, executorch
        self.names = [i.name for i in method.inputs]
        self.compute = method_compute(spec, method)

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return _BODIES[self.method.role](self.spec, dict(zip(self.names, inputs)), self.executorch, self.compute)


def method_module(spec: ProgramSpec, name: str, *, executorch: bool = False) -> nn.Module:
    """Method `name` of the program as a module (`_Method`).

    Args:
        executorch: trace int4 dequantization as ExecuTorch's `quantized_decomposed::embedding_4bit` (the
            ExecuTorch export, which imports the op's definition; the same values as the unpacking every
            other target and the eager runtime use: mesp/ops/quant.py).
    """
    methods = method_specs(spec)
    if name not in methods:
        raise BadInput(f"no method {name!r} in this program; it has {', '.join(methods)}")
    return _Method(spec, methods[name], executorch)


_DTYPES = {"float32": torch.float32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8}


def example_inputs(method: MethodSpec) -> tuple[Tensor, ...]:
    """Tracing inputs of a method: zeros of every input's dtype and shape (lr 1e-4, step 1)."""
    out = []
    for io in method.inputs:
        x = torch.zeros(io.shape, dtype=_DTYPES[io.dtype])
        if io.name == "lr":
            x.fill_(1e-4)
        elif io.name == "step":
            x.fill_(1.0)
        elif io.name.endswith("_scale") or io.name.endswith("norm"):
            x.fill_(1.0)
        out.append(x)
    return tuple(out)
