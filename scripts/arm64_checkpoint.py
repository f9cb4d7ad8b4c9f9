"""Write a random checkpoint of the `tiny` preset's size in another model family, for `toolchain export --model DIR`
(the presets of the Qwen3 and Llama families are full-size; scripts/check_arm64.sh exports one small program of
each to run on the aarch64 runtime).

    python scripts/arm64_checkpoint.py --family qwen3|llama OUT_DIR [--seed N]

OUT_DIR gets config.json (the family's transformers config) and model.safetensors (the toolchain's seeded random
weights, `random_weights`), as a Hugging Face checkpoint directory. The shapes: the `tiny` preset's (hidden 64,
8 layers, 4 heads over 2 kv heads, intermediate 192, vocab 264) with what the family changes: Qwen3 q/k norms, no
q/k/v biases and head_dim 32 (so q_proj is [128, 64], not hidden / heads = 16 wide); Llama no biases, rms_eps
1e-5, rope theta 500000 with the llama3 rope scaling (original context 16, shorter than the sequences, so every
frequency band is used) and an untied head.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tiny_arch(family: str):
    from toolchain.models import RopeScaling
    from toolchain.models.presets import get_preset

    tiny = get_preset("tiny")
    if family == "qwen3":
        return dataclasses.replace(tiny, family="qwen3", head_dim=32, qkv_bias=False, qk_norm=True)
    if family == "llama":
        return dataclasses.replace(tiny, family="llama", qkv_bias=False, qk_norm=False, rms_eps=1e-5,
                                   rope_theta=500_000.0, tie_embeddings=False,
                                   rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                            original_max_positions=16))
    raise SystemExit(f"Error: --family must be qwen3 or llama, got {family!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", required=True)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from safetensors.torch import save_file

    from toolchain.models.family import get_family
    from toolchain.models.load import random_weights, state_dict_from_weights

    arch = tiny_arch(a.family)
    fam = get_family(arch.family)
    fam.check(arch)
    if a.out.exists() and any(a.out.iterdir()):
        print(f"Error: {a.out} exists and is not empty")
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    fam.hf_config(arch).to_json_file(str(a.out / "config.json"))
    sd = {k: v.contiguous() for k, v in state_dict_from_weights(random_weights(arch, seed=a.seed)).items()}
    save_file(sd, str(a.out / "model.safetensors"), metadata={"format": "pt"})
    print(f"{a.family} checkpoint ({arch.layers} layers, hidden {arch.hidden}, head_dim {arch.head_dim}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
