"""Time per native call of one Qwen2.5-0.5B fused prefill layer (`_block_decode_fused`'s calls through the C entry
points: a chunk of 32 tokens at position 32, int4 groups of 64, LoRA rank 8 on every projection), to see what runs
on one thread (docs/kernels.md "Threads").

  .venv/bin/python scripts/bench_prefill_layer.py [THREADS] [REPS]

THREADS 1 (default): the calling thread's CPU time per call; more: wall time with ExecuTorch's pool at that
size. Best of REPS (default 5). "int4 only" rows are the bare int4 product of the same projections, so a
projection's LoRA epilogue is its `lora_linear` row minus its "int4 only" row.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

C, POS = 32, 32                                      # the prefill chunk and its first position
D_MODEL, INTER, HEADS, KV_HEADS, HEAD_DIM, CACHE, RANK, GROUP = 896, 4864, 14, 2, 64, 256, 8, 64


def main() -> None:
    from executorch.extension.pybindings import portable_lib

    from toolchain.mesp.kernels import load_native_kernels

    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    lib = load_native_kernels()
    portable_lib._unsafe_reset_threadpool(threads)
    g = torch.Generator().manual_seed(0)
    ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
    shapes = {"q": (D_MODEL, D_MODEL), "k": (KV_HEADS * HEAD_DIM, D_MODEL), "v": (KV_HEADS * HEAD_DIM, D_MODEL),
              "o": (D_MODEL, D_MODEL), "gate": (INTER, D_MODEL), "up": (INTER, D_MODEL), "down": (D_MODEL, INTER)}
    w = {n: (torch.randint(0, 256, (o, i // 2), generator=g, dtype=torch.uint8),
             torch.randn(o, i // GROUP, generator=g) * 0.01) for n, (o, i) in shapes.items()}
    lora_a = {n: torch.randn(RANK, i, generator=g) * 0.01 for n, (o, i) in shapes.items()}
    lora_b = {n: torch.randn(o, RANK, generator=g) * 0.01 for n, (o, i) in shapes.items()}
    bias = {n: torch.randn(shapes[n][0], generator=g) for n in ("q", "k", "v")}
    x, norm = torch.randn(C, D_MODEL, generator=g), torch.ones(D_MODEL)
    k_cache = torch.randn(KV_HEADS, CACHE, HEAD_DIM, generator=g)
    v_cache = torch.randn(KV_HEADS, CACHE, HEAD_DIM, generator=g)

    def proj(n, xin, residual=None, int4_only=False):
        q, s = w[n]
        o, i = q.shape[0], q.shape[1] * 2
        y = torch.empty(xin.shape[0], o)
        if int4_only:
            assert lib.toolchain_int4_linear_a8(ptr(xin), xin.shape[0], i, ptr(q), ptr(s), o, s.shape[1], GROUP,
                                                ptr(y)) == 0
            return y
        assert lib.toolchain_lora_linear_a8(ptr(xin), xin.shape[0], i, ptr(q), ptr(s), o, s.shape[1], GROUP,
                                            ptr(bias.get(n)), ptr(lora_a[n]), ptr(lora_b[n]), RANK,
                                            ctypes.c_float(2.0), ptr(residual), ptr(y)) == 0
        return y

    def rms(xin):
        y = torch.empty_like(xin)
        assert lib.toolchain_rms_norm(ptr(xin), xin.shape[0], xin.shape[1], ptr(norm), ctypes.c_float(1e-6),
                                      ptr(y)) == 0
        return y

    def rope(xin, n):
        y = torch.empty(n, C, HEAD_DIM)
        assert lib.toolchain_rope_heads(ptr(xin), C, n, HEAD_DIM, POS, ctypes.c_float(1e6), ptr(y)) == 0
        return y

    def attention(q, k, v):
        y = torch.empty(C, HEADS * HEAD_DIM)
        assert lib.toolchain_attention_decode(ptr(q), ptr(k), ptr(v), ptr(k_cache), ptr(v_cache), HEADS, KV_HEADS,
                                              C, CACHE, HEAD_DIM, POS, ctypes.c_float(HEAD_DIM ** -0.5), ptr(y)) == 0
        return y

    def swiglu(a, b):
        y = torch.empty_like(a)
        assert lib.toolchain_swiglu(ptr(a), ptr(b), a.numel(), ptr(y)) == 0
        return y

    # one pass of the layer for its intermediate tensors
    n1 = rms(x)
    qh, kh, vh = proj("q", n1), proj("k", n1), proj("v", n1)
    qr, kr = rope(qh, HEADS), rope(kh, KV_HEADS)
    v_heads = vh.reshape(C, KV_HEADS, HEAD_DIM).permute(1, 0, 2).contiguous()          # [Hk, C, D]
    ao = attention(qr, kr, v_heads)
    x1 = proj("o", ao, x)
    n2 = rms(x1)
    gate, up = proj("gate", n2), proj("up", n2)
    act = swiglu(gate, up)
    calls = {
        "rms_norm x2": lambda: (rms(x), rms(x1)),
        "q/k/v int4 only": lambda: [proj(n, n1, int4_only=True) for n in ("q", "k", "v")],
        "q/k/v lora_linear": lambda: [proj(n, n1) for n in ("q", "k", "v")],
        "rope q,k": lambda: (rope(qh, HEADS), rope(kh, KV_HEADS)),
        "attention": lambda: attention(qr, kr, v_heads),
        "o int4 only": lambda: proj("o", ao, int4_only=True),
        "o lora_linear": lambda: proj("o", ao, x),
        "gate/up int4 only": lambda: [proj(n, n2, int4_only=True) for n in ("gate", "up")],
        "gate/up lora_linear": lambda: [proj(n, n2) for n in ("gate", "up")],
        "swiglu": lambda: swiglu(gate, up),
        "down int4 only": lambda: proj("down", act, int4_only=True),
        "down lora_linear": lambda: proj("down", act, x1),
    }
    clock = time.perf_counter if threads > 1 else time.thread_time
    best: dict[str, float] = {}
    for _ in range(reps):                                   # interleaved rounds: best of each call
        for name, call in calls.items():
            t0 = clock()
            call()
            best[name] = min(best.get(name, float("inf")), clock() - t0)
    layer = sum(v for k, v in best.items() if "int4 only" not in k)
    print(f"threads {threads} ({'wall' if threads > 1 else 'thread CPU'} time, best of {reps}), one layer, "
          f"C={C}, pos={POS}")
    for name, v in best.items():
        print(f"  {name:22s} {v * 1e3:8.3f} ms" + ("" if "int4 only" in name else f"  {100 * v / layer:5.1f}%"))
    print(f"  the layer (its lora_linear rows and the rest) {layer * 1e3:.3f} ms; x 24 layers x 2 chunks = "
          f"{layer * 48:.3f} s")


if __name__ == "__main__":
    main()
