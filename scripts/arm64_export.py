"""`toolchain export` with every weight matmul delegated to XNNPACK, for the aarch64 runtime check
(scripts/check_arm64.sh): a small program's matmuls are all below the exporter's delegation threshold
(toolchain/export/executorch.py `XNNPACK_MIN_FLOPS`, 16 MFLOP), so without this a tiny `--compute fp16` program
would run its float16 products in ExecuTorch's own kernels and never reach XNNPACK's f16 GEMMs, which are what
an fp16 program runs on a phone. The threshold is set to 0 as tests/export/test_compute_fp16.py does; every
other option is the CLI's.

    python scripts/arm64_export.py --model tiny --init random --compute fp16 ... --out DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import toolchain.export.executorch as et  # noqa: E402
from toolchain.cli import cli  # noqa: E402

if __name__ == "__main__":
    et.XNNPACK_MIN_FLOPS = 0.0
    cli(["export", *sys.argv[1:]])
