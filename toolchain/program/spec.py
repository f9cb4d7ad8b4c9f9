"""The program contract, target-neutral: the MeSP training step as small layer-generic methods the app chains.

The app (or the host runtime, which plays it) drives the layer loop; every method is exported once,
whatever the layer count, and no method holds a weight:

  embed(input_ids [T], embed [V, d]) -> x [T, d]
  block_forward(x [T, d], <layer weights>, <layer LoRA A/B>) -> x_out [T, d]
  head_loss(x [T, d], labels [T], final_norm [d], head [V, d]) -> loss [1], dx [T, d]
      final RMSNorm, LM head, chunked online cross-entropy, and the gradient back to the last block output
  block_backward(dout [T, d], x [T, d], lr [1], [step [1]], <layer weights>, <layer state>)
      -> dx [T, d], <new layer state>
      recompute the block from its checkpoint x, MeSP backward, then the optimizer update of that
      layer's LoRA slices (so no two layers' gradients ever coexist)
  block_skip_update(lr [1], step [1], <layer state>) -> <new layer state>
      only when unselected LoRA weights move (AdamW or weight decay): the update with a zero gradient
  block_backward_pair(dout [T, d], x [T, d], dout_pair [T, d], x_pair [T, d], lr [1], [step [1]], <layer weights>,
                      <layer state>) -> dx [T, d], dx_pair [T, d], <new layer state>
      programs exported with --preference only: block_backward of two sequences through the same layer, then ONE
      optimizer update on the sum of their LoRA gradients. A DPO step (mesp/dpo.py) runs the chosen and the
      rejected sequence through embed, block_forward and head_loss, scales each head gradient d by its weight
      (the app: w_c = beta s n_c, w_r = -beta s n_r from the two losses), and walks the layers down calling this
      method, so each layer's update sees the exact DPO gradient (block_backward twice would update the layer
      between the two sequences).

One step, as the app runs it (the manifest's `loop`):
  x = embed(ids);  for i in 0..L-1: keep x as checkpoint i if i is selected; x = block_forward(x, layer i)
  loss, d = head_loss(x, labels)
  for i in L-1..lowest selected: if selected: d, state_i = block_backward(d, checkpoint i, layer i)
                                 elif moves_unselected: state_i = block_skip_update(layer i)
  moves_unselected layers below the lowest selected one get block_skip_update too.
Layers outside the selection are identity in backward (LCSB); with all layers selected the step is
exactly `mesp.mesp_step` followed by the optimizer update.

<layer weights> are one decoder layer's tensors from the weights file (program/weights_file.py),
passed by the app without copying; <layer state> is the layer's slice of the app's flat float32 state
(LoRA A/B, then AdamW moments), see `state_layout`. Rows shorter than T are padded by the app:
input_ids with `pad_token_id`, labels with -100 (causal attention: trailing padding changes nothing).

This module fixes the methods' signatures (`method_specs`, described by toolchain/contract); what each method
computes is export/bodies.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from toolchain.contract import (LAYER, STATE_ROLE_PREFIX, STEP_ENTRY, IoSpec, MethodSpec, StateEntry, fused_name,
                                state_name)
from toolchain.errors import BadInput, FieldError
from toolchain.lora.config import LoraConfig
from toolchain.lora.peft_io import peft_key
from toolchain.lora.weights import LoraWeights
from toolchain.mesp import StepOptions
from toolchain.mesp.kernels import KERNELS, generation_ops
from toolchain.mesp.ops.half import COMPUTE_CHOICES
from toolchain.models.presets import ModelArch
from toolchain.optim import OptimizerConfig

__all__ = ["QuantSpec", "chunk_elems_from_mib", "ProgramSpec", "state_layout", "state_roles", "flat_state",
           "unflatten_state", "method_specs", "matrix_inputs", "layer_weight_inputs", "layer_state_inputs",
           "QUANTIZED_FIELDS", "FUSED_KERNELS", "INT8_KERNELS", "XNNPACK_VARIANT", "xnnpack_name",
           "xnnpack_generation_specs"]

# The projection matrices; the embedding and LM head too in int4 programs (`QuantSpec.head`); norms and
# biases stay float32.
QUANTIZED_FIELDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# int4 programs also carry fused variants of the generation methods that read int4 weights (same inputs and
# outputs, name + "_fused"), which call the native kernels of toolchain/native/kernels.cpp (the W4A8 linear;
# in the blocks also the attention over the KV cache and the small ops of mesp/decode_ops.py, RMSNorm in the
# head too): a runtime that has them registered runs them, any other
# the stock methods (slower; float activations, so the logits differ by the activations' int8 rounding).
# Every fused method lists all the generation kernels of the library (head_logits_fused calls two of them: the
# table's `methods`): a runtime has all of them or none. (Training-only kernels, int4_dyw_a8, are not listed.)
FUSED_KERNELS = generation_ops()   # the native kernels' table, mesp/kernels.py
# The kernels the training methods of a `--compute int8` program call (x W^T and dy W of an int4 W, mesp/ops/quant.py)
# and the training blocks' float32 attention, SwiGLU, LoRA backward (thread pool: mesp/block.py, ops/compute.py)
INT8_KERNELS = tuple(k.op for k in KERNELS if k.name in ("int4_linear_a8", "int4_dyw_a8", "int4_dyw_a8_acc",
                                                         "attention_train",
                                                         "attention_train_backward", "swiglu", "swiglu_train",
                                                         "online_softmax_stats", "exp_sub_rows", "lora_backward",
                                                         "lora_rows_backward", "rms_norm", "lora_linear_a8",
                                                         "lora_linear_a8_rows", "rope_train", "rope_train_backward",
                                                         "rms_norm_backward"))


@dataclass(frozen=True)
class QuantSpec:
    """Frozen projection weights: float32 (`none`), or group-wise int8 / int4 (see mesp/ops/quant.py)."""

    kind: Literal["none", "int8", "int4"] = "none"
    group: int = 64
    # Dequantize at most this many weights at once (float32 elements). One block's graph is exported
    # once, so small chunks cost little export time; they bound the dequantized transient.
    chunk_elems: int = 1 << 18
    # int4 programs: the embedding and LM head (one matrix when tied) in int4 too, with the same group. The
    # head is most of the bytes generation reads per token (float32: 545 MB of 746 at Qwen2.5-0.5B); the
    # training step's head_loss dequantizes the same stored matrix chunk by chunk, so training and
    # generation see one model. False keeps them float32 (int8 programs always do).
    head: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("none", "int8", "int4"):
            raise BadInput(f"unknown quantization {self.kind!r}; choose none, int8 or int4")
        if self.group < 2 or self.group % 2:
            raise BadInput(f"quantization group must be an even number >= 2, got {self.group}")
        if self.chunk_elems < 1:
            raise BadInput(f"dequantization chunk must hold at least one weight, got {self.chunk_elems}")

    @property
    def bits(self) -> int:
        return 8 if self.kind == "int8" else 4

    @property
    def head_quantized(self) -> bool:
        return self.kind == "int4" and self.head

    def check(self, arch: ModelArch) -> None:
        if self.kind != "none":
            # the projections' input widths: hidden, intermediate (down_proj) and heads * head_dim (o_proj)
            widths = sorted({arch.hidden, arch.intermediate, arch.q_dim})
            for width in widths:
                if width % self.group:
                    raise BadInput(f"quantization group {self.group} does not divide the model width {width}; "
                                   f"pick a group that divides {', '.join(map(str, widths))}")


def chunk_elems_from_mib(mib: float) -> int:
    """`QuantSpec.chunk_elems` for `--dequant-chunk-mb`: float32 weights in `mib` MiB (at least one)."""
    return max(1, int(mib * 2**20) // 4)


@dataclass(frozen=True)
class ProgramSpec:
    """Everything that fixes the methods' graphs (the manifest records it; the host rebuilds from it)."""

    arch: ModelArch
    lora: LoraConfig
    seq_len: int
    quant: QuantSpec = QuantSpec()
    # The in-program optimizer is the shared one (toolchain/optim.py: formulas, LCSB's `moves_unselected`).
    # Its `lr` is only a default: every step takes lr as an input (the manifest records `default_lr`).
    # SGD momentum is refused: the state layout has no momentum buffer.
    optimizer: OptimizerConfig = OptimizerConfig()
    options: StepOptions = StepOptions()
    generation: bool = False  # also the generation methods (GENERATION_ROLES); the manifest's `generate` says so
    # tokens per prefill call (block_prefill): a prompt of n tokens costs ceil(n / prefill_chunk) calls per layer
    prefill_chunk: int = 32
    # the training methods' frozen-weight matmuls: "fp32" (exact), "fp16" (mesp/ops/half.py; needs a
    # quantized base, whose chunks dequantize straight to float16), or "int8" (int4 x int8 products through the
    # native kernels, mesp/ops/quant.py; needs an int4 base, and the training methods list INT8_KERNELS)
    compute: Literal["fp32", "fp16", "int8"] = "fp32"
    # also the XNNPACK generation variant (int4 programs with an int4 head, ExecuTorch only): per layer a
    # block_prefill and a block_decode holding that layer's weights as constants, and a head_logits holding the
    # head, for runtimes without the native kernels (`xnnpack_generation_specs`)
    xnnpack_generation: bool = False
    # also block_backward_pair (preference training, DPO: `train --program --objective dpo`)
    preference: bool = False

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.seq_len > self.arch.max_positions:
            raise FieldError("seq_len", f"must be in 2..{self.arch.max_positions} for this model, got {self.seq_len}")
        if self.prefill_chunk < 1:
            raise FieldError("prefill_chunk", f"must be >= 1, got {self.prefill_chunk}")
        if self.prefill_chunk > self.seq_len:   # a chunk longer than the cache holds nothing more
            object.__setattr__(self, "prefill_chunk", self.seq_len)
        self.quant.check(self.arch)
        if self.compute not in COMPUTE_CHOICES:
            raise FieldError("compute", f"must be one of {', '.join(COMPUTE_CHOICES)}, got {self.compute!r}")
        if self.compute == "fp16" and self.quant.kind == "none":
            raise BadInput("--compute fp16 needs a quantized base (--quant int4 or int8): a float32 weight would be "
                           "converted whole to float16 in every call")
        if self.compute == "int8" and self.quant.kind != "int4":
            raise BadInput(f"--compute int8 needs an int4 base (--quant int4): its products are the native W4A8 "
                           f"kernels' int4 weights x int8 activations, got --quant {self.quant.kind}")
        if self.compute == "int8" and not self.options.vocab_chunk:
            raise BadInput("--compute int8 needs vocabulary chunks for the LM head (--vocab-chunk > 0): its int8 "
                           "products are per head chunk")
        if self.xnnpack_generation and not (self.generation and self.quant.head_quantized):
            raise BadInput("--xnnpack-generation needs the generation methods and an int4 base with an int4 head "
                           "(--quant int4, without --no-generate or --float-head)")
        if self.optimizer.momentum:
            raise BadInput(f"exported programs do not implement SGD momentum (their state has no momentum buffer), "
                           f"got momentum {self.optimizer.momentum}; use momentum 0 or AdamW")



def state_roles(optimizer: OptimizerConfig) -> list[str]:
    """The state roles of each LoRA tensor, in layout order: the parameter, then the optimizer's slots."""
    return ["param", *optimizer.slot_roles]


def state_layout(arch: ModelArch, cfg: LoraConfig, optimizer: OptimizerConfig) -> list[StateEntry]:
    """Order and offsets of the flat state: per layer, per target, A then B; then AdamW moments in the
    same order (exp_avg, then exp_avg_sq), then the AdamW step counter."""
    entries: list[StateEntry] = []
    offset = 0
    for role in state_roles(optimizer):
        for i in range(arch.layers):
            for t in cfg.targets:
                d_out, d_in = arch.linear_shape(t)
                for which, shape in (("a", (cfg.rank, d_in)), ("b", (d_out, cfg.rank))):
                    e = StateEntry(state_name(role, i, t, which), peft_key(i, t, which.upper()), role, shape, offset, i)
                    entries.append(e)
                    offset += e.numel
    if optimizer.kind == "adamw":
        entries.append(StateEntry(STEP_ENTRY, "", "step", (1,), offset))
    return entries


def flat_state(layout: list[StateEntry], lora: LoraWeights) -> Tensor:
    """The initial flat state: the adapter's A/B in layout order, optimizer moments and step zero."""
    values = {}
    for i, layer in enumerate(lora):
        for t, pair in layer.items():
            values[state_name("param", i, t, "a")], values[state_name("param", i, t, "b")] = pair.a, pair.b
    return torch.cat([values[e.name].detach().reshape(-1).float() if e.name in values
                      else torch.zeros(e.numel, dtype=torch.float32) for e in layout])


def unflatten_state(layout: list[StateEntry], flat: Tensor) -> dict[str, Tensor]:
    """Views of `flat` as the named state tensors (writing a view writes `flat`)."""
    return {e.name: flat[e.offset:e.offset + e.numel].view(e.shape) for e in layout}


# -- method signatures ------------------------------------------------------------------------------

def matrix_inputs(name: str, key: str, shape: tuple[int, int], kind: str, group: int,
                  rows: tuple[int, int] | None = None) -> tuple[IoSpec, ...]:
    """A frozen [o, i] matrix as method inputs: `name` float32, or (kind int8 / int4) `name`_q (int8 [o, i] /
    uint8 [o, i/2]) and `name`_scale [o, i/group], keys `key`.qweight / `key`.scales. `rows`: a row range of
    the stored matrix (the inputs' o is its length)."""
    o, i = shape if rows is None else (rows[1] - rows[0], shape[1])
    if kind == "none":
        return (IoSpec(name, "float32", (o, i), "weight", key, rows),)
    packed, qdtype = (i // 2, "uint8") if kind == "int4" else (i, "int8")
    return (IoSpec(f"{name}_q", qdtype, (o, packed), "weight", key + ".qweight", rows),
            IoSpec(f"{name}_scale", "float32", (o, i // group), "weight", key + ".scales", rows))


def layer_weight_inputs(arch: ModelArch, quant: QuantSpec) -> list[IoSpec]:
    """A layer's frozen tensors as method inputs, in LayerWeights order (quantized: q then scales); only those
    the architecture has (`ModelArch.layer_shapes`)."""
    out: list[IoSpec] = []
    for name, shape in arch.layer_shapes().items():
        key = f"layers.{LAYER}.{name}"
        if name in QUANTIZED_FIELDS:
            out += matrix_inputs(f"w_{name}", key, shape, quant.kind, quant.group)
        else:
            out.append(IoSpec(f"w_{name}", "float32", shape, "weight", key))
    return out


def _head_inputs(spec: ProgramSpec, head_key: str) -> tuple[tuple[IoSpec, ...], tuple[IoSpec, ...]]:
    """The LM head as inputs: the whole matrix (`head`) and its vocabulary chunks (`head_{j}`, row views)."""
    arch, q = spec.arch, spec.quant
    kind = "int4" if q.head_quantized else "none"
    shape = (arch.vocab, arch.hidden)
    whole = matrix_inputs("head", head_key, shape, kind, q.group)
    vc = spec.options.vocab_chunk or arch.vocab
    chunks = tuple(io for j, s in enumerate(range(0, arch.vocab, vc))
                   for io in matrix_inputs(f"head_{j}", head_key, shape, kind, q.group, (s, min(arch.vocab, s + vc))))
    return whole, chunks


def layer_state_inputs(spec: ProgramSpec, roles: list[str]) -> list[IoSpec]:
    arch, cfg = spec.arch, spec.lora
    out = []
    for role in roles:
        for t in cfg.targets:
            d_out, d_in = arch.linear_shape(t)
            for which, shape in (("a", (cfg.rank, d_in)), ("b", (d_out, cfg.rank))):
                out.append(IoSpec(f"{STATE_ROLE_PREFIX[role]}_{t}_{which}", "float32", shape, "state",
                                  state_name(role, LAYER, t, which)))
    return out


def method_specs(spec: ProgramSpec) -> dict[str, MethodSpec]:
    """The methods of a program with `spec`, by name (= role)."""
    arch, t, d = spec.arch, spec.seq_len, spec.arch.hidden
    act = lambda name, ref=None: IoSpec(name, "float32", (t, d), "activation", ref or name)  # noqa: E731
    ids = IoSpec("input_ids", "int64", (t,), "input", "input_ids")
    labels = IoSpec("labels", "int64", (t,), "input", "labels")
    lr = IoSpec("lr", "float32", (1,), "input", "lr")
    step = [IoSpec("step", "float32", (1,), "state", "adam_step")] if spec.optimizer.kind == "adamw" else []
    head_key = "embed" if arch.tie_embeddings else "lm_head"
    head, chunks = _head_inputs(spec, head_key)
    embed = _embed_inputs(spec)
    weights = tuple(layer_weight_inputs(arch, spec.quant))
    lora = tuple(layer_state_inputs(spec, ["param"]))
    state = tuple(layer_state_inputs(spec, state_roles(spec.optimizer)))
    new_state = tuple(IoSpec(s.name + "_out", s.dtype, s.shape, "state", s.ref) for s in state)
    # --compute int8: the methods that multiply by frozen int4 weights call the native kernels (INT8_KERNELS); they
    # have no stock twin: the program is ExecuTorch-only and a runtime without the kernels refuses it
    # (runtime/program_runtime.py)
    k = INT8_KERNELS if spec.compute == "int8" else ()
    methods = [
        MethodSpec("embed", "embed", (ids,) + embed, (act("x"),)),
        MethodSpec("block_forward", "block_forward", (act("x"),) + weights + lora, (act("x_out", "x"),), k),
        MethodSpec("head_loss", "head_loss",
                   (act("x"), labels, IoSpec("final_norm", "float32", (d,), "weight", "final_norm")) + head + chunks,
                   (IoSpec("loss", "float32", (1,), "result", "loss"), act("dx", "d")), k),
        MethodSpec("block_backward", "block_backward",
                   (act("dout", "d"), act("x", "checkpoint")) + (lr,) + tuple(step) + weights + state,
                   (act("dx", "d"),) + new_state, k),
    ]
    if spec.optimizer.moves_unselected:
        methods.append(MethodSpec("block_skip_update", "block_skip_update", (lr,) + tuple(step) + state, new_state))
    if spec.preference:
        methods.append(MethodSpec("block_backward_pair", "block_backward_pair",
                                  (act("dout", "d"), act("x", "checkpoint"), act("dout_pair", "d_pair"),
                                   act("x_pair", "checkpoint_pair"), lr) + tuple(step) + weights + state,
                                  (act("dx", "d"), act("dx_pair", "d_pair")) + new_state))
    if spec.generation:
        methods += _generation_specs(spec, weights, lora, embed, head, chunks)
    return {m.name: m for m in methods}


def _embed_inputs(spec: ProgramSpec) -> tuple[IoSpec, ...]:
    kind = "int4" if spec.quant.head_quantized else "none"
    return matrix_inputs("embed", "embed", (spec.arch.vocab, spec.arch.hidden), kind, spec.quant.group)


def _generation_specs(spec: ProgramSpec, weights: tuple[IoSpec, ...], lora: tuple[IoSpec, ...],
                      embed: tuple[IoSpec, ...], head: tuple[IoSpec, ...], chunks: tuple[IoSpec, ...]
                      ) -> list[MethodSpec]:
    """embed_token, embed_prefill, block_prefill, block_decode, head_logits (mesp/decode.py; GENERATION_ROLES),
    and in int4 programs their `_fused` variants (block_prefill, block_decode; head_logits with an int4 head).

    The KV cache is the app's, per layer k and v [Hk, S, D] (S = seq_len), bound as `cache` k_{layer} /
    v_{layer}: block_prefill and block_decode read it as it is and return the rows of their C tokens
    ([Hk, C, D]; C = prefill_chunk or 1), which the app writes at rows pos .. pos + C - 1 (those < S).
    head_logits takes one position's hidden state [1, d]."""
    arch, d = spec.arch, spec.arch.hidden
    hk, dh, c = arch.kv_heads, arch.head_dim, spec.prefill_chunk
    rows = lambda name, n: IoSpec(name, "float32", (n, d), "activation", "x")  # noqa: E731
    cache = lambda name, which, n: IoSpec(name, "float32", (hk, n, dh), "cache", f"{which}_{LAYER}")  # noqa: E731
    pos = IoSpec("pos", "int64", (1,), "input", "pos")
    final_norm = IoSpec("final_norm", "float32", (d,), "weight", "final_norm")
    logits = (IoSpec("logits", "float32", (arch.vocab,), "result", "logits"),)

    def block(name: str, n: int, kernels: tuple[str, ...] = ()) -> MethodSpec:
        return MethodSpec(name, name.removesuffix("_fused"),
                          (rows("x", n), pos, cache("k_cache", "k", spec.seq_len), cache("v_cache", "v", spec.seq_len))
                          + weights + lora,
                          (rows("x_out", n), cache("k_new", "k", n), cache("v_new", "v", n)), kernels)

    methods = [
        MethodSpec("embed_token", "embed_token", (IoSpec("token", "int64", (1,), "input", "token"),) + embed, (rows("x", 1),)),
        MethodSpec("embed_prefill", "embed_prefill", (IoSpec("tokens", "int64", (c,), "input", "tokens"),) + embed,
                   (rows("x", c),)),
        block("block_prefill", c),
        block("block_decode", 1),
        MethodSpec("head_logits", "head_logits", (rows("x", 1), final_norm) + chunks, logits),
    ]
    if spec.quant.kind == "int4":
        methods += [block(fused_name("block_prefill"), c, FUSED_KERNELS), block(fused_name("block_decode"), 1, FUSED_KERNELS)]
        if spec.quant.head_quantized:
            methods.append(MethodSpec(fused_name("head_logits"), "head_logits", (rows("x", 1), final_norm) + head, logits,
                                      FUSED_KERNELS))
    if spec.xnnpack_generation:
        methods += xnnpack_generation_specs(spec, {m.name: m for m in methods})
    return methods


XNNPACK_VARIANT = "xnnpack"


def xnnpack_name(role: str, layer: int | str | None = None) -> str:
    """The XNNPACK variant of generation role `role` for `layer` (block methods), e.g. block_decode_xnnpack_3;
    with layer LAYER, the manifest's pattern."""
    return f"{role}_{XNNPACK_VARIANT}" + ("" if layer is None else f"_{layer}")


def xnnpack_generation_specs(spec: ProgramSpec, stock: dict[str, MethodSpec]) -> list[MethodSpec]:
    """The XNNPACK variant (export/xnnpack_generation.py): block_prefill and block_decode per layer (the stock
    methods' inputs without the weights, which are the method's constants; same outputs) and head_logits
    (the one position's x only: the final norm and the whole int4 head are constants)."""
    out = []
    for role in ("block_prefill", "block_decode"):
        m = stock[role]
        ins = tuple(io for io in m.inputs if io.bind != "weight")
        out += [MethodSpec(xnnpack_name(role, i), role, ins, m.outputs, variant=XNNPACK_VARIANT, layer=i)
                for i in range(spec.arch.layers)]
    h = stock["head_logits"]
    out.append(MethodSpec(xnnpack_name("head_logits"), "head_logits", tuple(io for io in h.inputs if io.bind != "weight"),
                          h.outputs, variant=XNNPACK_VARIANT))
    return out

