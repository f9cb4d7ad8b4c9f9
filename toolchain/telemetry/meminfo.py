"""`adb shell dumpsys meminfo <package>` output -> telemetry `memory` events (probe android_dumpsys).

Reads the human-readable tables of Android 4.3 to 16 and the `--checkin` / `-c` CSV lines (versions 3
and 4), one block per process, and takes for each process the TOTAL row: anon_bytes = Private Dirty,
pss_bytes = TOTAL PSS, rss_bytes = TOTAL RSS (Android 10+), swap_bytes = TOTAL SWAP PSS / SWAP (KB).
The App Summary's `TOTAL PSS:` / `TOTAL RSS:` line wins over the table's TOTAL row where both exist
(on the Android 11 sample the table's Rss Total column repeats the PSS). kB x 1024 = bytes.

Usage:
    adb shell dumpsys meminfo org.onphonellm.trainer | \
        scripts/android/meminfo_to_telemetry.py --run-id RUN --seq 1000000000000 [--process NAME] [--step N] \
        >> events.jsonl

Standard library only, so the script runs with any python3 from the repository (sample_meminfo.sh);
`toolchain telemetry import` validates the events.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass

__all__ = ["MeminfoTotals", "parse_meminfo", "to_event", "HOST_SEQ_BASE"]

# Host-side samples share the app's run_id (so the report plots them with the app's own probes) but
# number their events from here, far above any seq the app reaches, so the two never collide.
HOST_SEQ_BASE = 10**12

_BLOCK = re.compile(r"^\*\* MEMINFO in pid (\d+) \[([^\]]*)\] \*\*", re.M)
_SUMMARY = {"pss": re.compile(r"TOTAL(?: PSS)?:\s+(\d+)"), "rss": re.compile(r"TOTAL RSS:\s+(\d+)"),
            "swap": re.compile(r"TOTAL SWAP(?: PSS| \(KB\)):\s+(\d+)")}


@dataclass(frozen=True)
class MeminfoTotals:
    """One process's totals, in kB as dumpsys prints them (None: not in this format)."""

    pid: int
    process: str
    pss_kb: int
    private_dirty_kb: int
    rss_kb: int | None
    swap_kb: int | None


def _columns(dash_line: str, head1: str, head2: str) -> list[str]:
    """Column names from the two header lines above the `------` line (columns are right-aligned to
    the dashes): ["Pss Total", "Private Dirty", ...] or, on Android 4.3, ["Pss", "Shared Dirty", ...]."""
    names, start = [], 0
    for m in re.finditer(r"-+", dash_line):
        words = [h[start:m.end()].strip() for h in (head1, head2)]
        names.append(" ".join(w for w in words if w))
        start = m.end()
    return names


def _parse_table(block: str) -> dict[str, int] | None:
    lines = block.splitlines()
    for i, line in enumerate(lines):
        if i >= 2 and re.fullmatch(r"\s*-{3,}(\s+-{3,})+\s*", line):
            cols = _columns(line, lines[i - 2], lines[i - 1])
            break
    else:
        return None
    for line in lines[i + 1:]:
        m = re.match(r"\s*TOTAL\s+(\d[\d\s]*)$", line.rstrip())
        if m:
            return dict(zip(cols, (int(v) for v in m.group(1).split())))
    return None


def _first(table: dict[str, int], *names: str) -> int | None:
    return next((table[n] for n in names if n in table), None)


def _parse_human(pid: int, process: str, block: str) -> MeminfoTotals | None:
    table = _parse_table(block)
    if table is None:
        return None
    summary = {k: (int(m.group(1)) if (m := rx.search(block)) else None) for k, rx in _SUMMARY.items()}
    pss = summary["pss"] if summary["pss"] is not None else _first(table, "Pss Total", "Pss")
    dirty = _first(table, "Private Dirty")
    if pss is None or dirty is None:
        return None
    rss = summary["rss"] if summary["rss"] is not None else _first(table, "Rss Total")
    swap = summary["swap"] if summary["swap"] is not None else _first(table, "SwapPss Dirty", "Swap Dirty", "Swapped Dirty")
    return MeminfoTotals(pid, process, pss, dirty, rss, swap)


def _parse_checkin(line: str) -> MeminfoTotals | None:
    """`dumpsys meminfo --checkin` line: version,pid,name, then groups of [native, dalvik, other, total]:
    max, alloc, free, pss, swappable pss, shared dirty, shared clean, private dirty, private clean
    (version 3 stops there), swapped out, swapped-out pss (version 4)."""
    f = line.strip().split(",")
    if len(f) < 3 + 4 * 9 or f[0] not in ("3", "4") or not f[1].isdigit():
        return None

    def total(group: int) -> int | None:
        v = f[3 + 4 * group + 3]
        return int(v) if v.isdigit() else None

    pss, dirty = total(3), total(7)
    if pss is None or dirty is None:
        return None
    swap = total(10) if f[0] == "4" and len(f) > 3 + 4 * 11 else None
    if swap is None and f[0] == "4" and len(f) > 3 + 4 * 10:
        swap = total(9)
    return MeminfoTotals(int(f[1]), f[2], pss, dirty, None, swap)


def parse_meminfo(text: str) -> list[MeminfoTotals]:
    """Every process block found in `text` (an empty list: no per-process table, e.g. 'No process found')."""
    text = text.replace("\r\n", "\n")
    out: list[MeminfoTotals] = []
    heads = list(_BLOCK.finditer(text))
    for k, m in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(text)
        totals = _parse_human(int(m.group(1)), m.group(2), text[m.start():end])
        if totals:
            out.append(totals)
    if not heads:
        out.extend(t for line in text.splitlines() if (t := _parse_checkin(line)))
    return out


def to_event(t: MeminfoTotals, run_id: str, seq: int, timestamp: float, step: int | None = None) -> dict:
    event = {"schema_version": 1, "type": "memory", "run_id": run_id, "seq": seq, "timestamp": round(timestamp, 3),
             "probe": "android_dumpsys", "anon_bytes": t.private_dirty_kb * 1024, "pss_bytes": t.pss_kb * 1024}
    if t.rss_kb is not None:
        event["rss_bytes"] = t.rss_kb * 1024
    if t.swap_kb is not None:
        event["swap_bytes"] = t.swap_kb * 1024
    if step is not None:
        event["step"] = step
    return event


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", nargs="?", default="-", help="dumpsys output (default: stdin)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--seq", type=int, required=True, help=f"seq of the event (host samples: from {HOST_SEQ_BASE})")
    p.add_argument("--process", help="process name to report (default: the package's main process, else the first)")
    p.add_argument("--step", type=int)
    p.add_argument("--timestamp", type=float, help="Unix seconds (default: now)")
    a = p.parse_args(argv)
    text = sys.stdin.read() if a.file == "-" else open(a.file, encoding="utf-8", errors="replace").read()
    blocks = parse_meminfo(text)
    if a.process:
        blocks = [b for b in blocks if b.process == a.process]
    else:  # `dumpsys meminfo --package` lists every process; the main one has no ':suffix'
        blocks = sorted(blocks, key=lambda b: ":" in b.process)
    if not blocks:
        print(f"meminfo_to_telemetry: no per-process TOTAL found{' for ' + a.process if a.process else ''}", file=sys.stderr)
        return 1
    event = to_event(blocks[0], a.run_id, a.seq, a.timestamp if a.timestamp is not None else time.time(), a.step)
    print(json.dumps(event, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
