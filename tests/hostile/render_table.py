"""Print the hostile-input table with each case's result (markdown, for docs/reliability.md), then the kernel
cache table (tests/hostile/kernel_cases.py).

    .venv/bin/python tests/hostile/render_table.py > /tmp/table.md
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402
from cases import CASES  # noqa: E402
from harness import export_tiny_program, run_case  # noqa: E402
from kernel_cases import KCASES, good_build, run_kcase  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        program = export_tiny_program(Path(root) / "tiny-program")
        rows, bad = [], 0
        for i, case in enumerate(CASES):
            work = Path(root) / f"case-{i}"
            work.mkdir()
            got = run_case(case, program, work, pytest.MonkeyPatch())
            ok = (got.code == 2 and len(got.errors) == 1 and case.expect in got.errors[0] and not got.traceback
                  and not (got.left or got.lost or got.changed))
            bad += not ok
            error = got.errors[0] if got.errors else "(none)"
            error = error.replace(root, "…").replace("|", "\\|")
            rows.append(f"| `{case.id}` | {case.what} | {got.code} | {'yes' if got.traceback else 'no'} | "
                        f"{len(got.left) + len(got.lost) + len(got.changed)} | {error} |")
    print("| case | hostile input | exit | traceback | files left/lost/changed | the one stderr line |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{len(CASES)} cases, {len(CASES) - bad} as required (exit 2, one Error line, no traceback, no file "
          f"left, lost or changed), {bad} not.")

    kernel_table()


def kernel_table() -> None:
    import shutil

    built = good_build()
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as root:
        good = Path(root) / "good" / built.parent.name / built.name
        good.parent.mkdir(parents=True)
        shutil.copy2(built, good)
        for i, case in enumerate(KCASES):
            work = Path(root) / f"k-{i}"
            work.mkdir()
            got = run_kcase(case, good, work, pytest.MonkeyPatch())
            bad += not got.ok
            summary = got.summary.replace(root, "…").replace("|", "\\|")
            rows.append(f"| `{case.id}` | {case.what} | {'yes' if got.ok else 'NO: ' + got.detail} | {summary} |")
    print("\n| case | kernel cache state or fault | as required | what happened |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{len(KCASES)} kernel cache cases, {len(KCASES) - bad} as required, {bad} not.")


if __name__ == "__main__":
    main()
