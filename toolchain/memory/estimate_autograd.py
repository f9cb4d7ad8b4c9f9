"""Analytic peak memory of the autograd baselines as `toolchain bench memory` runs them
(`toolchain.bench.steps`: `block_forward` without MLP chunks under autograd, Hugging Face's
full-logits cross-entropy, `.grad` of every layer kept until the update after `backward()`).

What autograd saves per block (activations only; frozen weights are references), for a block whose
input requires grad:
  [T, d]   n1 (if q/k/v adapted: the LoRA A gradient needs it), q_rope, o (if o adapted), x1, n2 (if
           gate/up adapted), the block output (saved by the next norm);
  [T, kv]  k_rope, v;
  [T, f]   g, u, silu(g), a (if down adapted);
  [T,T]    the softmax P of every head (attention runs one query head at a time); the block's one bool
           causal mask (shared by its heads);
  [T, r]   h = x A^T of each adapted projection;  [T, 1]  the two norms' 1/rms.
Block 0's input (the embedding rows) does not require grad: its input norm saves no 1/rms.
  autograd  keeps every block's saved set; mebp keeps only the L + 1 block inputs/outputs
            (`torch.utils.checkpoint`) and recomputes one block's set during its backward.
  loss      log_softmax saves its [T, V] output; its backward holds it, d(log p) and d(logits):
            3 [T, V], the largest transient of both baselines whenever V >> d, f (every Qwen2.5 preset,
            T up to ~20k). Checked against the live tensors in tests/memory/test_memory_estimate.py.
  backward  of block i, counted without the backward's own transients (a lower bound, named
            "backward (saved only)"): the saved set(s), dout, the gradients of the layers above.
"""

from __future__ import annotations

from toolchain.lora.config import ALL_TARGETS
from toolchain.memory.shape import Parts, StepShape, lora_elems, state_parts

__all__ = ["block_saved_elems", "autograd_candidates"]


def block_saved_elems(s: StepShape, *, first: bool) -> float:
    """Elements autograd saves for one block (see the module docstring); `first`: block 0, whose
    input does not require grad, so only what an adapted projection makes require grad is saved."""
    a, t, e = s.arch, s.seq_len, s.dtype_bytes
    d, kv, f = a.hidden, a.kv_dim, a.intermediate
    adapted = set(s.targets)
    qkv, qk = adapted & {"q_proj", "k_proj", "v_proj"}, adapted & {"q_proj", "k_proj"}
    if first:   # q @ k^T saves q_rope for dk and k_rope for dq; P @ v saves v for dP (q or k adapted)
        q_rope, k_rope, v, scores, masks = "k_proj" in adapted, "q_proj" in adapted, bool(qk), bool(qkv), bool(qk)
    else:
        q_rope = k_rope = v = scores = masks = True
    hidden = bool(qkv) + q_rope + ("o_proj" in adapted) + 2 + bool(adapted & {"gate_proj", "up_proj"})
    mlp = 3 + ("down_proj" in adapted)                               # g, u, silu(g) (+ a)
    return (hidden * t * d + (k_rope + v) * t * kv + mlp * t * f + scores * a.heads * t * t
            + masks * t * t / e + len(adapted) * t * s.rank + (1 if first else 2) * t)


def autograd_candidates(s: StepShape) -> list[tuple[str, int | None, Parts]]:
    """(phase, layer, parts in elements) of `s.method` in ("mebp", "autograd")."""
    a, t = s.arch, s.seq_len
    layers, d = a.layers, a.hidden
    saved = [block_saved_elems(s, first=i == 0) for i in range(layers)]
    if s.method == "autograd":
        held = {"activations_saved": sum(saved) + t}                 # + the final norm's 1/rms
    else:
        held = {"checkpoints": (layers + 1) * t * d + t}             # block inputs, the last output, 1/rms
    # log_softmax_backward: the saved log-probabilities, their gradient and the logits' gradient
    out = [("loss", None, {**state_parts(s, 0), **held, "loss_logits": 3 * t * a.vocab, "loss_vectors": 2})]
    per_layer = lora_elems(s, ALL_TARGETS)
    for i in reversed(range(layers)):
        grads = (layers - 1 - i) * per_layer
        if s.method == "autograd":
            parts = {"activations_saved": sum(saved[:i + 1])}
        else:
            parts = {"checkpoints": (i + 1) * t * d, "activations_saved": saved[i]}
        out.append(("backward (saved only)", i, {**state_parts(s, grads), **parts, "hidden_grads": t * d}))
    out.append(("end", None, {**state_parts(s, layers * per_layer), "checkpoints": 0}))
    return out
