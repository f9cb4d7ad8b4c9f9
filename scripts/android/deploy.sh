#!/usr/bin/env bash
# Push an exported program directory, a JSONL data file and (optionally) a step plan and the APK.
#   scripts/android/deploy.sh PROGRAM_DIR DATA.jsonl [--plan PLAN.json] [--apk app.apk]
# Files land in /sdcard/Android/data/<package>/files/{programs/<dir name>,data,plans}/ (the app's own
# external directory); the app checks the program's sha256s against its manifest before training.
source "$(dirname "$0")/common.sh"

[ $# -ge 2 ] || die "usage: deploy.sh PROGRAM_DIR DATA.jsonl [--plan PLAN.json] [--apk APP.apk]"
program="${1%/}"; data="$2"; shift 2
plan=""; apk=""
while [ $# -gt 0 ]; do
    case "$1" in
        --plan) plan="$2"; shift 2 ;;
        --apk) apk="$2"; shift 2 ;;
        *) die "unknown option $1" ;;
    esac
done
[ -f "$program/manifest.json" ] || die "$program is not an exported program (no manifest.json); run 'toolchain export' first"
[ -f "$data" ] || die "$data does not exist"
[ -z "$plan" ] || [ -f "$plan" ] || die "$plan does not exist"
name="$(basename "$program")"; safe "program name" "$name"; safe "data file name" "$(basename "$data")"
need_device

if [ -n "$apk" ]; then
    [ -f "$apk" ] || die "$apk does not exist"
    adb_ install -r "$apk" >&2
fi
adb_ shell mkdir -p "$REMOTE/programs/$name" "$REMOTE/data" "$REMOTE/plans"
# Contents of the directory (not the directory itself), so re-deploying replaces files in place.
adb_ push "$program"/* "$REMOTE/programs/$name/" >&2
adb_ push "$data" "$REMOTE/data/$(basename "$data")" >&2
[ -z "$plan" ] || adb_ push "$plan" "$REMOTE/plans/$(basename "$plan")" >&2
note "deployed program '$name' and data '$(basename "$data")' to $REMOTE"
echo "$name"
