#!/usr/bin/env bash
# Let the phone reach `toolchain telemetry serve` on this machine at http://127.0.0.1:PORT over USB.
#   scripts/android/reverse.sh [PORT]            (default 8765)
#   scripts/android/reverse.sh --remove [PORT]
source "$(dirname "$0")/common.sh"
remove=0
[ "${1:-}" = --remove ] && { remove=1; shift; }
port="${1:-8765}"
[[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number, got '$port'"
need_device
if [ $remove = 1 ]; then
    adb_ reverse --remove "tcp:$port"
    note "removed adb reverse tcp:$port"
else
    adb_ reverse "tcp:$port" "tcp:$port" >/dev/null
    note "phone's 127.0.0.1:$port -> this machine's 127.0.0.1:$port"
    echo "http://127.0.0.1:$port/v1/events"
fi
