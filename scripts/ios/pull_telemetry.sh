#!/usr/bin/env bash
# Pull the iOS app's telemetry (and trained adapters) to this Mac, ready for the host tools.
#
#   scripts/ios/pull_telemetry.sh [--out DIR] [--adapters] [--db FILE] [--device ID] [--bundle-id ID]
#
# Copies Documents/Telemetry/events.jsonl to DIR/events.jsonl (default DIR: ./ios-pull) with
# `xcrun devicectl device copy from`; --adapters also copies Documents/Adapters to DIR/adapters.
# --db FILE then runs `toolchain telemetry import DIR/events.jsonl --db FILE` (toolchain on PATH).
set -euo pipefail
# shellcheck source=scripts/ios/common.sh
source "$(dirname "$0")/common.sh"

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

out="ios-pull"
adapters=0
db=""
device="${IOS_DEVICE:-}"
bundle="${IOS_BUNDLE_ID:-$IOS_BUNDLE_ID_DEFAULT}"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --adapters) adapters=1; shift ;;
        --db) db="${2:?--db needs a file}"; shift 2 ;;
        --device) device="${2:?--device needs an id}"; shift 2 ;;
        --bundle-id) bundle="${2:?--bundle-id needs a value}"; shift 2 ;;
        -h|--help) usage 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

need_xcrun
[ -n "$device" ] || device="$(pick_device)"
mkdir -p "$out"
tmp="$out/.events.jsonl.partial"
rm -f "$tmp"
if ! devicectl_copy from "$device" "$bundle" "Documents/Telemetry/events.jsonl" "$tmp" >/dev/null || [ ! -f "$tmp" ]; then
    rm -f "$tmp"
    die "no telemetry on the device yet (Documents/Telemetry/events.jsonl of $bundle); train once, then pull"
fi
mv "$tmp" "$out/events.jsonl"
lines="$(grep -c . "$out/events.jsonl" || true)"
echo "pulled $lines event(s) to $out/events.jsonl"
if [ "$adapters" = 1 ]; then
    if devicectl_copy from "$device" "$bundle" "Documents/Adapters" "$out/adapters" >/dev/null; then
        echo "pulled trained adapters to $out/adapters"
    else
        echo "no trained adapters on the device yet" >&2
    fi
fi
if [ -n "$db" ]; then
    command -v toolchain >/dev/null 2>&1 || die "toolchain not on PATH; activate the project's venv, or import by hand"
    toolchain telemetry import "$out/events.jsonl" --db "$db"
else
    echo "next: toolchain telemetry import $out/events.jsonl --db runs.sqlite3"
fi
