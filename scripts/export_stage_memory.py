"""Where an export's memory goes: `toolchain export` of a preset with fewer layers (the same widths), its resident
set sampled every 0.2 s and reported per export stage (write weights, torch.export, to_edge, XNNPACK,
to_executorch, write .pte, ...). The traced methods are layer-generic, so every stage after the weights costs what
the full model's export costs; only the weights file shrinks (Qwen2.5-7B with 2 layers: 0.82 GiB instead of 4.0).

    python scripts/export_stage_memory.py --model qwen2.5-7b --layers 2 --out DIR [--weights-from FILE] [-- EXPORT ARGS]

--weights-from copies an existing weights file of the same model, layers, seed and quantization (e.g. the
`bench memory` cache's, scripts/bench_7b_widths.py) instead of streaming it again. Prints one line per stage
boundary and, at the end, one JSON line: the stages' start times (s) and each stage's peak VmRSS / RssAnon (MiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import threading
import time
from pathlib import Path


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) // 1024
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--weights-from", type=Path, default=None)
    ap.add_argument("export_args", nargs="*", help="more `toolchain export` options, after --")
    args = ap.parse_args()

    import toolchain.export.build as build
    import toolchain.models.presets as presets
    from toolchain.cli import cli

    arch = dataclasses.replace(presets.get_preset(args.model), layers=args.layers)
    presets.PRESETS[args.model] = arch   # the table `--model` resolves names in
    assert presets.get_preset(args.model).layers == args.layers

    stage, peaks, starts, t0 = ["start"], {}, [], time.time()

    def sample() -> None:
        while True:
            s = _status()
            p = peaks.setdefault(stage[0], {"rss": 0, "anon": 0})
            p["rss"], p["anon"] = max(p["rss"], s["VmRSS"]), max(p["anon"], s["RssAnon"])
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()

    if args.weights_from is not None:
        def copy_weights(path, source, quant, on_tensor=None):
            shutil.copyfile(args.weights_from, path)
        build.write_weights_streamed = copy_weights

    export_program = build.export_program

    def profiled(*a, on_stage=None, **k):
        def note(name: str) -> None:
            print(f"[{time.time() - t0:8.1f} s] -> {name}  {_status()}  peak of {stage[0]}: {peaks.get(stage[0])}",
                  flush=True)
            starts.append((name, round(time.time() - t0, 1)))
            stage[0] = name
            if on_stage:
                on_stage(name)
        manifest = export_program(*a, on_stage=note, **k)
        note("done")
        return manifest

    build.export_program = profiled
    try:
        cli.main(["export", "--model", args.model, "--init", "random", "--out", str(args.out), *args.export_args],
                 standalone_mode=False)
    finally:
        print(json.dumps({"stages": starts, "peaks_mib": peaks, "final": _status()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
