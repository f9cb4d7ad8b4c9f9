"""Backward primitives: one file each, `xxx_forward(...) -> (out, XxxSaved)`,
`xxx_backward(grad, saved) -> grads`. Pure functions of tensors; no autograd."""

from toolchain.mesp.ops.attention import (AttentionGrads, AttentionSaved, attention_backward, attention_forward,
                                          causal_mask)
from toolchain.mesp.ops.ce_chunked import (IGNORE_INDEX, CeResult, ce_chunked_forward_backward, ce_chunked_loss,
                                           shift_labels)
from toolchain.mesp.ops.ce_online import ce_online_forward_backward, ce_online_loss
from toolchain.mesp.ops.head_norm import head_norm_backward, head_norm_forward
from toolchain.mesp.ops.lora_linear import LinearGrads, LinearSaved, linear_backward, linear_forward
from toolchain.mesp.ops.rmsnorm import RmsNormSaved, rmsnorm_backward, rmsnorm_forward
from toolchain.mesp.ops.rope import RopeTables, rope_backward, rope_forward, rope_tables
from toolchain.mesp.ops.swiglu import SwigluGrads, SwigluSaved, swiglu_backward, swiglu_forward

__all__ = [
    "AttentionGrads", "AttentionSaved", "attention_backward", "attention_forward", "causal_mask",
    "IGNORE_INDEX", "CeResult", "ce_chunked_forward_backward", "ce_chunked_loss", "shift_labels",
    "ce_online_forward_backward", "ce_online_loss",
    "head_norm_backward", "head_norm_forward",
    "LinearGrads", "LinearSaved", "linear_backward", "linear_forward",
    "RmsNormSaved", "rmsnorm_backward", "rmsnorm_forward",
    "RopeTables", "rope_backward", "rope_forward", "rope_tables",
    "SwigluGrads", "SwigluSaved", "swiglu_backward", "swiglu_forward",
]
