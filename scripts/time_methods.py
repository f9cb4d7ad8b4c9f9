"""Per-method CPU time of .pte files of one program, side by side (docs/benchmarks.md section 1).

  PYTHONPATH=. .venv/bin/python scripts/time_methods.py PROGRAM_DIR ROUNDS a.pte b.pte ...

Every .pte is loaded in this process; block_forward, block_backward and head_loss get the same random inputs
(shapes from PROGRAM_DIR's manifest), outputs are compared with the first .pte's, then each method is called
once per round, the files interleaved (the order reversed every other round); prints medians and ranges.
"""
import sys, time, statistics
from pathlib import Path
import torch
from toolchain.program import ProgramDir
from toolchain.runtime.executorch_runtime import load_quantized_kernels
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
load_quantized_kernels(); portable_lib._unsafe_reset_threadpool(1); torch.set_num_threads(1)
pdir, rounds, ptes = ProgramDir(Path(sys.argv[1])), int(sys.argv[2]), sys.argv[3:]
names = ["block_forward", "block_backward", "head_loss"]
g = torch.Generator().manual_seed(0)
def inputs(m):
    out = []
    for io in m.inputs:
        if io.dtype == "uint8": x = torch.randint(0, 256, io.shape, dtype=torch.uint8, generator=g)
        elif io.dtype == "int64": x = torch.randint(0, 1000, io.shape, generator=g)
        elif io.name.endswith("_scale"): x = torch.rand(io.shape, generator=g) * 0.02
        elif io.name.endswith("norm"): x = 1 + 0.1 * torch.randn(io.shape, generator=g)
        elif io.name == "lr": x = torch.full(io.shape, 1e-4)
        elif io.name == "step": x = torch.ones(io.shape)
        else: x = 0.1 * torch.randn(io.shape, generator=g)
        out.append(x)
    return out
ins = {n: inputs(pdir.methods[n]) for n in names}
progs = [Runtime.get().load_program(Path(p)) for p in ptes]
meth = [{n: pr.load_method(n) for n in names} for pr in progs]
res = {}
for i, ms in enumerate(meth):
    for n in names:
        o = ms[n]._method.call(ins[n], clone_outputs=True)
        res[(i, n)] = o
for n in names:
    for i in range(1, len(ptes)):
        d = max(float((a - b).abs().max() / (b.abs().max() or 1)) for a, b in zip(res[(i, n)], res[(0, n)]) if a.dtype.is_floating_point)
        print(f"{n}: {ptes[i]} vs {ptes[0]} max rel diff {d:.2e}")
cpu = {(i, n): [] for i in range(len(ptes)) for n in names}
for r in range(rounds):
    for i in (range(len(ptes)) if r % 2 == 0 else reversed(range(len(ptes)))):
        for n in names:
            c0 = time.process_time(); meth[i][n]._method.call(ins[n], clone_outputs=False); cpu[(i, n)].append(time.process_time() - c0)
for n in names:
    base = statistics.median(cpu[(0, n)])
    print(n, "  ".join(f"{Path(ptes[i]).stem}: {statistics.median(cpu[(i, n)])*1e3:.1f} ms [{min(cpu[(i,n)])*1e3:.1f}-{max(cpu[(i,n)])*1e3:.1f}] ({statistics.median(cpu[(i, n)])/base:.3f}x)" for i in range(len(ptes))))
