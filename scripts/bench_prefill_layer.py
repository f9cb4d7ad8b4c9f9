"""Time per native call of one Qwen2.5-0.5B fused prefill layer (`_block_decode_fused`'s calls through the C entry
points: a chunk of 32 tokens at position 32, int4 groups of 64, LoRA rank 8 on every projection), to see what runs
on one thread (docs/kernels.md "Threads").

  .venv/bin/python scripts/bench_prefill_layer.py [THREADS] [REPS]

THREADS 1 (default): the calling thread's CPU time per call; more: wall time with ExecuTorch's pool at that
size. Best of REPS (default 5). "int4 only" rows are the bare int4 product of the same projections, so a
projection's LoRA epilogue is its `lora_linear` row minus its "int4 only" row.
"""
import ctypes, sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from executorch.extension.pybindings import portable_lib
from toolchain.mesp.kernels import load_native_kernels
lib = load_native_kernels()
C, P, reps = 32, 32, int(sys.argv[2]) if len(sys.argv) > 2 else 5
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
portable_lib._unsafe_reset_threadpool(threads)
g = torch.Generator().manual_seed(0)
d, I, H, Hk, D, S, r, grp = 896, 4864, 14, 2, 64, 256, 8, 64
p = lambda t: ctypes.c_void_p(t.data_ptr())
def qw(o, i):
    return torch.randint(0, 256, (o, i // 2), generator=g, dtype=torch.uint8), torch.randn(o, i // grp, generator=g) * 0.01
W = {n: qw(o, i) for n, (o, i) in dict(q=(d, d), k=(Hk * D, d), v=(Hk * D, d), o=(d, d), gate=(I, d), up=(I, d), down=(d, I)).items()}
A = {n: torch.randn(r, W[n][0].shape[1] * 2, generator=g) * 0.01 for n in W}
B = {n: torch.randn(W[n][0].shape[0], r, generator=g) * 0.01 for n in W}
bias = {n: torch.randn(W[n][0].shape[0], generator=g) for n in ("q", "k", "v")}
x = torch.randn(C, d, generator=g); nw = torch.ones(d)
kc, vc = torch.randn(Hk, S, D, generator=g), torch.randn(Hk, S, D, generator=g)
out = {}
def lora(n, xin, res=None, lora_on=True, only_int4=False):
    q, s = W[n]; o, i = q.shape[0], q.shape[1] * 2
    y = torch.empty(xin.shape[0], o)
    if only_int4:
        assert lib.toolchain_int4_linear_a8(p(xin), xin.shape[0], i, p(q), p(s), o, s.shape[1], grp, p(y)) == 0
        return y
    bb = bias.get(n)
    assert lib.toolchain_lora_linear_a8(p(xin), xin.shape[0], i, p(q), p(s), o, s.shape[1], grp,
        p(bb) if bb is not None else None, p(A[n]) if lora_on else None, p(B[n]) if lora_on else None, r if lora_on else 0, ctypes.c_float(2.0),
        p(res) if res is not None else None, p(y)) == 0
    return y
def rms(xin):
    y = torch.empty_like(xin); assert lib.toolchain_rms_norm(p(xin), xin.shape[0], xin.shape[1], p(nw), ctypes.c_float(1e-6), p(y)) == 0; return y
def rope(xin, n):
    y = torch.empty(n, C, D); assert lib.toolchain_rope_heads(p(xin), C, n, D, P, ctypes.c_float(1e6), p(y)) == 0; return y
def attn(q, k, v):
    y = torch.empty(C, H * D); assert lib.toolchain_attention_decode(p(q), p(k), p(v), p(kc), p(vc), H, Hk, C, S, D, P, ctypes.c_float(D ** -0.5), p(y)) == 0; return y
def swiglu(a, b):
    y = torch.empty_like(a); assert lib.toolchain_swiglu(p(a), p(b), a.numel(), p(y)) == 0; return y
n1 = rms(x); qh = lora("q", n1); qr = rope(qh, H); kh = lora("k", n1); kr = rope(kh, Hk); vh = lora("v", n1)
v3 = vh.reshape(C, Hk, D).permute(1, 0, 2).contiguous(); ao = attn(qr, kr, v3); x1 = lora("o", ao, x); n2 = rms(x1)
ga = lora("gate", n2); up = lora("up", n2); sw = swiglu(ga, up)
steps = {
 "rms_norm x2": lambda: (rms(x), rms(x1)),
 "q/k/v int4 only": lambda: (lora("q", n1, only_int4=True), lora("k", n1, only_int4=True), lora("v", n1, only_int4=True)),
 "q/k/v lora_linear": lambda: (lora("q", n1), lora("k", n1), lora("v", n1)),
 "rope q,k": lambda: (rope(qh, H), rope(kh, Hk)),
 "attention": lambda: attn(qr, kr, v3),
 "o int4 only": lambda: lora("o", ao, only_int4=True),
 "o lora_linear": lambda: lora("o", ao, x),
 "gate/up int4 only": lambda: (lora("gate", n2, only_int4=True), lora("up", n2, only_int4=True)),
 "gate/up lora_linear": lambda: (lora("gate", n2), lora("up", n2)),
 "swiglu": lambda: swiglu(ga, up),
 "down int4 only": lambda: lora("down", sw, only_int4=True),
 "down lora_linear": lambda: lora("down", sw, x1),
}
clock = time.perf_counter if threads > 1 else time.thread_time
res = {}
for _ in range(reps):
    for k, f in steps.items():
        t0 = clock(); f(); dt = clock() - t0
        res[k] = min(res.get(k, 1e9), dt)
tot_lora = sum(v for k, v in res.items() if "int4 only" not in k)
print(f"threads {threads} ({'wall' if threads > 1 else 'thread CPU'} s, best of {reps}), one layer, C={C}, pos={P}")
for k, v in res.items():
    print(f"  {k:22s} {v*1e3:8.3f} ms" + ("" if "int4 only" in k else f"  {100*v/tot_lora:5.1f}%"))
print(f"  total (layer, lora_linear rows) {tot_lora*1e3:.3f} ms; x 24 layers x 2 chunks = {tot_lora*48:.3f} s")
