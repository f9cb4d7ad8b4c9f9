# Shared by push_program.sh and pull_telemetry.sh (sourced, not run).
# The app's files live in its data container under Documents/ (ios/TrainerCore AppPaths.swift):
#   Documents/Programs/<name>/   exported program directories (manifest.json, model.pte, adapter_init/)
#   Documents/Data/<file>.jsonl  training rows
#   Documents/Telemetry/events.jsonl  every telemetry event, append-only
#   Documents/Adapters/<run_id>/ trained adapters (PEFT layout)
# Device access is `xcrun devicectl` (Xcode 15+); the device must be paired and unlocked, and the
# app installed (its data container exists only then).

IOS_BUNDLE_ID_DEFAULT="org.onphonellm.trainer"

die() {
    echo "Error: $*" >&2
    exit 2
}

need_xcrun() {
    command -v xcrun >/dev/null 2>&1 || die "xcrun not found; run this on a Mac with Xcode 15 or newer"
}

# Print the identifier of the one connected device, or fail asking for --device.
pick_device() {
    local json
    json="$(mktemp -t devicectl.XXXXXX)"
    if ! xcrun devicectl list devices --json-output "$json" >/dev/null 2>&1; then
        rm -f "$json"
        die "xcrun devicectl list devices failed; is Xcode 15+ installed and the phone paired?"
    fi
    local ids
    ids="$(python3 - "$json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
for d in data.get("result", {}).get("devices", []):
    state = d.get("connectionProperties", {}).get("tunnelState", "")
    if d.get("hardwareProperties", {}).get("platform", "iOS") == "iOS" and state != "unavailable":
        print(d.get("identifier", ""))
PY
)"
    rm -f "$json"
    local n
    n="$(printf '%s\n' "$ids" | grep -c .)"
    [ "$n" = 0 ] && die "no connected iPhone found (xcrun devicectl list devices); connect and unlock it, or pass --device"
    [ "$n" != 1 ] && die "$n devices connected; choose one with --device ID (xcrun devicectl list devices)"
    printf '%s\n' "$ids"
}

# devicectl_copy to|from DEVICE BUNDLE SOURCE DESTINATION (DRY_RUN=1: print the command instead)
devicectl_copy() {
    local direction="$1" device="$2" bundle="$3" source="$4" destination="$5"
    local cmd=(xcrun devicectl device copy "$direction" --device "$device"
               --domain-type appDataContainer --domain-identifier "$bundle"
               --source "$source" --destination "$destination")
    if [ "${DRY_RUN:-0}" = 1 ]; then
        printf '%q ' "${cmd[@]}"
        echo
    else
        "${cmd[@]}"
    fi
}
