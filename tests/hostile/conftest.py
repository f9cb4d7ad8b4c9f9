from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))   # `import cases, harness`

from harness import export_tiny_program  # noqa: E402


@pytest.fixture(scope="session")
def tiny_program(tmp_path_factory) -> Path:
    """The tiny preset exported once per session (the program the cases corrupt)."""
    return export_tiny_program(tmp_path_factory.mktemp("hostile") / "tiny-program")
