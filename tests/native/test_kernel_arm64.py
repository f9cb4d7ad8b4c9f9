"""The arm64 builds of the int4 kernel (NEON, as the apps compile it, and the generic path), cross-compiled
and run under qemu-aarch64 by scripts/check_kernel_arm64.sh on ~300 random shapes: each output within the
float32 dot-product bound of a float64 reference, and equal to this host's x86 kernel bit for bit (the
kernel sums in the same order with FMA on every target, kernels.cpp; GCC both sides here).

The script installs g++-aarch64-linux-gnu and qemu-user from Debian's packages when they are missing
(about 35 s once); skipped when they are missing and cannot be installed. About 20 s with them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_kernel_arm64.sh"
SKIP = 77


def test_arm64_kernel_holds_the_float32_bound_under_qemu():
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=1800, env=env)
    out = done.stdout + done.stderr
    if done.returncode == SKIP:
        reason = next((line for line in out.splitlines() if "skipped:" in line), out.strip()[-300:])
        pytest.skip(f"no arm64 cross tools: {reason}")
    print(out)
    assert done.returncode == 0, out[-3000:]
    held = re.findall(r"\((NEON|generic) path\): float32 bound held on (\d+)/(\d+) cases", out)
    assert sorted(p for p, _, _ in held) == ["NEON", "generic"], out[-3000:]
    assert all(n == total and int(n) > 0 for _, n, total in held), out[-3000:]
    equal = re.findall(r"bitwise equal to x86 on (\d+)/(\d+) cases", out)
    assert len(equal) == 2 and all(n == total for n, total in equal), out[-3000:]
