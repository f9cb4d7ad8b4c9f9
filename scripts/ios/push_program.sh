#!/usr/bin/env bash
# Copy an exported program directory (and optionally a text or chat file) into the iOS app.
#
#   scripts/ios/push_program.sh PROGRAM_DIR [--name NAME] [--data FILE.txt|FILE.jsonl] [--device ID] [--bundle-id ID]
#
# PROGRAM_DIR is what `toolchain export` wrote (manifest.json with schema_version 3, model.pte and/or
# coreml/<method>.mlpackage, weights.safetensors, state_init.bin, tokenizer.json, adapter_init/). It lands
# in Documents/Programs/NAME (default: the directory's name), each file copied with `xcrun devicectl
# device copy to`. The data file (plain text, or a chat .jsonl) lands in Documents/Data/, where the app's
# file picker finds it. --dry-run prints the commands instead of running them.
set -euo pipefail
# shellcheck source=scripts/ios/common.sh
source "$(dirname "$0")/common.sh"

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

program=""
name=""
data=""
device="${IOS_DEVICE:-}"
bundle="${IOS_BUNDLE_ID:-$IOS_BUNDLE_ID_DEFAULT}"
DRY_RUN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --name) name="${2:?--name needs a value}"; shift 2 ;;
        --data) data="${2:?--data needs a file}"; shift 2 ;;
        --device) device="${2:?--device needs an id}"; shift 2 ;;
        --bundle-id) bundle="${2:?--bundle-id needs a value}"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$program" ] || die "one program directory at a time"; program="$1"; shift ;;
    esac
done
[ -n "$program" ] || usage
[ -d "$program" ] || die "$program is not a directory; give the directory \`toolchain export\` wrote"
[ -f "$program/manifest.json" ] || die "$program has no manifest.json; run \`toolchain export\` first"
program="$(cd "$program" && pwd)"
name="${name:-$(basename "$program")}"
case "$name" in */*|.*|"") die "program name '$name' must be a plain directory name" ;; esac
[ -z "$data" ] || [ -f "$data" ] || die "data file $data does not exist"

# The app runs manifest schema_version 3 only; the program file(s), the per-method Core ML
# packages, the weights file, the initial state, the tokenizer, the initial adapter and every
# checksummed file the manifest lists must be there before copying.
python3 - "$program/manifest.json" <<'PY' || exit 2
import json, os, sys
path = sys.argv[1]
root = os.path.dirname(path)
try:
    m = json.load(open(path))
except ValueError as e:
    sys.exit(f"Error: {path} is not JSON ({e}); re-export the program")
if m.get("schema_version") != 3:
    sys.exit(f"Error: {path} has schema_version {m.get('schema_version')}; the app runs schema_version 3 ("
             "layer-generic methods, weights.safetensors): re-export the program with the current toolchain")
tok = m.get("tokenizer") or {}
if tok.get("kind") in (None, "none"):
    sys.exit(f"Error: {path} has no tokenizer (kind {tok.get('kind')!r}); the app turns your text into rows with the "
             "program's tokenizer: re-export the program with one")
listed = [p["file"] for p in m.get("programs", [])]
listed += [f for p in m.get("programs", []) for f in (p.get("methods") or {}).values()]
listed += [m["weights"]["file"]] if isinstance(m.get("weights"), dict) and "file" in m["weights"] else ["weights.safetensors"]
listed += [m["state"]["init_file"]] if isinstance(m.get("state"), dict) and "init_file" in m["state"] else ["state_init.bin"]
if tok.get("file"):
    listed.append(tok["file"])
init_dir = (m.get("adapter") or {}).get("init_dir", "adapter_init")
listed += [f"{init_dir}/adapter_config.json", f"{init_dir}/adapter_model.safetensors"]
listed += list(m.get("files", {}))
missing = [f for f in listed if not os.path.exists(os.path.join(root, f))]
if missing:
    sys.exit(f"Error: {root} lacks {', '.join(sorted(set(missing)))} (listed in manifest.json); re-export the program")
PY

[ "$DRY_RUN" = 1 ] || need_xcrun
[ -n "$device" ] || device="$(pick_device)"
count=0
while IFS= read -r -d '' file; do
    rel="${file#"$program"/}"
    devicectl_copy to "$device" "$bundle" "$file" "Documents/Programs/$name/$rel"
    count=$((count + 1))
done < <(find "$program" -type f -not -name '.*' -print0 | sort -z)
if [ -n "$data" ]; then
    devicectl_copy to "$device" "$bundle" "$data" "Documents/Data/$(basename "$data")"
fi
[ "$DRY_RUN" = 1 ] && exit 0
echo "copied $count file(s) of $name to $bundle on $device${data:+, and $(basename "$data")}"
