"""The training step's float32 native ops against their references in eager PyTorch, at one Qwen2.5-0.5B layer's
shapes (H 14, Hk 2, T 256, D 64; an MLP chunk [256, 256]; RoPE of q, the attention half's RMSNorm backward
[256, 896] with three gradients and the residual): process CPU and wall ms per call, 1 and 2 pool threads.

  PYTHONPATH=. .venv/bin/python scripts/bench_train_ops.py [--reps 10]

The references run at 1 torch thread; compare within one run (the host is shared).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time

import torch


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    from executorch.extension.pybindings import portable_lib

    from toolchain.mesp.kernels import load_native_kernels
    from toolchain.mesp.ops.attention import attention_train_backward_reference, attention_train_reference
    from toolchain.mesp.ops.rmsnorm import rms_norm_backward_reference
    from toolchain.mesp.ops.rope import rope_tables, rope_train_backward_reference, rope_train_reference
    from toolchain.mesp.ops.swiglu import swiglu_train_reference

    torch.set_num_threads(1)
    lib = load_native_kernels()
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    h, hk, t, d, c = 14, 2, 256, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(h, t, d, generator=gen), torch.randn(hk, t, d, generator=gen), torch.randn(hk, t, d, generator=gen)
    do = torch.randn(t, h * d, generator=gen)
    g, u, da = (torch.randn(t, 256, generator=gen) for _ in range(3))
    o, grads, sw = torch.empty(t, h * d), torch.empty(h + 2 * hk, t, d), torch.empty(3, t, 256)
    cos, sin = rope_tables(torch.arange(t), d, 1e6, torch.float32)
    xn, dy2, dy3, res = (torch.randn(t, 896, generator=gen) for _ in range(4))
    wn, rq, dn = torch.randn(896, generator=gen), torch.empty(h, t, d), torch.empty(t, 896)
    cases = {
        "attention_train": (lambda: lib.toolchain_attention_train(ptr(q), ptr(k), ptr(v), h, hk, t, d, ctypes.c_float(c), ptr(o)),
                            lambda: attention_train_reference(q, k, v, c)),
        "attention_train_backward": (
            lambda: lib.toolchain_attention_train_backward(ptr(do), ptr(q), ptr(k), ptr(v), ptr(o), h, hk, t, d,
                                                           ctypes.c_float(c), ptr(grads)),
            lambda: attention_train_backward_reference(do, q, k, v, o, c)),
        "swiglu_train": (lambda: lib.toolchain_swiglu_train(ptr(g), ptr(u), ptr(da), g.numel(), ptr(sw)),
                         lambda: swiglu_train_reference(g, u, da)),
        "rope_train (q)": (lambda: lib.toolchain_rope_train(ptr(do), ptr(cos), ptr(sin), t, h, d, ptr(rq)),
                           lambda: rope_train_reference(do, cos, sin, h)),
        "rope_train_backward (q)": (
            lambda: lib.toolchain_rope_train_backward(ptr(grads), ptr(cos), ptr(sin), h + 2 * hk, 0, t, h, d, ptr(o)),
            lambda: rope_train_backward_reference(grads, cos, sin, 0, h)),
        "rms_norm_backward (q+k+v)": (
            lambda: lib.toolchain_rms_norm_backward(ptr(xn), ptr(wn), ptr(do), ptr(dy2), ptr(dy3), ptr(res), t, 896,
                                                    ctypes.c_float(1e-6), ptr(dn)),
            lambda: rms_norm_backward_reference(xn, wn, 1e-6, do, dy2, dy3, res)),
    }
    print(f"kernel path {lib.toolchain_kernel_path().decode()}; ms per call: wall / process CPU")
    for n in (1, 2):
        portable_lib._unsafe_reset_threadpool(n)
        for name, (kernel, reference) in cases.items():
            row = []
            for fn in (kernel, reference):
                fn()
                w, p = time.perf_counter(), time.process_time()
                for _ in range(args.reps):
                    fn()
                row.append(f"{(time.perf_counter() - w) * 1e3 / args.reps:.2f} / {(time.process_time() - p) * 1e3 / args.reps:.2f}")
            print(f"threads {n}  {name:<26} native {row[0]:>14}   PyTorch eager {row[1]:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
