#!/usr/bin/env bash
# Pull a run's telemetry log and trained adapter (and refused events, if any) from the phone.
#   scripts/android/pull.sh --run-id ID [--out DIR]        (default DIR: android-runs/ID)
# DIR/telemetry.jsonl goes to `toolchain telemetry import`; DIR/adapter/ is a PEFT adapter directory.
source "$(dirname "$0")/common.sh"

run_id=""; out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --run-id) run_id="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) die "unknown option $1" ;;
    esac
done
[ -n "$run_id" ] || die "usage: pull.sh --run-id ID [--out DIR]"
safe run-id "$run_id"
out="${out:-android-runs/$run_id}"
need_device
mkdir -p "$out"
remote="$REMOTE/runs/$run_id"
adb_ pull "$remote/telemetry.jsonl" "$out/telemetry.jsonl" >&2 || die "no telemetry for run $run_id on the phone ($remote)"
if adb_ shell ls "$remote/adapter/adapter_model.safetensors" >/dev/null 2>&1; then
    rm -rf "$out/adapter"
    adb_ pull "$remote/adapter" "$out/" >&2
else
    note "run $run_id has no adapter yet (it is written when the run completes)"
fi
adb_ pull "$remote/rejected.jsonl" "$out/rejected.jsonl" >/dev/null 2>&1 || true
note "pulled run $run_id -> $out"
echo "$out"
