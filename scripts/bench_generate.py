"""Decode speed and memory of an exported program's generation methods on a host runtime.

  .venv/bin/python scripts/bench_generate.py --program DIR [--target executorch|onnx|eager] [--threads 1]
      [--prompt-len 32] [--new 32] [--json OUT]

One warm-up generation (every weight page mapped in, every method loaded), then the measured one:
prefill seconds (embed + block_kv/block_forward per layer + head_logits), decode tokens/s (embed_token,
block_decode per layer, head_logits), and the peak anonymous memory of the measured generation
(VmHWM - RssFile - RssShmem, toolchain/memory/measure.py: what a phone counts; the weights are mapped
file pages) with the anonymous memory before it (runtime, Python, loaded methods). Run it under
MALLOC_MMAP_THRESHOLD_=131072 for phone-like memory numbers (see PHONE_LIKE_MALLOC_ENV).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", type=Path, required=True)
    ap.add_argument("--target", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from toolchain.memory.measure import MIB, measure_peak
    from toolchain.runtime import ProgramDir
    from toolchain.runtime.generate import generate
    from toolchain.runtime.runners import open_runner

    pdir = ProgramDir(a.program, verify=False)
    runner = open_runner(pdir, a.target, threads=a.threads, use="generate")
    state = pdir.state_init()
    prompt = [(7 * i + 3) % min(pdir.arch.vocab, 1000) for i in range(a.prompt_len)]
    generate(pdir, runner, state, prompt, a.new)                        # warm-up
    with measure_peak() as m:
        res = generate(pdir, runner, state, prompt, a.new)
    out = {"program": str(a.program), "backend": runner.backend, "threads": a.threads, "prompt_len": a.prompt_len,
           "new_tokens": len(res.output_ids), "prefill_s": round(res.prefill_s, 3),
           "decode_tokens_per_s": round(len(res.decode_s) / sum(res.decode_s), 3),
           "decode_s_per_token": round(sum(res.decode_s) / len(res.decode_s), 4),
           "peak_anon_mib": round(m.peak_anon_bytes / MIB, 1), "anon_before_mib": round(m.anon_before_bytes / MIB, 1),
           "generation_anon_mib": round((m.peak_anon_bytes - m.anon_before_bytes) / MIB, 1),
           "kv_cache_mib": round(pdir.manifest["generate"]["cache_bytes"] / MIB, 2),
           "state_mib": round(4 * pdir.state_numel / MIB, 2), "file_drift_mib": round(m.file_drift_bytes / MIB, 1)}
    print(json.dumps(out))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
