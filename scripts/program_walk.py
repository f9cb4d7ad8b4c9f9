"""The walk of the program directory from `toolchain generate` to the kernel call, as docs/architecture.md counts it.

Runs `toolchain generate` in this process on a tiny exported program under `sys.setprofile` and records every call
of a function in toolchain/ that takes or returns the program directory: its path (str or Path), or an object whose
class is `ProgramDir`, `ProgramManifest` or the contract's `Manifest` (class names, so that the same script counts
an older tree: run it with PYTHONPATH at that tree). The walk ends at the first `execute` of a runtime (the kernel
call). A stop is a call in another file than the previous recorded call's; a return is a stop in a file already
visited.

    PYTHONPATH=. python scripts/program_walk.py [--program DIR] [--json]

Without --program, a tiny program (`toolchain export --model tiny --init random --target executorch`) is exported
into a temporary directory first (not traced).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

CLASSES = {"ProgramDir", "ProgramManifest", "Manifest"}


def _walk(program: Path) -> list[tuple[str, str]]:
    import toolchain
    from toolchain.cli import cli

    root = Path(toolchain.__file__).resolve().parent
    program = program.resolve()
    calls: list[tuple[str, str]] = []
    done = []

    paths: dict[str, bool] = {}
    files: dict[str, str | None] = {}

    def is_program(v) -> bool:
        if type(v).__name__ in CLASSES:
            return True
        if isinstance(v, (str, Path)) and v:
            key = str(v)
            if key not in paths:
                try:
                    paths[key] = Path(key).resolve() == program
                except (OSError, ValueError):
                    paths[key] = False
            return paths[key]
        return False

    def where(frame) -> str | None:
        f = frame.f_code.co_filename
        if f not in files:
            try:
                files[f] = str(Path(f).resolve().relative_to(root))
            except ValueError:
                files[f] = None
        return files[f]

    def profile(frame, event, arg) -> None:
        if done or event not in ("call", "return"):
            return
        rel = where(frame)
        if rel is None:
            return
        name = frame.f_code.co_name
        if event == "call" and name == "execute" and rel.startswith("runtime/") and rel.endswith("runtime.py"):
            calls.append((rel, name))
            done.append(True)
            return
        code = frame.f_code
        if event == "call":
            args = [frame.f_locals.get(a) for a in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
            hit = any(is_program(a) for a in args)
        else:
            hit = is_program(arg)
        if hit and (not calls or calls[-1] != (rel, name)):
            calls.append((rel, name))

    argv = ["generate", "--program", str(program), "--prompt-ids", "256,257", "--max-new-tokens", "1"]
    sys.setprofile(profile)
    try:
        cli.main(argv, standalone_mode=False)
    finally:
        sys.setprofile(None)
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        program = a.program
        if program is None:
            from toolchain.cli import cli

            program = Path(tmp) / "program"
            cli.main(["export", "--model", "tiny", "--init", "random", "--target", "executorch", "--out", str(program)],
                     standalone_mode=False)
        calls = _walk(program)
    stops, seen, returns = [], set(), 0
    for rel, name in calls:
        if stops and stops[-1][0] == rel:
            stops[-1][1].append(name)
            continue
        returns += rel in seen
        seen.add(rel)
        stops.append((rel, [name]))
    result = {"files": len(seen), "stops": len(stops), "returns": returns,
              "walk": [f"{rel} ({', '.join(dict.fromkeys(names))})" for rel, names in stops]}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print("\n".join(result["walk"]))
        print(f"{result['files']} files, {result['stops']} stops, {result['returns']} of them returns to a file "
              f"already left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
