#!/usr/bin/env bash
# Sample `dumpsys meminfo <package>` while training and append telemetry `memory` events
# (probe android_dumpsys) for the run to a JSONL file, for `toolchain telemetry import`.
#   scripts/android/sample_meminfo.sh --run-id ID --out FILE [--interval S] [--count N] [--tries N] [--until-gone]
# Without --count it samples until interrupted (or, with --until-gone, until the app's process has been
# gone for 3 samples in a row). Events are numbered from 10^12 (or after the last one already in FILE),
# far above the app's own seqs, so host and app events of one run never collide.
source "$(dirname "$0")/common.sh"

run_id=""; out=""; interval=2; count=0; tries=0; until_gone=0
while [ $# -gt 0 ]; do
    case "$1" in
        --run-id) run_id="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --interval) interval="$2"; shift 2 ;;
        --count) count="$2"; shift 2 ;;
        --tries) tries="$2"; shift 2 ;;
        --until-gone) until_gone=1; shift ;;
        *) die "unknown option $1" ;;
    esac
done
[ -n "$run_id" ] && [ -n "$out" ] || die "usage: sample_meminfo.sh --run-id ID --out FILE [--interval S] [--count N] [--until-gone]"
[[ "$count" =~ ^[0-9]+$ ]] && [[ "$tries" =~ ^[0-9]+$ ]] || die "--count and --tries must be numbers"
need_device
seq="$("$PYTHON" - "$out" <<'PY'
import json, sys
base = 10**12
try:
    lines = [l for l in open(sys.argv[1]) if l.strip()]
    print(max([base - 1] + [json.loads(l)["seq"] for l in lines]) + 1)
except FileNotFoundError:
    print(base)
PY
)"
n=0; misses=0; seen=0; tried=0
while :; do
    tried=$((tried + 1))
    text="$(adb_ shell dumpsys meminfo "$PKG" 2>/dev/null || true)"
    if event="$(printf '%s\n' "$text" | "$PYTHON" "$HERE/meminfo_to_telemetry.py" --run-id "$run_id" --seq "$seq" 2>/dev/null)"; then
        printf '%s\n' "$event" >> "$out"
        seq=$((seq + 1)); n=$((n + 1)); misses=0; seen=1
    else
        misses=$((misses + 1))
    fi
    [ "$count" -gt 0 ] && [ "$n" -ge "$count" ] && break
    [ "$tries" -gt 0 ] && [ "$tried" -ge "$tries" ] && break
    [ $until_gone = 1 ] && [ $seen = 1 ] && [ $misses -ge 3 ] && break
    sleep "$interval"
done
note "$n dumpsys samples -> $out"
