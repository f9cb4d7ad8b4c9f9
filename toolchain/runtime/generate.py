"""Generation with the live adapter on an exported program's generation methods, through any runtime
(ExecuTorch, ONNX Runtime, eager): the reference driver of the manifest's `generate.steps`.

The LoRA inputs are slices of the flat state the caller passes: the trainer's own array mid-run (no
re-export, no adapter file), a checkpoint's, or an adapter's (`training.session.program_state`). The KV
cache (per layer k, v [Hk, S, D] float32, S = seq_len) is allocated here, once per call.

  prompt of n tokens, in chunks of C = prefill_chunk (the last padded): embed_prefill -> block_prefill per
  layer (each writes its chunk's rows of the layer's cache); logits = head_logits(the prompt's last row)
  then per new token t at position pos = n, n+1, ...:
  t = pick(logits) -> embed_token(t) -> block_decode(pos) per layer (writes cache row pos) -> head_logits
Where the runtime loaded the fused methods (`generate.fused`: int4 programs on a runtime with the native
kernel), block_prefill / block_decode / head_logits are called under their fused names; where it loaded the
XNNPACK variant (`generate.xnnpack`: no native kernels), under its names, layer i's block methods being
`block_decode_xnnpack_i` and `block_prefill_xnnpack_i` (their weights inside).
Greedy (argmax, the first of equal maxima, as torch and HF) unless `temperature` > 0: then a sample of
softmax(logits / temperature) drawn with a generator seeded by `seed`. Stops after a token of `stop_ids`
(eos; included in the output, as HF's generate does), after `max_new_tokens`, or when `should_stop()`
says so (checked before each decode step: the apps' cancel); prompt + new tokens must fit in S.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from toolchain.contract import ASSISTANT_HEADER, GENERATION_ROLES, IM_END, LAYER
from toolchain.errors import BadInput, FieldError
from toolchain.program.directory import ProgramDir
from toolchain.runtime.loop import LayerLoop

__all__ = ["GenerationResult", "Prompt", "generate", "new_cache", "prompt_for", "generation_names", "layer_method"]


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]                 # the new tokens only
    stopped: str                          # "eos", "max_new_tokens" or "cancelled"
    prefill_s: float = 0.0                # the prompt's chunks through every layer + the first head_logits
    ttft_s: float = 0.0                   # from the call to the first new token chosen (prefill + pick)
    prefill_chunks: int = 0               # block_prefill calls per layer
    decode_s: list[float] = field(default_factory=list)  # per decoded token (embed_token, blocks, head)
    fused: bool = False                   # the fused (native int4 kernel) methods ran
    variant: str = "stock"                # the generation methods that ran: "fused", "xnnpack" or "stock"

    @property
    def decode_tokens_per_s(self) -> float | None:
        return len(self.decode_s) / sum(self.decode_s) if self.decode_s and sum(self.decode_s) > 0 else None

    def timings(self) -> dict:
        """The timing fields of `toolchain generate --json` (seconds; rates from the counts beside them)."""
        rate = self.decode_tokens_per_s
        return {"prompt_tokens": len(self.prompt_ids), "new_tokens": len(self.output_ids),
                "prefill_chunks": self.prefill_chunks, "prefill_s": round(self.prefill_s, 6),
                "ttft_s": round(self.ttft_s, 6), "decode_tokens": len(self.decode_s),
                "decode_s": round(sum(self.decode_s), 6),
                "decode_tokens_per_s": None if rate is None else round(rate, 3), "fused": self.fused,
                "variant": self.variant}


def new_cache(pdir: ProgramDir) -> dict[str, Tensor]:
    """The app's KV cache: k_{layer}, v_{layer} zeros [Hk, S, D] (rows >= pos are never read)."""
    arch = pdir.arch
    shape = (arch.kv_heads, pdir.seq_len, arch.head_dim)
    return {f"{w}_{i}": torch.zeros(shape, dtype=torch.float32) for i in range(arch.layers) for w in ("k", "v")}


def generation_names(pdir: ProgramDir, loaded: Sequence[str] | None) -> dict[str, str]:
    """The method to call for each generation role: the fused one where it is among `loaded`, else the XNNPACK
    variant's where it is (a per-layer name keeps LAYER: `layer_method`)."""
    gen = pdir.generate
    loaded = set(loaded or ())
    names = {n: n for n in GENERATION_ROLES}      # stock methods are named after their role
    for role, pattern in ({} if gen is None else gen.xnnpack_methods()).items():
        if layer_method(pattern, 0) in loaded:
            names[role] = pattern
    for stock, f in ({} if gen is None else gen.fused_methods()).items():
        if f in loaded:
            names[stock] = f
    return names


def layer_method(name: str, layer: int) -> str:
    """The method to call for `layer` (the XNNPACK variant's block methods are per layer: LAYER in the name)."""
    return name.replace(LAYER, str(layer))


def _pick(logits: Tensor, temperature: float, gen: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _check(pdir: ProgramDir, prompt: list[int], max_new_tokens: int, temperature: float) -> None:
    n, s, vocab = len(prompt), pdir.seq_len, pdir.arch.vocab
    if "block_decode" not in pdir.methods:
        raise BadInput(f"{pdir.path} was exported without the generation methods; re-export it (without --no-generate)")
    if n == 0:
        raise BadInput("the prompt is empty; give at least one token")
    if max_new_tokens < 1:
        raise FieldError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
    if n + max_new_tokens > s:
        raise FieldError("max_new_tokens", f"{max_new_tokens} + the prompt's {n} tokens = {n + max_new_tokens} exceeds "
                                           f"the program's seq_len {s}; shorten the prompt, ask for fewer tokens, or "
                                           f"re-export with a longer seq_len")
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise BadInput(f"prompt token id {bad[0]} is outside the vocabulary of {vocab}")
    if temperature < 0 or temperature != temperature:
        raise FieldError("temperature", f"must be >= 0, got {temperature}")


def generate(pdir: ProgramDir, runtime, state: Tensor, prompt_ids: Sequence[int], max_new_tokens: int, *,
             temperature: float = 0.0, seed: int | None = None, stop_ids: Sequence[int] = (),
             on_token: Callable[[int], None] | None = None, should_stop: Callable[[], bool] | None = None,
             loop: LayerLoop | None = None) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt_ids` with the adapter in `state` (read, never written).

    `runtime` needs the generation methods (`open_runtime(pdir, use="generate")`); `on_token` is called with
    each new token as soon as it is chosen (streaming); `should_stop` before each further token (cancel)."""
    prompt = [int(t) for t in prompt_ids]
    _check(pdir, prompt, max_new_tokens, temperature)
    n, c = len(prompt), pdir.spec.prefill_chunk
    stop = {int(t) for t in stop_ids}
    gen = torch.Generator().manual_seed(seed if seed is not None else 0) if temperature > 0 else None
    loop = loop or LayerLoop(pdir, runtime)
    names = generation_names(pdir, getattr(runtime, "methods_loaded", None))
    views = pdir.state_views(state)
    cache = new_cache(pdir)
    decode = _bound_decode(pdir, loop, names["block_decode"], views, cache)
    out: list[int] = []
    variant = pdir.methods[layer_method(names["block_decode"], 0)]
    result = GenerationResult(prompt, out, "max_new_tokens", fused=bool(variant.kernels),
                            variant="fused" if variant.kernels else variant.variant or "stock")
    with torch.no_grad(), loop.driver():
        t0 = time.perf_counter()
        for start in range(0, n, c):
            ids = torch.full((c,), pdir.pad_token_id, dtype=torch.int64)
            ids[:min(c, n - start)] = torch.tensor(prompt[start:start + c], dtype=torch.int64)
            x = loop.call_method("embed_prefill", None, {"tokens": ids}, views)["x"]
            p = torch.tensor([start], dtype=torch.int64)
            for i in range(pdir.arch.layers):
                x = loop.call_method(layer_method(names["block_prefill"], i), i, {"x": x, "pos": p}, views, cache,
                                     start)["x"]
            result.prefill_chunks += 1
        last = (n - 1) % c                                   # the prompt's last row in the last chunk
        logits = loop.call_method(names["head_logits"], None, {"x": x[last:last + 1]}, views)["logits"]
        del x
        result.prefill_s = time.perf_counter() - t0
        pos = n
        while True:
            token = _pick(logits, temperature, gen)
            if not out:
                result.ttft_s = time.perf_counter() - t0
            out.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop:
                result.stopped = "eos"
                break
            if len(out) == max_new_tokens:
                break
            if should_stop is not None and should_stop():
                result.stopped = "cancelled"
                break
            t1 = time.perf_counter()
            x = loop.call_method("embed_token", None, {"token": torch.tensor([token], dtype=torch.int64)}, views)["x"]
            if decode is not None:                           # the layers' methods bound once (ExecuTorch)
                xbuf, pbuf, bound = decode
                xbuf.copy_(x)
                pbuf.fill_(pos)
                for i, b in enumerate(bound):
                    loop.call_bound(b, layer_method(names["block_decode"], i), i, views, cache, pos, into={"x": xbuf})
                x = xbuf
            else:
                p = torch.tensor([pos], dtype=torch.int64)
                for i in range(pdir.arch.layers):
                    x = loop.call_method(layer_method(names["block_decode"], i), i, {"x": x, "pos": p}, views,
                                         cache, pos)["x"]
            logits = loop.call_method(names["head_logits"], None, {"x": x}, views)["logits"]
            result.decode_s.append(time.perf_counter() - t1)
            pos += 1
    return result


def _bound_decode(pdir: ProgramDir, loop: LayerLoop, name: str, views: dict[str, Tensor],
                  cache: dict[str, Tensor]) -> tuple[Tensor, Tensor, list] | None:
    """Every layer's decode method with its inputs set once for this generation (`LayerLoop.bind`): the
    hidden state and position go through two tensors the loop rewrites in place per token, the weights, the
    adapter's views and the layer's cache stay bound. None where the runtime cannot bind (then each call
    binds its inputs)."""
    spec = {io.ref: io for io in pdir.methods[layer_method(name, 0)].inputs
            if io.bind not in ("weight", "state", "cache")}
    xbuf = torch.zeros(spec["x"].shape, dtype=torch.float32)
    pbuf = torch.zeros(spec["pos"].shape, dtype=torch.int64)
    bound = [loop.bind(layer_method(name, i), i, {"x": xbuf, "pos": pbuf}, views, cache) for i in range(pdir.arch.layers)]
    if any(b is None for b in bound):
        return None
    return xbuf, pbuf, bound


class Prompt(NamedTuple):
    tokenizer: object | None   # the program's tokenizer (None: it has none and the prompt is ids)
    ids: list[int]             # the prompt's token ids
    stop_ids: list[int]        # generation stops at any of them (eos; <|im_end|> for a chat turn)


def prompt_for(pdir: ProgramDir, *, text: str | None = None, ids: str | None = None, chat: bool = False) -> Prompt:
    """The prompt of `toolchain generate`: `text` tokenized with the program's tokenizer (with `chat`, as a
    user turn in the Qwen chat template followed by the assistant header), or comma-separated token `ids`.

    Raises:
        BadInput: neither or both of text and ids, chat without text, bad ids, or text for a program
            without a tokenizer.
    """
    from toolchain.text.chat_template import apply_chat_template
    from toolchain.text.tokenizer_source import program_tokenizer

    if (text is None) == (ids is None):
        raise BadInput("give exactly one of --prompt and --prompt-ids")
    if chat and text is None:
        raise BadInput("--chat needs --prompt (text)")
    tok = None
    if text is not None or pdir.tokenizer.kind != "none":
        try:
            tok = program_tokenizer(pdir.path, pdir.tokenizer, pdir.files)
        except BadInput:
            if text is not None:
                raise
    stop: list[int] = []
    if text is None:
        prompt_ids = _parse_ids(ids)
    elif chat:
        prompt_ids, _ = apply_chat_template(tok, [{"role": "user", "content": text}])
        prompt_ids += tok.encode(ASSISTANT_HEADER, allow_special=True)
        stop += tok.encode(IM_END, allow_special=True)
    else:
        prompt_ids = tok.encode(text, allow_special=True)
    if tok is not None and tok.eos_id is not None:
        stop.append(tok.eos_id)
    return Prompt(tok, prompt_ids, stop)


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise BadInput(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise BadInput("--prompt-ids is empty")
    return ids
