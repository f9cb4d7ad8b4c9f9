"""Pretrain the quick-start demo's model: the `demo` preset (a Qwen2 decoder, byte-level vocabulary)
on the bundled public-domain corpus, with plain PyTorch + transformers `Qwen2ForCausalLM`, one thread,
seeded. Writes a Hugging Face checkpoint directory (config.json, model.safetensors, tokenizer.json,
train_log.json) to toolchain/assets/demo_model/ (what `--model demo` loads).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/pretrain_demo_model.py            # the committed model
    .venv/bin/python scripts/pretrain_demo_model.py --steps 50 --out /tmp/m      # a quick check
    .venv/bin/python scripts/pretrain_demo_model.py --make-corpus DIR --steps 0  # only rebuild the corpus
    .venv/bin/python scripts/pretrain_demo_model.py --arch lcsb-mid --steps 400 --lr 1.5e-3 --warmup 40 \
        --threads 2 --out DIR     # a pretrained base for `toolchain bench lcsb`'s arch (docs/lcsb.md "What limits the gap")

The corpus (toolchain/assets/demo_corpus.txt) is rebuilt from the Canterbury-corpus files that PyPI's
`brotli` sdist ships with `--make-corpus DIR` (DIR: its tests/testdata); see toolchain/assets/README.md.
Held out: the last 5% of each of the three works (never trained on); the loss reported is the mean
next-byte cross-entropy in nats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "toolchain" / "assets"
CORPUS = ASSETS / "demo_corpus.txt"
PARTS = ("ALICE'S ADVENTURES IN WONDERLAND", "AS YOU LIKE IT", "Paradise Lost\n\nBook I")


def make_corpus(testdata: Path) -> str:
    """alice29.txt, asyoulik.txt and plrabn12.txt (brotli's tests/testdata) as one LF, ASCII text: Alice's
    prose paragraphs unwrapped, the play and the poem kept line by line, Gutenberg's 1992 preface to
    Paradise Lost dropped, runs of blank lines and spaces collapsed."""
    def norm(t: str) -> str:
        t = t.replace("\r\n", "\n").replace("\r", "\n").expandtabs(4)
        t = "\n".join(line.rstrip() for line in t.split("\n"))
        return re.sub(r"\n{3,}", "\n\n", t).strip() + "\n"

    paras = []
    for p in norm((testdata / "alice29.txt").read_text()).split("\n\n"):
        lines = p.split("\n")
        sep = " " if all(not line.startswith("   ") for line in lines) else "\n"  # poems are indented deeper
        paras.append(sep.join(line.strip() for line in lines))
    alice = re.sub(r"  +", " ", "\n\n".join(paras)).replace("`", "'")
    play = "\n".join(re.sub(r" {2,}", " ", line.strip())
                     for line in norm((testdata / "asyoulik.txt").read_text()).split("\n"))
    milton = norm((testdata / "plrabn12.txt").read_text())
    milton = "\n".join(line.strip() for line in milton[milton.index(PARTS[2]):].split("\n"))
    text = "\n\n".join([alice.strip(), play.strip(), milton.strip()]) + "\n"
    assert text.isascii()
    return text


def split(text: str, held_fraction: float = 0.05) -> tuple[list[bytes], list[bytes]]:
    """(train, held-out) byte strings: each work's last `held_fraction` is held out."""
    starts = [text.index(p) for p in PARTS] + [len(text)]
    train, held = [], []
    for a, b in zip(starts, starts[1:]):
        cut = a + int((b - a) * (1 - held_fraction))
        train.append(text[a:cut].encode())
        held.append(text[cut:b].encode())
    return train, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256, help="tokens per row (BOS + seq-1 bytes)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arch", choices=("demo", "lcsb-mid"), default="demo",
                    help="demo: the `demo` preset (the committed model); lcsb-mid: `toolchain bench lcsb`'s `mid` arch "
                         "(needs --out)")
    ap.add_argument("--out", type=Path, default=None, help="checkpoint directory (default for --arch demo: "
                                                          "toolchain/assets/demo_model)")
    ap.add_argument("--make-corpus", type=Path, default=None, metavar="TESTDATA_DIR",
                    help="first rebuild toolchain/assets/demo_corpus.txt from brotli's tests/testdata")
    args = ap.parse_args()
    if args.out is None:
        if args.arch != "demo":
            ap.error("--arch lcsb-mid needs --out (the committed demo model is not overwritten)")
        args.out = ASSETS / "demo_model"

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from safetensors.torch import save_file
    from transformers import Qwen2ForCausalLM

    from toolchain.models import get_preset
    from toolchain.text.tokenizer import ByteTokenizer

    if args.make_corpus is not None:
        CORPUS.write_text(make_corpus(args.make_corpus))
        print(f"wrote {CORPUS}")
    if args.steps < 1:
        return  # --steps 0: only (re)build the corpus
    text = CORPUS.read_text()
    train_parts, held_parts = split(text)
    tok = ByteTokenizer()
    train = torch.tensor(list(b"\n\n".join(train_parts)), dtype=torch.int64)
    if args.arch == "demo":
        arch = get_preset("demo")
    else:
        from toolchain.bench.lcsb import BENCH_ARCHS
        arch = BENCH_ARCHS["mid"]
    cfg = arch.to_hf_config()
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.BOS, tok.EOS, tok.PAD
    model = Qwen2ForCausalLM(cfg).float()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.arch}: {n_params / 1e6:.2f} M parameters; train {train.numel()} bytes, "
          f"held-out {sum(map(len, held_parts))} bytes")

    held_rows = []  # fixed held-out windows: BOS + seq-1 bytes, consecutive
    for part in held_parts:
        ids = list(part)
        for s in range(0, len(ids) - 1, args.seq - 1):
            held_rows.append([tok.BOS] + ids[s:s + args.seq - 1])

    def held_loss() -> float:
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for row in held_rows:
                x = torch.tensor([row])
                out = model(input_ids=x, labels=x)
                n = x.shape[1] - 1
                total += float(out.loss) * n
                count += n
        model.train()
        return total / count

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)
    bos = torch.full((args.batch, 1), tok.BOS, dtype=torch.int64)
    log, t0, running = [], time.perf_counter(), None
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, train.numel() - args.seq, (args.batch,), generator=gen)
        x = torch.cat([bos, torch.stack([train[s:s + args.seq - 1] for s in starts.tolist()])], dim=1)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        running = value if running is None else 0.98 * running + 0.02 * value
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            h = held_loss()
            entry = {"step": step + 1, "train_loss": round(running, 4), "held_out_loss": round(h, 4),
                     "seconds": round(time.perf_counter() - t0, 1)}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    seconds = time.perf_counter() - t0

    args.out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(args.out)  # config.json
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(sd, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "tokenizer.json").write_text(tok.to_json())
    (args.out / "train_log.json").write_text(json.dumps({
        "command": "scripts/pretrain_demo_model.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "make_corpus")),
        "parameters": n_params, "train_bytes": train.numel(), "held_out_bytes": sum(map(len, held_parts)),
        "final_train_loss": log[-1]["train_loss"], "final_held_out_loss": log[-1]["held_out_loss"],
        "seconds": round(seconds, 1), "threads": args.threads, "torch": torch.__version__, "log": log,
    }, indent=1) + "\n")
    print(f"wrote {args.out} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
