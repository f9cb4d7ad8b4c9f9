"""One SGD step of an exported program on ExecuTorch (the host's layer loop) against the eager MeSP step on the
program's own weights (`model_weights` over the same memory-mapped file: the int4/int8 projections dequantized as
the methods do), from the same adapter and batch: the loss and the updated adapter compared.

The eager side is `mesp_step` with an SGD update per layer (toolchain/bench/steps.py, the `bench memory` mesp
mode), not the program's methods run in PyTorch: an independent path through the same arithmetic. For the 7B
program this is the "program = eager at 7B" check (minutes per step on a laptop); the tests check the same on
small checkpoints (tests/export/test_families_export.py, tests/bench/test_bench_memory_cli.py).

    python scripts/program_vs_eager.py --program P7B --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", required=True, type=Path)
    ap.add_argument("--lr", type=float, default=1.0,
                    help="large, so that the update is far above the adapter's float32 rounding")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not (args.program / "manifest.json").is_file():
        print(f"Error: {args.program} is not a program directory (no manifest.json)", file=sys.stderr)
        return 2

    import torch

    from toolchain.bench.steps import sgd_hook, train_step
    from toolchain.lora import init_lora, lora_state_dict
    from toolchain.program import ProgramDir
    from toolchain.program.spec import flat_state, state_layout
    from toolchain.program.weights_file import model_weights
    from toolchain.runtime import LayerLoop
    from toolchain.runtime.program_runtime import open_runtime

    torch.set_num_threads(args.threads)
    pdir = ProgramDir(args.program)
    if pdir.optimizer.kind != "sgd":
        print(f"Error: {args.program} was exported with {pdir.optimizer.kind}; this compares SGD steps",
              file=sys.stderr)
        return 2
    arch, cfg, spec = pdir.arch, pdir.lora_config, pdir.spec
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, arch.vocab, (pdir.seq_len,), generator=gen)
    lora0 = init_lora(arch, cfg, seed=args.seed, zero_b=False)
    before = {k: v.clone() for k, v in lora_state_dict(lora0).items()}

    state = flat_state(state_layout(arch, cfg, pdir.optimizer), lora0)
    loop = LayerLoop(pdir, open_runtime(pdir, "executorch", threads=args.threads))
    t0 = time.process_time()
    program_loss = loop.train_step(ids, ids.clone(), args.lr, state)
    program_cpu = time.process_time() - t0
    program_lora = lora_state_dict(pdir.lora_from_state(state))

    eager = init_lora(arch, cfg, seed=args.seed, zero_b=False)
    weights = model_weights(pdir.weights(), arch, spec.quant)
    t0 = time.process_time()
    eager_loss = train_step(arch, weights, cfg, eager, ids, ids.clone(), mode="mesp", hook=sgd_hook(eager, args.lr),
                            options=spec.options)
    eager_cpu = time.process_time() - t0
    eager_lora = lora_state_dict(eager)

    def rel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))

    # the update itself (after - before) compared, not just the adapter (which is mostly its initial value)
    update_diff = max(rel(program_lora[k] - before[k], eager_lora[k] - before[k]) for k in eager_lora)
    state_diff = max(rel(program_lora[k], eager_lora[k]) for k in eager_lora)
    moved = min(float((eager_lora[k] - before[k]).abs().max()) for k in eager_lora)
    doc = {"program": str(args.program.resolve()), "model": pdir.model.source, "seq_len": pdir.seq_len,
           "quant": spec.quant.kind, "lr": args.lr, "threads": args.threads,
           "program_loss": program_loss, "eager_loss": eager_loss,
           "loss_rel_diff": abs(program_loss - eager_loss) / abs(eager_loss),
           "update_max_rel_diff": update_diff, "adapter_max_rel_diff": state_diff,
           "smallest_tensor_update": moved, "program_step_cpu_s": round(program_cpu, 2),
           "eager_step_cpu_s": round(eager_cpu, 2)}
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
