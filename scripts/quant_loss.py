"""Held-out loss of a model as an int4 program stores it: float32, int4 layers with a float32 embedding/head,
int4 everywhere (the default of `toolchain export --quant int4` since the int4 head), and int4 everywhere
with the activations of every int4 projection rounded to int8 per group (W4A8: what the fused generation
methods compute, `quant.int4_linear_a8_reference`), side by side.

    .venv/bin/python scripts/quant_loss.py [--model demo] [--group 64] [--seq-len 256] [--json OUT]

The loss is the eager MeSP forward (`mesp.step.model_loss`) on exactly the tensors the weights file holds
(`export/weights_file.weight_tensors` -> `model_weights`), the initial (untrained) LoRA of the demo (B = 0),
over the demo's held-out user text (toolchain/assets/user_text_held_out.txt) cut into seq-len windows as
`toolchain data` cuts it, and the user text itself: mean next-token cross-entropy, nats per token (byte).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def w4a8_loss(arch, weights, cfg, lora, input_ids, labels):
    """`model_loss` as the fused generation methods compute it: every int4 projection, the LM head included
    (as head_logits_fused computes it, one int4 matmul), through `toolchain::int4_linear_a8`'s reference."""
    import torch
    import torch.nn.functional as F

    from toolchain.mesp.block import block_forward
    from toolchain.mesp.block import block_rope
    from toolchain.mesp.ops import rmsnorm_forward
    from toolchain.mesp.ops.ce_chunked import IGNORE_INDEX, shift_labels
    from toolchain.mesp.ops.compute import Compute
    from toolchain.mesp.ops.quant import embedding_rows, matmul_xwt
    from toolchain.mesp.step import block_params

    fused = Compute(fused=True)
    rope = block_rope(arch, torch.arange(input_ids.shape[0]), weights.final_norm.dtype)
    x = embedding_rows(weights.embed, input_ids)
    for i in range(arch.layers):
        x = block_forward(x, block_params(arch, weights, cfg, lora, i)._replace(compute=fused), rope, None)
    hn, _ = rmsnorm_forward(x, weights.final_norm, arch.rms_eps)
    logits = matmul_xwt(hn, weights.lm_head, fused)                                    # [T, V]
    return F.cross_entropy(logits, shift_labels(labels), ignore_index=IGNORE_INDEX)


def main() -> None:
    import torch

    from toolchain.demo import USER_HELD_OUT, USER_TEXT
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.mesp.step import model_loss
    from toolchain.models import load_model
    from toolchain.program.spec import QuantSpec
    from toolchain.program.weights_file import model_weights, weight_tensors
    from toolchain.text.text_data import read_text, text_rows
    from toolchain.text.tokenizer import ByteTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    arch, weights = load_model(a.model)
    cfg = LoraConfig(rank=8, alpha=16)
    lora = init_lora(arch, cfg, seed=0)
    tok = ByteTokenizer()
    texts = {"held_out": USER_HELD_OUT, "user_text": USER_TEXT}
    variants = {"float32": QuantSpec("none"), "int4 layers, float32 head": QuantSpec("int4", a.group, head=False),
                "int4 layers + int4 embedding/head": QuantSpec("int4", a.group),
                "int4 everywhere, W4A8 (generation)": QuantSpec("int4", a.group)}
    out = {"model": a.model, "group": a.group, "seq_len": a.seq_len, "losses": {}}
    with torch.no_grad():
        for name, quant in variants.items():
            w = model_weights(weight_tensors(weights, quant), arch, quant)
            row = {}
            for tname, path in texts.items():
                rows = text_rows(read_text(path), tok, a.seq_len)
                total, n = 0.0, 0
                for r in rows:
                    ids = torch.tensor(r["input_ids"])
                    labels = torch.tensor(r.get("labels", r["input_ids"]))
                    k = int((labels[1:] != -100).sum())
                    loss = w4a8_loss if "W4A8" in name else model_loss
                    total += float(loss(arch, w, cfg, lora, ids, labels)) * k
                    n += k
                row[tname] = round(total / n, 5)
            out["losses"][name] = row
    base = out["losses"]["float32"]
    print(f"{'weights':36s} " + " ".join(f"{t:>22s}" for t in texts))
    for name, row in out["losses"].items():
        print(f"{name:36s} " + " ".join(f"{row[t]:10.4f} ({row[t] - base[t]:+.4f})" for t in texts))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
