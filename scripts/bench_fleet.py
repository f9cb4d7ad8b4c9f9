"""Time `toolchain telemetry fleet` on a generated fleet: N runs of `baseline_run` shape (40 steps, memory samples,
eval events: ~130 events a run) in a new SQLite store, then the fleet page with every run's report.

    PYTHONPATH=. .venv/bin/python scripts/bench_fleet.py --runs 10000 [--keep DIR]

Prints the store's size, the wall and CPU time of the fleet command (a child process) and its peak RSS.
docs/telemetry.md quotes its result.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "telemetry"))

from telemetry_samples import baseline_run  # noqa: E402

from toolchain.telemetry.store import EventStore  # noqa: E402

DEVICES = ("Pixel 8", "Pixel 6a", "iPhone 15", "Galaxy S23", "host")


def generate(db: Path, runs: int) -> int:
    n = 0
    with EventStore(db) as store:
        batch = []
        for i in range(runs):
            events = baseline_run(f"run-{i:06d}")
            for e in events:
                e["timestamp"] += 1767225600.0 + 60.0 * i
                if e["type"] == "run_start":
                    e["device_model"] = DEVICES[i % len(DEVICES)]
            batch.append(events)
            n += len(events)
            if len(batch) == 200:
                store.add_batches(batch)
                batch = []
        if batch:
            store.add_batches(batch)
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--keep", type=Path, default=None, help="Write the store and the fleet here (kept).")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    root.mkdir(parents=True, exist_ok=True)
    db = root / "fleet.sqlite3"
    t0 = time.perf_counter()
    events = generate(db, args.runs)
    print(f"generated {args.runs} runs, {events} events, {db.stat().st_size / 2**20:.0f} MiB in "
          f"{time.perf_counter() - t0:.0f} s")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "toolchain", "telemetry", "fleet", "--db", str(db), "--out",
                           str(root / "fleet")], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    pages = sum(1 for _ in (root / "fleet" / "runs").iterdir())
    print(f"{proc.stdout.strip()}\nfleet: {wall:.0f} s wall, {cpu:.0f} s CPU ({cpu / args.runs * 1000:.1f} ms CPU a "
          f"run), peak RSS {after.ru_maxrss / 1024:.0f} MiB, {pages} run pages")


if __name__ == "__main__":
    main()
