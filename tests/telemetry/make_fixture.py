"""Record the fixture run `data/tiny_host_run.jsonl` (a real run, not invented numbers).

    .venv/bin/python tests/telemetry/make_fixture.py tests/telemetry/data/tiny_host_run.jsonl

Trains the tiny preset (random init, seed 0) for 24 MeSP steps with SGD applied layer by layer,
LCSB-style: odd steps backpropagate layers 4-7, even steps layers 0-3 (`lcsb_k` 4, two phases).
After every step it samples this process's /proc/self/status (probe `linux_proc_status`: anon =
RssAnon, peak = VmHWM - RssFile - RssShmem, rss = VmRSS) and writes the events exactly as the
host runtime and the apps do (`TelemetryRecorder`). Linux only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from toolchain.text.dataset import bundled_examples
from toolchain.text.tokenizer import ByteTokenizer
from toolchain.lora import LoraConfig, LoraPair, init_lora
from toolchain.mesp import mesp_step
from toolchain.models import get_preset, random_weights
from toolchain.telemetry.events import TelemetryRecorder

STEPS, SEQ_LEN, RANK, LR, K = 24, 128, 8, 3e-3, 4


def proc_status() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def memory_sample(step: int) -> dict:
    s = proc_status()
    return {"probe": "linux_proc_status", "step": step, "anon_bytes": s["RssAnon"], "rss_bytes": s["VmRSS"],
            "peak_bytes": s["VmHWM"] - s["RssFile"] - s["RssShmem"]}


def main(out: Path) -> None:
    out.unlink(missing_ok=True)
    arch = get_preset("tiny")
    weights = random_weights(arch, seed=0)
    cfg = LoraConfig(rank=RANK, alpha=2 * RANK)
    lora = [dict(layer) for layer in init_lora(arch, cfg, seed=0)]
    examples = bundled_examples(ByteTokenizer(), seq_len=SEQ_LEN)
    writer = TelemetryRecorder(out, run_id="tiny-host-fixture-0001")
    mem_total = proc_status_meminfo()
    writer.emit("run_start", model="tiny", method="mesp", backend="eager", seq_len=SEQ_LEN, rank=RANK, lcsb_k=K,
                targets=list(cfg.targets), optimizer="sgd", lr=LR, quant="none", steps_planned=STEPS,
                platform="linux", device_model="host (2-core x86_64)", os="Linux", total_ram_bytes=mem_total,
                budget_bytes=1 << 30, config={"loss_chunk": 32, "init": "random", "seed": 0})
    writer.emit("memory", **{k: v for k, v in memory_sample(0).items() if k != "step"})
    for step in range(STEPS):
        phase = step % 2
        layers = range(arch.layers - K, arch.layers) if phase == 0 else range(0, K)
        ex = examples[step % len(examples)]

        def sgd(layer: int, g: dict) -> None:
            lora[layer] = {t: LoraPair(p.a - LR * g[t].a, p.b - LR * g[t].b) for t, p in lora[layer].items()}

        t0 = time.perf_counter()
        with torch.no_grad():
            res = mesp_step(arch, weights, cfg, tuple(lora), ex.input_ids, ex.labels, backward_layers=layers,
                            on_layer_grads=sgd)
        dt = time.perf_counter() - t0
        writer.emit("step", step=step, loss=float(res.loss), step_time_s=dt, tokens_per_s=SEQ_LEN / dt,
                    tokens=SEQ_LEN, lcsb_phase=phase, lr=LR)
        writer.emit("memory", **memory_sample(step))
    writer.emit("run_end", status="completed", steps_completed=STEPS, duration_s=writer.elapsed_s,
                peak_bytes=memory_sample(STEPS)["peak_bytes"], final_loss=float(res.loss))


def proc_status_meminfo() -> int:
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


if __name__ == "__main__":
    main(Path(sys.argv[1]))
