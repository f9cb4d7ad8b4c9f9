"""The prototype behind the XNNPACK generation variant's figures (docs/kernels.md "The stock runtime"): per-layer
block_decode / block_prefill and a head_logits of an exported int4 program, each holding its weights as constants,
every int4 linear as torchao's 8da4w reference (int8 per-token activations x int4 group weights, what
`export_llama -qmode 8da4w` lowers), lowered with XNNPACK's default partitioner; then a greedy generation through
them on the ExecuTorch runtime beside the program's own embed methods, 1 thread, CPU time beside wall time, and the
anonymous memory the loaded methods add.

  PYTHONPATH=. .venv/bin/python scripts/xnnpack_generation_prototype.py export PROGRAM OUT.pte [--layers N] [--no-prefill]
  PYTHONPATH=. .venv/bin/python scripts/xnnpack_generation_prototype.py run PROGRAM OUT.pte [--new 24] [--prompt-len 64]

The product (`toolchain export --xnnpack-generation`, export/xnnpack_generation.py) computes the same with
PyTorch's quantized_decomposed ops; `scripts/bench_generate.py --modes xnnpack` measures it.
"""
import argparse
import contextlib
import os
import sys
import time

import torch
from torch import nn

from toolchain.export.bodies import example_inputs, method_body
from toolchain.program.spec import method_specs
from toolchain.mesp.ops import quant as Q
from toolchain.mesp.ops.compute import FP32
from toolchain.program import ProgramDir

_XNN = False


@contextlib.contextmanager
def xnn_8da4w():
    global _XNN
    old, _XNN = _XNN, True
    try:
        yield
    finally:
        _XNN = old


def lin8da4w(x, wq, scale):
    from torchao.quantization.linear_quant_modules import linear_forward_8da4w
    group = wq.shape[1] // scale.shape[1]
    return linear_forward_8da4w(x, wq, None, scale, ZEROS[id(scale)], wq.shape[0], group, torch.float32)


ZEROS = {}


_orig = Q.matmul_xwt


def matmul_xwt(x, w, *compute):
    if _XNN and isinstance(w, Q.QuantWeight) and w.q.dtype == torch.int8 and w.bits == 4:
        return lin8da4w(x, w.q, w.scale)
    return _orig(x, w, *compute)


import toolchain.mesp.ops.lora_linear as LL  # noqa: E402
import toolchain.mesp.decode as DEC  # noqa: E402
LL.matmul_xwt = matmul_xwt
DEC.matmul_xwt = matmul_xwt
Q.matmul_xwt = matmul_xwt


def unpack(q):   # uint8 [o, i/2] -> int8 [o, i] in [-8, 7]
    hi = (q // 16).to(torch.int16) - 8
    lo = (q & 15).to(torch.int16) - 8
    return torch.stack([hi, lo], -1).reshape(q.shape[0], -1).to(torch.int8)


class ConstMethod(nn.Module):
    """A method with its weight inputs (one layer's) as constants: int4 matrices unpacked to int8 [-8, 7],
    scales rounded to bfloat16 (what XNNPACK stores)."""

    def __init__(self, spec, method, weights, layer):
        super().__init__()
        self.spec, self.method = spec, method
        self.names = [io.name for io in method.inputs]
        self.free = [io.name for io in method.inputs if io.bind != "weight"]
        self.consts = []
        for io in method.inputs:
            if io.bind != "weight":
                continue
            t = weights[io.ref.replace("{layer}", str(layer))]
            if io.rows is not None:
                t = t[io.rows[0]:io.rows[1]]
            if io.name.endswith("_q") and t.dtype == torch.uint8:
                t = unpack(t)
            elif io.name.endswith("_scale"):
                t = t.to(torch.bfloat16).float()
            else:
                t = t.clone()
            self.register_buffer("c_" + io.name, t.contiguous())
            self.consts.append(io.name)
            if io.name.endswith("_scale"):
                self.register_buffer("z_" + io.name, torch.zeros_like(t))

    def forward(self, *inputs):
        ins = dict(zip(self.free, inputs))
        for n in self.consts:
            ins[n] = getattr(self, "c_" + n)
            if n.endswith("_scale"):
                ZEROS[id(ins[n])] = getattr(self, "z_" + n)
        with xnn_8da4w():
            return method_body(self.spec, self.method.role, ins, executorch=False, compute=FP32)


def do_export(a):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    pdir = ProgramDir(a.program, verify=False)
    spec = pdir.spec
    ms = method_specs(spec)
    w = pdir.weights()
    t0 = time.process_time(), time.perf_counter()
    eps = {}
    layers = a.layers or spec.arch.layers
    roles = ["block_decode"] + ([] if a.no_prefill else ["block_prefill"])
    with torch.no_grad():
        for role in roles:
            m = ms[role]
            for i in range(layers):
                mod = ConstMethod(spec, m, w, i)
                ex = tuple(x for io, x in zip(m.inputs, example_inputs(m)) if io.bind != "weight")
                eps[f"{role}_xnnpack_{i}"] = torch.export.export(mod, ex, strict=False)
        m = ms["head_logits"]
        # the whole head (one matrix), not the chunks
        import dataclasses
        from toolchain.contract import MethodSpec
        m2 = dataclasses.replace(ms["head_logits_fused"], kernels=())
        mod = ConstMethod(spec, m2, w, 0)
        ex = tuple(x for io, x in zip(m2.inputs, example_inputs(m2)) if io.bind != "weight")
        eps["head_logits_xnnpack"] = torch.export.export(mod, ex, strict=False)
    t1 = time.process_time(), time.perf_counter()
    print(f"torch.export {t1[1]-t0[1]:.1f} s wall {t1[0]-t0[0]:.1f} s cpu", flush=True)
    et = to_edge_transform_and_lower(eps, partitioner=[XnnpackPartitioner()],
                                     compile_config=EdgeCompileConfig(_check_ir_validity=False))
    t2 = time.process_time(), time.perf_counter()
    print(f"lower {t2[1]-t1[1]:.1f} s wall {t2[0]-t1[0]:.1f} s cpu", flush=True)
    for name in list(eps)[:1] + ["head_logits_xnnpack"]:
        g = et.exported_program(name).graph
        print(name, sorted({str(n.target) for n in g.nodes if n.op == "call_function"}))
    prog = et.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
    open(a.out, "wb").write(prog.buffer)
    t3 = time.process_time(), time.perf_counter()
    print(f"to_executorch+write {t3[1]-t2[1]:.1f} s wall {t3[0]-t2[0]:.1f} s cpu; total {t3[1]-t0[1]:.1f} wall "
          f"{t3[0]-t0[0]:.1f} cpu; size {os.path.getsize(a.out)/2**20:.1f} MiB", flush=True)


def anon_mib():
    f = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status") if l.split(":")[0] in
         ("VmRSS", "RssAnon", "RssFile", "VmHWM", "RssShmem")}
    return f["RssAnon"] / 1024, (f["VmHWM"] - f["RssFile"] - f["RssShmem"]) / 1024


def do_run(a):
    from executorch.runtime import Runtime, Verification
    from toolchain.runtime.generate import new_cache
    from toolchain.runtime.loop import LayerLoop
    from toolchain.runtime.program_runtime import open_runtime

    torch.set_num_threads(1)
    pdir = ProgramDir(a.program, verify=False)
    spec = pdir.spec
    ms = method_specs(spec)
    stock = open_runtime(pdir, "executorch", threads=1, use="generate", fused=False)
    loop = LayerLoop(pdir, stock)
    state = pdir.state_init()
    if a.lora_noise:
        state.add_(torch.randn(state.shape, generator=torch.Generator().manual_seed(0)) * a.lora_noise)
    views = pdir.state_views(state)
    base_anon, _ = anon_mib()
    t0 = time.perf_counter()
    rt = Runtime.get()
    prog = rt.load_program(a.pte, verification=Verification.Minimal)
    names = prog.method_names
    L = a.layers or spec.arch.layers
    dec = [prog.load_method(f"block_decode_xnnpack_{i}") for i in range(L)]
    pre = [prog.load_method(f"block_prefill_xnnpack_{i}") for i in range(L)] if f"block_prefill_xnnpack_0" in names else None
    head = prog.load_method("head_logits_xnnpack")
    load_s = time.perf_counter() - t0
    anon_loaded, _ = anon_mib()
    print(f"load {load_s:.2f} s; anon after load {anon_loaded - base_anon:.1f} MiB above the stock runtime", flush=True)

    def lora(m, i):
        return [views[io.ref.replace("{layer}", str(i))] for io in m.inputs if io.bind == "state"]

    final_norm = pdir.weights()["final_norm"]
    cache = new_cache(pdir)
    c = spec.prefill_chunk
    prompt = [(7 * i + 3) % 1000 for i in range(a.prompt_len)]
    n = len(prompt)
    md, mp = ms["block_decode"], ms["block_prefill"]

    def block(meth, m, i, x, pos):
        k, v = cache[f"k_{i}"], cache[f"v_{i}"]
        out = meth.execute([x, torch.tensor([pos]), k, v] + lora(m, i))
        xo, kn, vn = out
        rows = kn.shape[1]
        e = min(pos + rows, pdir.seq_len)
        k[:, pos:e] = kn[:, :e - pos]
        v[:, pos:e] = vn[:, :e - pos]
        return xo

    with torch.no_grad():
        cpu0, t0 = time.process_time(), time.perf_counter()
        if pre is None:
            c = 1
        for start in range(0, n, c):
            if pre is None:
                x = loop.call_method("embed_token", None, {"token": torch.tensor([prompt[start]])}, views)["x"]
                for i in range(L):
                    x = block(dec[i], md, i, x, start)
                continue
            ids = torch.full((c,), pdir.pad_token_id, dtype=torch.int64)
            ids[:min(c, n - start)] = torch.tensor(prompt[start:start + c])
            x = loop.call_method("embed_prefill", None, {"tokens": ids}, views)["x"]
            for i in range(L):
                if pre is not None:
                    x = block(pre[i], mp, i, x, start)
                else:
                    raise SystemExit("no prefill")
        last = (n - 1) % c
        logits = head.execute([x[last:last + 1]])[0]
        prefill = time.perf_counter() - t0, time.process_time() - cpu0
        out = []
        pos = n
        dts, cpus = [], []
        for _ in range(a.new):
            tok = int(torch.argmax(logits))
            out.append(tok)
            t1, c1 = time.perf_counter(), time.process_time()
            x = loop.call_method("embed_token", None, {"token": torch.tensor([tok])}, views)["x"]
            for i in range(L):
                x = block(dec[i], md, i, x, pos)
            logits = head.execute([x])[0]
            dts.append(time.perf_counter() - t1)
            cpus.append(time.process_time() - c1)
            pos += 1
    anon_now, peak = anon_mib()
    print(f"prefill {n} tokens: {prefill[0]:.3f} s wall, {prefill[1]:.3f} s cpu")
    d = dts[2:]
    print(f"decode {len(dts)} tokens: {len(d)/sum(d):.1f} tokens/s wall, {len(d)/sum(cpus[2:]):.1f} per cpu-s "
          f"(median {1/sorted(d)[len(d)//2]:.1f})")
    print(f"anon: loaded {anon_loaded - base_anon:.1f} MiB over the stock generation runtime; now {anon_now:.1f} MiB total")
    print("ids", out)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("program")
    p.add_argument("pte")
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--no-prefill", action="store_true")
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--lora-noise", type=float, default=0.0)
    a = p.parse_args()
    a.out = a.pte
    do_export(a) if a.cmd == "export" else do_run(a)
