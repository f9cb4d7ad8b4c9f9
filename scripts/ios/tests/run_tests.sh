#!/usr/bin/env bash
# Tests of scripts/ios/*.sh against a fake `xcrun` (tests/fake-xcrun) on PATH: argument handling,
# the devicectl commands they issue, where files land in the app container, and the errors.
# Ends with `scripts: N passed, N failed`.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SCRIPTS="$(cd "$HERE/.." && pwd)"
WORK="$(mktemp -d -t ios-scripts.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/bin"
cp "$HERE/fake-xcrun" "$WORK/bin/xcrun"
export PATH="$WORK/bin:$PATH"
export FAKE_XCRUN_LOG="$WORK/xcrun.log"
export FAKE_DEVICE_ROOT="$WORK/device"
export FAKE_DEVICES_JSON="$WORK/devices.json"
unset IOS_DEVICE IOS_BUNDLE_ID

passed=0
failed=0
check() {   # check NAME COMMAND...: run a test function, count it
    local name="$1"
    shift
    rm -rf "$FAKE_DEVICE_ROOT" "$FAKE_XCRUN_LOG" "$WORK/out" "$WORK/program"
    one_device
    # Not inside `if`: there bash would ignore `set -e` and only the last command would count.
    ( set -e; "$@" ) >"$WORK/test.log" 2>&1
    if [ $? = 0 ]; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
        sed 's/^/    /' "$WORK/test.log"
    fi
}

not() {   # `! cmd` never fails a `set -e` script; this does
    if "$@"; then return 1; fi
}

one_device() {
    cat >"$FAKE_DEVICES_JSON" <<'JSON'
{"info": {"outcome": "success"}, "result": {"devices": [
  {"identifier": "00008120-AAAA", "hardwareProperties": {"platform": "iOS", "marketingName": "iPhone 15"},
   "connectionProperties": {"tunnelState": "connected"}}]}}
JSON
}

make_program() {   # a program directory as `toolchain export` writes it (contents are placeholders)
    mkdir -p "$WORK/program/adapter_init"
    printf 'PTE' >"$WORK/program/model.pte"
    printf 'STATE' >"$WORK/program/state_init.bin"
    printf 'W' >"$WORK/program/weights.safetensors"
    printf '{}' >"$WORK/program/tokenizer.json"
    printf '{}' >"$WORK/program/adapter_init/adapter_config.json"
    printf 'ST' >"$WORK/program/adapter_init/adapter_model.safetensors"
    cat >"$WORK/program/manifest.json" <<'JSON'
{"schema_version": 3, "programs": [{"target": "executorch", "file": "model.pte"}],
 "weights": {"file": "weights.safetensors", "layer_placeholder": "{layer}"},
 "state": {"init_file": "state_init.bin"},
 "tokenizer": {"kind": "qwen2.5", "file": "tokenizer.json", "vocab": 151936, "pad_token_id": 151643, "eos_token_id": 151643},
 "adapter": {"init_dir": "adapter_init", "config": {}},
 "files": {"model.pte": "0000000000000000000000000000000000000000000000000000000000000000",
           "state_init.bin": "0000000000000000000000000000000000000000000000000000000000000000",
           "weights.safetensors": "0000000000000000000000000000000000000000000000000000000000000000",
           "tokenizer.json": "0000000000000000000000000000000000000000000000000000000000000000",
           "adapter_init/adapter_model.safetensors": "0000000000000000000000000000000000000000000000000000000000000000"}}
JSON
}

expect_fail() {    # expect_fail NEEDLE COMMAND...: the command exits 2 and says NEEDLE on stderr
    local needle="$1"
    shift
    local rc=0
    "$@" 2>"$WORK/stderr" >/dev/null || rc=$?
    [ "$rc" = 2 ] || { echo "exit $rc, wanted 2"; cat "$WORK/stderr"; return 1; }
    grep -q -- "$needle" "$WORK/stderr" || { echo "stderr lacks '$needle':"; cat "$WORK/stderr"; return 1; }
}

test_push_copies_every_file_into_documents_programs() {
    make_program
    printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n' >"$WORK/rows.jsonl"
    "$SCRIPTS/push_program.sh" "$WORK/program" --name tiny --data "$WORK/rows.jsonl" >"$WORK/out.txt"
    local c="$FAKE_DEVICE_ROOT/org.onphonellm.trainer/Documents"
    cmp "$WORK/program/model.pte" "$c/Programs/tiny/model.pte"
    cmp "$WORK/program/weights.safetensors" "$c/Programs/tiny/weights.safetensors"
    cmp "$WORK/program/tokenizer.json" "$c/Programs/tiny/tokenizer.json"
    cmp "$WORK/program/state_init.bin" "$c/Programs/tiny/state_init.bin"
    cmp "$WORK/program/manifest.json" "$c/Programs/tiny/manifest.json"
    cmp "$WORK/program/adapter_init/adapter_model.safetensors" "$c/Programs/tiny/adapter_init/adapter_model.safetensors"
    cmp "$WORK/rows.jsonl" "$c/Data/rows.jsonl"
    grep -q "copied 7 file(s) of tiny to org.onphonellm.trainer on 00008120-AAAA, and rows.jsonl" "$WORK/out.txt"
    # The exact devicectl call: picked device, app data container, relative destination.
    grep -q "^devicectl list devices --json-output " "$FAKE_XCRUN_LOG"
    grep -qx "devicectl device copy to --device 00008120-AAAA --domain-type appDataContainer --domain-identifier org.onphonellm.trainer --source $WORK/program/model.pte --destination Documents/Programs/tiny/model.pte" "$FAKE_XCRUN_LOG"
}

test_push_uses_given_device_and_bundle_without_listing() {
    make_program
    "$SCRIPTS/push_program.sh" "$WORK/program" --device DEV-1 --bundle-id com.example.t >/dev/null
    [ -f "$FAKE_DEVICE_ROOT/com.example.t/Documents/Programs/program/model.pte" ]
    not grep -q "list devices" "$FAKE_XCRUN_LOG"
    grep -q -- "--device DEV-1 " "$FAKE_XCRUN_LOG"
}

test_push_dry_run_prints_commands_and_copies_nothing() {
    make_program
    "$SCRIPTS/push_program.sh" "$WORK/program" --device DEV-1 --dry-run >"$WORK/out.txt"
    [ "$(grep -c '^xcrun devicectl device copy to' "$WORK/out.txt")" = 7 ]
    [ ! -e "$FAKE_XCRUN_LOG" ]
}

test_push_refuses_a_directory_without_manifest() {
    mkdir -p "$WORK/program"
    expect_fail "no manifest.json" "$SCRIPTS/push_program.sh" "$WORK/program"
    [ ! -e "$FAKE_XCRUN_LOG" ]
}

test_push_refuses_a_program_missing_a_listed_file() {
    make_program
    rm "$WORK/program/model.pte"
    expect_fail "lacks model.pte" "$SCRIPTS/push_program.sh" "$WORK/program"
    [ ! -e "$FAKE_XCRUN_LOG" ]
}

test_push_refuses_a_version_2_manifest() {
    make_program
    sed -i 's/"schema_version": 3/"schema_version": 2/' "$WORK/program/manifest.json"
    expect_fail "schema_version 2; the app runs schema_version 3" "$SCRIPTS/push_program.sh" "$WORK/program"
    [ ! -e "$FAKE_XCRUN_LOG" ]
}

test_push_refuses_a_program_without_weights_tokenizer_or_adapter() {
    make_program
    rm "$WORK/program/weights.safetensors"
    expect_fail "lacks weights.safetensors" "$SCRIPTS/push_program.sh" "$WORK/program"
    make_program
    rm "$WORK/program/adapter_init/adapter_config.json"
    expect_fail "lacks adapter_init/adapter_config.json" "$SCRIPTS/push_program.sh" "$WORK/program"
    make_program
    sed -i 's/"kind": "qwen2.5"/"kind": "none"/' "$WORK/program/manifest.json"
    expect_fail "has no tokenizer" "$SCRIPTS/push_program.sh" "$WORK/program"
    [ ! -e "$FAKE_XCRUN_LOG" ]
}

test_push_checks_and_copies_per_method_core_ml_packages() {
    make_program
    mkdir -p "$WORK/program/coreml/embed.mlpackage/Data"
    printf 'M' >"$WORK/program/coreml/embed.mlpackage/Data/model.mlmodel"
    python3 - "$WORK/program/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["programs"].append({"target": "coreml", "file": "coreml", "methods": {
    "embed": "coreml/embed.mlpackage", "block_forward": "coreml/block_forward.mlpackage"}})
json.dump(m, open(sys.argv[1], "w"))
PY
    expect_fail "lacks coreml/block_forward.mlpackage" "$SCRIPTS/push_program.sh" "$WORK/program"
    mkdir -p "$WORK/program/coreml/block_forward.mlpackage/Data"
    printf 'N' >"$WORK/program/coreml/block_forward.mlpackage/Data/model.mlmodel"
    "$SCRIPTS/push_program.sh" "$WORK/program" --device DEV-1 >/dev/null
    local c="$FAKE_DEVICE_ROOT/org.onphonellm.trainer/Documents/Programs/program"
    cmp "$WORK/program/coreml/block_forward.mlpackage/Data/model.mlmodel" "$c/coreml/block_forward.mlpackage/Data/model.mlmodel"
    cmp "$WORK/program/state_init.bin" "$c/state_init.bin"
}

test_push_refuses_bad_arguments() {
    make_program
    expect_fail "unknown option --frobnicate" "$SCRIPTS/push_program.sh" "$WORK/program" --frobnicate
    expect_fail "does not exist" "$SCRIPTS/push_program.sh" "$WORK/program" --data "$WORK/nope.jsonl"
    expect_fail "plain directory name" "$SCRIPTS/push_program.sh" "$WORK/program" --name ../x
}

test_device_picking_needs_exactly_one_phone() {
    make_program
    echo '{"result": {"devices": []}}' >"$FAKE_DEVICES_JSON"
    expect_fail "no connected iPhone" "$SCRIPTS/push_program.sh" "$WORK/program"
    cat >"$FAKE_DEVICES_JSON" <<'JSON'
{"result": {"devices": [{"identifier": "A", "hardwareProperties": {"platform": "iOS"}, "connectionProperties": {"tunnelState": "connected"}},
                        {"identifier": "B", "hardwareProperties": {"platform": "iOS"}, "connectionProperties": {"tunnelState": "disconnected"}}]}}
JSON
    expect_fail "2 devices connected" "$SCRIPTS/push_program.sh" "$WORK/program"
}

test_pull_copies_events_and_adapters() {
    local c="$FAKE_DEVICE_ROOT/org.onphonellm.trainer/Documents"
    mkdir -p "$c/Telemetry" "$c/Adapters/ios-run-1"
    printf '{"seq": 0}\n{"seq": 1}\n' >"$c/Telemetry/events.jsonl"
    printf 'ST' >"$c/Adapters/ios-run-1/adapter_model.safetensors"
    "$SCRIPTS/pull_telemetry.sh" --out "$WORK/out" --adapters >"$WORK/out.txt"
    cmp "$c/Telemetry/events.jsonl" "$WORK/out/events.jsonl"
    [ -f "$WORK/out/adapters/ios-run-1/adapter_model.safetensors" ]
    grep -q "pulled 2 event(s)" "$WORK/out.txt"
    grep -q "toolchain telemetry import $WORK/out/events.jsonl" "$WORK/out.txt"
    grep -qx "devicectl device copy from --device 00008120-AAAA --domain-type appDataContainer --domain-identifier org.onphonellm.trainer --source Documents/Telemetry/events.jsonl --destination $WORK/out/.events.jsonl.partial" "$FAKE_XCRUN_LOG"
}

test_pull_without_telemetry_fails_and_keeps_no_partial_file() {
    mkdir -p "$FAKE_DEVICE_ROOT/org.onphonellm.trainer/Documents"
    expect_fail "no telemetry on the device yet" "$SCRIPTS/pull_telemetry.sh" --out "$WORK/out"
    [ -z "$(ls -A "$WORK/out")" ]
}

test_pull_imports_with_toolchain_when_asked() {
    local c="$FAKE_DEVICE_ROOT/org.onphonellm.trainer/Documents"
    mkdir -p "$c/Telemetry"
    printf '{"seq": 0}\n' >"$c/Telemetry/events.jsonl"
    printf '#!/bin/sh\necho "toolchain $*" >"%s/toolchain.args"\n' "$WORK" >"$WORK/bin/toolchain"
    chmod +x "$WORK/bin/toolchain"
    "$SCRIPTS/pull_telemetry.sh" --out "$WORK/out" --db "$WORK/runs.sqlite3" >/dev/null
    rm -f "$WORK/bin/toolchain"
    grep -qx "toolchain telemetry import $WORK/out/events.jsonl --db $WORK/runs.sqlite3" "$WORK/toolchain.args"
}

test_scripts_use_the_app_paths() {
    # The relative paths must match ios/TrainerCore/Sources/TrainerCore/AppPaths.swift.
    local paths="$SCRIPTS/../../ios/TrainerCore/Sources/TrainerCore/AppPaths.swift"
    grep -q 'programsDir = "Programs"' "$paths"
    grep -q 'dataDir = "Data"' "$paths"
    grep -q 'eventLog = "Telemetry/events.jsonl"' "$paths"
    grep -q 'adaptersDir = "Adapters"' "$paths"
    grep -q 'IOS_BUNDLE_ID_DEFAULT="org.onphonellm.trainer"' "$SCRIPTS/common.sh"
    grep -q 'PRODUCT_BUNDLE_IDENTIFIER: org.onphonellm.trainer$' "$SCRIPTS/../../ios/App/project.yml"
}

for t in $(declare -F | awk '{print $3}' | grep '^test_'); do
    check "$t" "$t"
done
echo "scripts: $passed passed, $failed failed"
[ "$failed" = 0 ]
