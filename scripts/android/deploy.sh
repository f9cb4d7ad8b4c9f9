#!/usr/bin/env bash
# Push an exported program directory, the user's text (plain text, or chat JSONL) and the APK.
#   scripts/android/deploy.sh PROGRAM_DIR TEXT_FILE [--apk app.apk]
# Files land in /sdcard/Android/data/<package>/files/{programs/<dir name>,data}/ (the app's own external
# directory): the whole program directory (manifest.json, model.pte, weights.safetensors, which the app
# memory-maps, state_init.bin, the initial state it trains from, tokenizer.json, adapter_init/); the app
# checks their sha256s against the manifest before training and makes the rows from the text itself.
# Refuses, before touching the phone, a manifest other than schema_version 3 or a listed file missing.
source "$(dirname "$0")/common.sh"

[ $# -ge 2 ] || die "usage: deploy.sh PROGRAM_DIR TEXT_FILE [--apk APP.apk]"
program="${1%/}"; data="$2"; shift 2
apk=""
while [ $# -gt 0 ]; do
    case "$1" in
        --apk) apk="$2"; shift 2 ;;
        *) die "unknown option $1" ;;
    esac
done
[ -f "$program/manifest.json" ] || die "$program is not an exported program (no manifest.json); run 'toolchain export' first"
# The app runs manifest schema_version 3 (the layer loop: weights file, state.init_file); every file the
# manifest lists, the weights file and the initial state must be here, or the run would only fail on the
# phone, after the push.
"$PYTHON" - "$program" <<'PY' || exit 2
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
try:
    m = json.loads((d / "manifest.json").read_text())
except ValueError as e:
    sys.exit(f"Error: {d}/manifest.json is not valid JSON ({e}); export the program again")
v = m.get("schema_version") if isinstance(m, dict) else None
if v != 3:
    sys.exit(f"Error: {d} was exported with manifest schema_version {v}; the app runs version 3 (the layer loop): "
             "re-export the program with the current toolchain")
listed = (set(m.get("files") or {}) | {(m.get("state") or {}).get("init_file") or "state_init.bin"}
          | {(m.get("weights") or {}).get("file") or "weights.safetensors"})
missing = sorted(f for f in listed if not (d / f).is_file())
if missing:
    sys.exit(f"Error: {d} lacks {', '.join(missing)} (listed in manifest.json); export the program again")
PY
[ -f "$data" ] || die "$data does not exist"
name="$(basename "$program")"; safe "program name" "$name"; safe "data file name" "$(basename "$data")"
need_device

if [ -n "$apk" ]; then
    [ -f "$apk" ] || die "$apk does not exist"
    adb_ install -r "$apk" >&2
fi
adb_ shell mkdir -p "$REMOTE/programs/$name" "$REMOTE/data"
# Contents of the directory (not the directory itself), so re-deploying replaces files in place.
adb_ push "$program"/* "$REMOTE/programs/$name/" >&2
adb_ push "$data" "$REMOTE/data/$(basename "$data")" >&2
note "deployed program '$name' and text '$(basename "$data")' to $REMOTE"
echo "$name"
