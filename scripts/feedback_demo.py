"""The feedback demo (issue 43's goal): a scripted feedback session on the bundled demo model, on the real
ExecuTorch runtime, and the held-out log-likelihood margin of edited over original responses before and after.

    PYTHONPATH=. python scripts/feedback_demo.py --out /tmp/feedback-demo [--steps 120] [--lr 3e-3] [--beta 0.1]

1. Export the `demo` preset as the demo does (toolchain/demo.py: fp32, AdamW without weight decay, LoRA r=8 alpha=16
   on every projection, seq_len 128, byte tokenizer) plus `--preference` (block_backward_pair), target ExecuTorch
   (re-used when `--out` already holds it).
2. `toolchain data --feedback toolchain/assets/feedback_session.jsonl` (42 records: 18 edits, 18 accepts, 6 rejects;
   made by scripts/make_feedback_session.py) -> SFT rows and preference pairs; the held-out records
   (toolchain/assets/feedback_held_out.jsonl: 7 edits on the held-out log) -> held-out pairs.
3. Two runs from the pretrained model, `--steps` steps each, the same lr and row order: SFT on the rows only (what
   training on kept text alone gives), and DPO on the pairs mixed with the SFT rows (`train --program --objective
   dpo --sft-data`, dpo weight 1).
4. The held-out margin: mean over the held-out edits of lp(edited) - lp(original) (sums of the responses' token
   log-probabilities given the prompt, nats), measured on the program's own methods, before and after each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from toolchain.cli import cli
from toolchain.demo import DemoConfig
from toolchain.training import TrainRun
from toolchain.training.preference import program_pair_logps, program_preference_trainer, read_pair_items
from toolchain.training.program import ProgramTrainer
from toolchain.training.session import TrainingSession

ASSETS = Path(__file__).resolve().parents[1] / "toolchain" / "assets"


def export(out: Path) -> None:
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.models import load_model
    from toolchain.optim import OptimizerConfig
    from toolchain.program.spec import QuantSpec
    from toolchain.text.tokenizer import ByteTokenizer

    cfg = DemoConfig()
    arch, weights = load_model(cfg.model)
    tok = ByteTokenizer()
    lora_cfg = LoraConfig(rank=cfg.rank, alpha=cfg.alpha)
    spec = ExportSpec(source=cfg.model, init="pretrained", seed=cfg.seed, seq_len=cfg.seq_len, quant=QuantSpec("none"),
                      optimizer=OptimizerConfig("adamw", weight_decay=0.0), default_lr=cfg.lr, tokenizer_kind="byte",
                      pad_token_id=tok.PAD, eos_token_id=tok.EOS, tokenizer_json=tok.to_json(), preference=True)
    export_program(arch, weights, lora_cfg, init_lora(arch, lora_cfg, seed=cfg.seed), spec, out)


def run_cli(*args) -> str:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [str(a) for a in args])
    if result.exit_code != 0:
        sys.exit(result.output)
    return result.output.strip()


def margin(pdir, loop, pairs, state) -> float:
    lps = program_pair_logps(pdir, loop, pairs, state)
    return statistics.mean(c - r for c, r in lps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--beta", type=float, default=0.1)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prog = args.out / "program"
    t0 = time.perf_counter()
    if not (prog / "manifest.json").exists():
        export(prog)
    print(f"program: {prog} ({time.perf_counter() - t0:.0f} s)")
    rows, pairs_path = args.out / "rows.jsonl", args.out / "pairs.jsonl"
    print(run_cli("data", "--program", prog, "--feedback", ASSETS / "feedback_session.jsonl", "--out", rows,
                  "--pairs-out", pairs_path, "--force"))
    held_rows, held_pairs = args.out / "held.rows.jsonl", args.out / "held.pairs.jsonl"
    print(run_cli("data", "--program", prog, "--feedback", ASSETS / "feedback_held_out.jsonl", "--out", held_rows,
                  "--pairs-out", held_pairs, "--force"))

    session = TrainingSession(prog, use="train", threads=1)
    pdir, runtime, loop = session.pdir, session.open_runtime(), session.loop
    assert runtime.backend == "executorch", runtime.backend
    held = read_pair_items(held_pairs, pdir.arch.vocab, pdir.seq_len)
    examples = session.examples(rows)
    start = pdir.state_init()
    before = margin(pdir, loop, held, start)
    print(f"runtime {runtime.backend}; held-out: {len(held)} edits; margin = mean lp(edited) - lp(original), nats")
    print(f"BEFORE            held-out margin {before:+.3f}")

    results = {"before": before, "steps": args.steps, "lr": args.lr, "beta": args.beta}
    t = time.perf_counter()
    sft = ProgramTrainer(pdir, runtime, examples, TrainRun(steps=args.steps, lr=args.lr, shuffle_seed=0),
                         loop=loop, state=start.clone())
    sft.run()
    results["sft"] = margin(pdir, loop, held, sft.state)
    print(f"AFTER SFT         held-out margin {results['sft']:+.3f}  ({results['sft'] - before:+.3f}; "
          f"{len(examples)} rows, {time.perf_counter() - t:.0f} s)")
    t = time.perf_counter()
    pairs = read_pair_items(pairs_path, pdir.arch.vocab, pdir.seq_len)
    dpo = program_preference_trainer(pdir, runtime, pairs, examples,
                                     TrainRun(steps=args.steps, lr=args.lr, shuffle_seed=0), beta=args.beta)
    dpo._state = start.clone()
    dpo.run()
    results["dpo_sft"] = margin(pdir, loop, held, dpo.state)
    print(f"AFTER DPO + SFT   held-out margin {results['dpo_sft']:+.3f}  ({results['dpo_sft'] - before:+.3f}; "
          f"{len(pairs)} pairs + {len(examples)} rows, {time.perf_counter() - t:.0f} s)")
    (args.out / "feedback_demo.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
