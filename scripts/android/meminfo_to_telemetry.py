#!/usr/bin/env python3
"""Entry for sample_meminfo.sh: `toolchain.telemetry.meminfo` (dumpsys meminfo -> telemetry `memory` events),
run from the repository without installing it (that module uses the standard library only)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from toolchain.telemetry.meminfo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
