"""Generation speed and memory of an exported program on a host runtime, beside ExecuTorch's own LLM export.

  .venv/bin/python scripts/bench_generate.py --program DIR [--target executorch|onnx|eager] [--threads 1]
      [--prompt-len 64] [--new 64] [--modes fused,xnnpack,stock] [--anchor PTE] [--json OUT]

A mode `fused:<path>` (e.g. --modes fused:generic,fused:avx2,fused:avx_vnni,fused:avx512_vnni) runs the fused
methods with that kernel path forced ($TOOLCHAIN_KERNEL_PATH; docs/kernels.md).

Each mode runs in its own child process (the same program, one runtime each): `fused` is the ExecuTorch
generation with the native int4 kernel (int4 programs), `stock` the methods any ExecuTorch runtime has
(`TOOLCHAIN_NATIVE_KERNELS=0`, `TOOLCHAIN_XNNPACK_GENERATION=0`), `xnnpack` the XNNPACK generation variant
(programs exported with --xnnpack-generation: what a runtime without the native kernels runs); with --target
onnx / eager, one mode of that runtime. In each child: the
training runtime is loaded first (what an app holds while it personalizes), then the generation runtime,
a warm-up generation (every weight page mapped in, every method loaded) and the measured one, which
reports what `toolchain generate --json` reports: load_s, prefill_s, ttft_s, decode_tokens_per_s and the
counts behind them, plus the peak anonymous memory of generation above the loaded training runtime
(VmHWM - RssFile - RssShmem, toolchain/memory/measure.py: what a phone counts; weights are mapped file
pages; KV cache, arenas and transients included).

--anchor PTE adds ExecuTorch's own LLM export of the same architecture (random weights), measured the same
way in its own child (prompt as one prefill call, then one token per call, greedy): the program of

  python -m executorch.examples.models.llama.export_llama --model llama3 \\
      --params scripts/anchor_qwen2_5_0_5b_params.json -kv --use_sdpa_with_kv_cache -X \\
      --xnnpack-extended-ops -qmode 8da4w --group_size 32 --embedding-quantize 8,0 \\
      --max_seq_length 256 --max_context_length 256 --output_name ~/.cache/toolchain/anchor/qwen2_5_0_5b_8da4w.pte

(about 17 CPU-minutes, so it is cached outside the repository). Prints a table and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prompt(vocab: int, n: int) -> list[int]:
    return [(7 * i + 3) % min(vocab, 1000) for i in range(n)]


def _ours(a) -> dict:
    import torch

    from toolchain.memory.measure import MIB, measure_peak
    from toolchain.program import ProgramDir
    from toolchain.runtime.generate import generate
    from toolchain.runtime.program_runtime import open_runtime

    torch.set_num_threads(a.threads)
    pdir = ProgramDir(a.program, verify=False)
    train = open_runtime(pdir, a.target, threads=a.threads, use="train")   # the app's training runtime, loaded
    state = pdir.state_init()
    prompt = _prompt(pdir.arch.vocab, a.prompt_len)
    with measure_peak() as m:
        t0 = time.perf_counter()
        runtime = open_runtime(pdir, a.target, threads=a.threads, use="generate")
        load_s = time.perf_counter() - t0
        generate(pdir, runtime, state, prompt, a.new)                       # warm-up
        first: list[float] = []
        c0 = time.process_time()
        res = generate(pdir, runtime, state, prompt, a.new,
                       on_token=lambda _: first.append(time.process_time()) if not first else None)
        c1 = time.process_time()
    del train
    # CPU time of the process (all its threads): prefill until the first token, decode after it. On a loaded
    # host, with 1 thread, tokens per CPU second is the rate an idle core would give (wall time is not).
    cpu = {"prefill_cpu_s": round(first[0] - c0, 4), "decode_cpu_s": round(c1 - first[0], 4),
           "decode_tokens_per_cpu_s": round(res.timings()["decode_tokens"] / max(c1 - first[0], 1e-9), 3)}
    kernels = ""
    if res.fused:
        from toolchain.native import kernel_path

        kernels = f" + kernels {kernel_path()}"
    elif res.variant == "xnnpack":
        kernels = " XNNPACK variant"
    return {"system": f"toolchain {runtime.backend}" + kernels,
            "backend": runtime.backend, "load_s": round(load_s, 3), **res.timings(), **cpu,
            "generation_anon_mib": round((m.peak_anon_bytes - m.anon_before_bytes) / MIB, 1),
            "anon_before_mib": round(m.anon_before_bytes / MIB, 1),
            "kv_cache_mib": round(pdir.generate.cache_bytes / MIB, 2),
            "file_drift_mib": round(m.file_drift_bytes / MIB, 1),
            "fused_unavailable": getattr(runtime, "fused_unavailable", None)}


def _anchor(a) -> dict:
    """ExecuTorch's llama runtime protocol on the export_llama program: forward(tokens [1, n], input_pos [1])."""
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (sdpa_with_kv_cache kernels)
    from executorch.extension.pybindings import portable_lib
    from executorch.kernels import quantized  # noqa: F401

    from toolchain.memory.measure import MIB, measure_peak

    torch.set_num_threads(a.threads)
    portable_lib._unsafe_reset_threadpool(a.threads)
    prompt = _prompt(151936, a.prompt_len)

    def run(module) -> dict:
        t0 = time.perf_counter()
        logits = module.run_method("forward", (torch.tensor([prompt]), torch.tensor([0])))[0]
        token = int(torch.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
        prefill_s = ttft_s = time.perf_counter() - t0
        decode = []
        for pos in range(len(prompt), len(prompt) + a.new - 1):
            t1 = time.perf_counter()
            logits = module.run_method("forward", (torch.tensor([[token]]), torch.tensor([pos])))[0]
            token = int(torch.argmax(logits.reshape(-1)))
            decode.append(time.perf_counter() - t1)
        return {"prefill_s": round(prefill_s, 4), "ttft_s": round(ttft_s, 4), "prompt_tokens": len(prompt),
                "new_tokens": a.new, "decode_tokens": len(decode), "decode_s": round(sum(decode), 4),
                "decode_tokens_per_s": round(len(decode) / sum(decode), 3)}

    with measure_peak() as m:
        t0 = time.perf_counter()
        module = portable_lib._load_for_executorch(str(a.anchor))
        load_s = time.perf_counter() - t0
        run(module)                                                         # warm-up (XNNPACK packs at load)
        out = run(module)
    return {"system": "ExecuTorch export_llama 8da4w (XNNPACK)", "backend": "executorch", "load_s": round(load_s, 3),
            **out, "generation_anon_mib": round((m.peak_anon_bytes - m.anon_before_bytes) / MIB, 1),
            "anon_before_mib": round(m.anon_before_bytes / MIB, 1)}


def _child(a, mode: str) -> dict:
    env = dict(os.environ)
    if mode in ("stock", "xnnpack"):
        env["TOOLCHAIN_NATIVE_KERNELS"] = "0"
        env["TOOLCHAIN_XNNPACK_GENERATION"] = "1" if mode == "xnnpack" else "0"
    child = mode
    if mode.startswith("fused:"):
        child, env["TOOLCHAIN_KERNEL_PATH"] = "fused", mode.split(":", 1)[1]
    cmd = [sys.executable, __file__, "--child", child, "--threads", str(a.threads), "--prompt-len", str(a.prompt_len),
           "--new", str(a.new)]
    if mode == "anchor":
        cmd += ["--anchor", str(a.anchor)]
    else:
        cmd += ["--program", str(a.program)] + (["--target", a.target] if a.target else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: failed\n{done.stderr[-3000:]}")
    return {"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", type=Path)
    ap.add_argument("--target", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--modes", default="fused,stock", help="fused, xnnpack, stock (ExecuTorch); ignored for onnx / eager")
    ap.add_argument("--anchor", type=Path, default=None, help="an export_llama .pte (see the module docstring)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_anchor(a) if a.child == "anchor" else _ours(a)))
        return
    if a.program is None and a.anchor is None:
        ap.error("give --program and/or --anchor")
    modes = ([m.strip() for m in a.modes.split(",") if m.strip()] if a.target in (None, "executorch") else [a.target]
             ) if a.program else []
    rows = [_child(a, m) for m in modes] + ([_child(a, "anchor")] if a.anchor else [])
    anchor = next((r for r in rows if r["mode"] == "anchor"), None)
    print(f"{'system':44s} {'load s':>7s} {'prefill s':>9s} {'ttft s':>7s} {'decode tok/s':>12s} {'vs anchor':>9s} "
          f"{'gen anon MiB':>12s} {'prefill cpu s':>13s} {'decode tok/cpu-s':>16s}")
    for r in rows:
        ratio = f"{r['decode_tokens_per_s'] / anchor['decode_tokens_per_s']:.2f}x" if anchor else "-"
        print(f"{r['system']:44s} {r['load_s']:7.2f} {r['prefill_s']:9.3f} {r['ttft_s']:7.3f} "
              f"{r['decode_tokens_per_s']:12.2f} {ratio:>9s} {r['generation_anon_mib']:12.1f} "
              f"{r.get('prefill_cpu_s', float('nan')):13.3f} {r.get('decode_tokens_per_cpu_s', float('nan')):16.2f}")
    out = {"program": str(a.program) if a.program else None, "anchor": str(a.anchor) if a.anchor else None,
           "threads": a.threads, "prompt_len": a.prompt_len, "new": a.new, "load_avg": os.getloadavg()[0],
           "rows": rows}
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
