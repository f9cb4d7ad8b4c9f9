#!/usr/bin/env bash
# iOS checks that run on Linux (CI and developers' machines):
#   1. `swift test` for ios/TrainerCore (Swift 6.0.3 from Debian trixie, in a cached chroot), including
#      the replay of the recorded traces (shared_schemas/traces/tiny, tiny_groups, tiny_qwen3) through the Swift layer loop
#      and the Swift BPE against the tokenizer corpus (reference made by .venv/bin/python first); the feedback
#      records FeedbackTests wrote, validated with shared_schemas/feedback.schema.json (scripts/apps/check_feedback.py);
#   2. every Swift file of the app (and of TrainerCore) syntax-checked with `swiftc -parse`, the app's
#      ExecuTorch and Core ML runtimes and its TrainingController type-checked against stand-ins (the
#      ExecuTorch runtime also without the native kernel: the app's build without the kernel headers), the
#      kernel build setting (App/Config/App.xcconfig), and the ExecuTorch stand-in checked against the API
#      listing recorded from ExecuTorch's sources (swift_api.py);
#   3. the scripts/ios tests (a fake xcrun on PATH);
#   4. ios/hostcheck: the app's C++ ExecuTorch Module path driving the layer loop, against the traces
#      (tiny, tiny_groups and tiny_qwen3 with the stock methods; tiny and tiny_qwen3 again
#      with the native int4 kernel linked in and the fused generation methods).
# Prints one line per part and ends with the plain line `N passed, N failed`; exits non-zero on any
# failure. Needs root the first time (debootstrap + mount + chroot; ~3 minutes, 3.2 GB under
# /var/cache/toolchain-swift, override with SWIFT_CHROOT); later runs reuse the chroot and the build
# cache in it. Build jobs: SWIFT_JOBS (default 2).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
JOBS="${SWIFT_JOBS:-2}"
LOG_DIR="${IOS_TEST_LOG_DIR:-$(mktemp -d -t ios-test.XXXXXX)}"
mkdir -p "$LOG_DIR"
# shellcheck source=ios/swift-toolchain.sh
source "$HERE/swift-toolchain.sh"

passed=0
failed=0

if ! swift_chroot_ensure; then
    echo "ios: cannot install the Swift toolchain (see above)"
    echo "0 passed, 1 failed"
    exit 1
fi

# One run at a time per chroot: the repository is mounted at the same place for every run.
exec 9>"$SWIFT_CHROOT.lock"
flock 9

# --- 0. What the tokenizer test compares against, made now rather than committed (4.6 MB): the Qwen2.5
# tokenizer.json as the toolchain ships it and the Python decodes (ios/hostcheck/tokenizer_reference.py),
# into the chroot's /tmp/trainercore-qwen. Without the project's .venv the tokenizer tests fail and say so.
QWEN_REF="$SWIFT_CHROOT/tmp/trainercore-qwen"
rm -rf "$QWEN_REF"
if [ -x "$REPO/.venv/bin/python" ]; then
    (cd "$REPO" && .venv/bin/python ios/hostcheck/tokenizer_reference.py "$QWEN_REF") >"$LOG_DIR/tokenizer-ref.log" 2>&1 \
        || echo "ios: the tokenizer reference could not be made (log $LOG_DIR/tokenizer-ref.log); the tokenizer tests will fail"
else
    echo "ios: no .venv (make test sets it up); the tokenizer tests will fail"
fi

# FeedbackTests leaves the records it wrote in the chroot's /tmp/trainercore-feedback (checked after the suite).
FEEDBACK_OUT="$SWIFT_CHROOT/tmp/trainercore-feedback"
rm -rf "$FEEDBACK_OUT" && mkdir -p "$FEEDBACK_OUT"

# --- 1. TrainerCore: build (cached in the chroot), then run the XCTest suite (with the trace replay
# of shared_schemas/traces/tiny and the tokenizer corpus comparison).
# The build directory lives in the chroot, keyed by nothing but /repo, so re-runs are incremental.
SCRATCH=/var/cache/trainercore-build
swift_chroot_run "$REPO" sh -c "cd ios/TrainerCore && swift build --build-tests -j $JOBS --scratch-path $SCRATCH \
    && swift test --skip-build --disable-swift-testing --scratch-path $SCRATCH" >"$LOG_DIR/swift-test.log" 2>&1
rc=$?
tests_passed=$(grep -cE "^Test Case '.*' passed" "$LOG_DIR/swift-test.log")
tests_failed=$(grep -cE "^Test Case '.*' failed" "$LOG_DIR/swift-test.log")
if [ "$rc" != 0 ] && [ "$tests_failed" = 0 ]; then
    tests_failed=1      # the build (or the runner) failed: count it
fi
grep -E "error:|^Test Case '.*' failed" "$LOG_DIR/swift-test.log" | head -40
echo "TrainerCore: $tests_passed passed, $tests_failed failed (swift test; log $LOG_DIR/swift-test.log)"
passed=$((passed + tests_passed))
failed=$((failed + tests_failed))

# --- 1b. The feedback records TrainerCore wrote (FeedbackTests: keep, edit, discard) against
# shared_schemas/feedback.schema.json with the host's validator (jsonschema; scripts/apps/check_feedback.py).
if [ -x "$REPO/.venv/bin/python" ] && (cd "$REPO" && PYTHONPATH="$REPO" .venv/bin/python scripts/apps/check_feedback.py ios \
        "$FEEDBACK_OUT/feedback.jsonl" 4) >"$LOG_DIR/feedback.log" 2>&1; then
    echo "Feedback records vs schema: 1 passed, 0 failed ($(tail -1 "$LOG_DIR/feedback.log"))"; passed=$((passed + 1))
else
    echo "Feedback records vs schema: 0 passed, 1 failed (needs .venv; log $LOG_DIR/feedback.log)"; cat "$LOG_DIR/feedback.log"; failed=$((failed + 1))
fi

# --- 2. Syntax of every Swift file (app sources cannot be type-checked without Apple's SDKs).
syntax_passed=0
syntax_failed=0
mapfile -t swift_files < <(cd "$REPO" && find ios -name '*.swift' -not -path '*/.build/*' -not -path '*/.swiftpm/*' | sort)
# One chroot session for all files: each prints "PARSE-OK <file>" or "PARSE-FAIL <file>" and its errors.
swift_chroot_run "$REPO" sh -c 'for f in "$@"; do
        if out=$(swiftc -parse "$f" 2>&1); then echo "PARSE-OK $f"; else echo "PARSE-FAIL $f"; echo "$out" | head -20; fi
    done' sh "${swift_files[@]}" >"$LOG_DIR/parse.log" 2>&1
syntax_passed=$(grep -c "^PARSE-OK " "$LOG_DIR/parse.log")
syntax_failed=$(( ${#swift_files[@]} - syntax_passed ))
if [ "$syntax_failed" != 0 ]; then
    grep -v "^PARSE-OK " "$LOG_DIR/parse.log" | head -60
fi
echo "Swift syntax: $syntax_passed passed, $syntax_failed failed (swiftc -parse, ${#swift_files[@]} files)"
passed=$((passed + syntax_passed))
failed=$((failed + syntax_failed))

# --- 2b. Type-check the app's two runtimes (layer loop runtimes) against TrainerCore (just built) and
# stand-ins with the declarations of the ExecuTorch Swift API and of Core ML (ios/typecheck/; the real
# frameworks need Apple's SDKs), one check per runtime file, and CoreMLRuntime once more with -D IOS26_SDK
# (its iOS 26 SDK branch: `MLMultiArrayDataType.int8`); then TrainingController.swift with both
# runtimes against stand-ins of the SwiftUI / UIKit declarations it uses and of the app's Darwin-only
# platform files (ios/typecheck/AppPlatform.swift). The views and the platform files stay parse-only.
# The app target's bridging header (the native kernel probe, ios/App/Sources/Kernels) is imported as the
# app imports it.
TC_OUT=/tmp/ios-typecheck
BRIDGE="-import-objc-header ios/App/Sources/Kernels/TrainerApp-Bridging-Header.h"
swift_chroot_run "$REPO" sh -c "set -e; rm -rf $TC_OUT; mkdir -p $TC_OUT
    MODS=\$(dirname \$(find $SCRATCH -path '*/debug/Modules/TrainerCore.swiftmodule' | head -1))
    for m in ExecuTorch CoreML SwiftUI UIKit; do
        swiftc -parse-as-library -emit-module -module-name \$m -emit-module-path $TC_OUT/\$m.swiftmodule ios/typecheck/\$m.swift
    done
    for f in ExecuTorchRuntime CoreMLRuntime; do
        if out=\$(swiftc -typecheck $BRIDGE -D TOOLCHAIN_NATIVE_KERNELS -I $TC_OUT -I \$MODS ios/App/Sources/Runtime/\$f.swift 2>&1); then echo \"TYPECHECK-OK \$f\"
        else echo \"TYPECHECK-FAIL \$f\"; echo \"\$out\" | head -30; fi
    done
    # Without the native kernels (TOOLCHAIN_NATIVE_KERNELS = NO, Config/App.xcconfig): no kernel source, no probe header.
    if out=\$(swiftc -typecheck -I $TC_OUT -I \$MODS ios/App/Sources/Runtime/ExecuTorchRuntime.swift 2>&1); then echo \"TYPECHECK-OK ExecuTorchRuntime-no-kernels\"
    else echo \"TYPECHECK-FAIL ExecuTorchRuntime-no-kernels\"; echo \"\$out\" | head -30; fi
    if out=\$(swiftc -typecheck $BRIDGE -D IOS26_SDK -I $TC_OUT -I \$MODS ios/App/Sources/Runtime/CoreMLRuntime.swift 2>&1); then echo \"TYPECHECK-OK CoreMLRuntime-iOS26-SDK\"
    else echo \"TYPECHECK-FAIL CoreMLRuntime-iOS26-SDK\"; echo \"\$out\" | head -30; fi
    if out=\$(swiftc -typecheck $BRIDGE -D TOOLCHAIN_NATIVE_KERNELS -I $TC_OUT -I \$MODS ios/App/Sources/TrainingController.swift ios/App/Sources/Runtime/ExecuTorchRuntime.swift \
            ios/App/Sources/Runtime/CoreMLRuntime.swift ios/App/Sources/FeedbackController.swift ios/typecheck/AppPlatform.swift 2>&1); then echo \"TYPECHECK-OK TrainingController\"
    else echo \"TYPECHECK-FAIL TrainingController\"; echo \"\$out\" | head -30; fi" >"$LOG_DIR/typecheck.log" 2>&1
tc_passed=$(grep -c "^TYPECHECK-OK " "$LOG_DIR/typecheck.log")
tc_failed=$((5 - tc_passed))
[ "$tc_failed" != 0 ] && grep -v "^TYPECHECK-OK " "$LOG_DIR/typecheck.log" | head -40
echo "App type-check: $tc_passed passed, $tc_failed failed (stand-in frameworks; log $LOG_DIR/typecheck.log)"
passed=$((passed + tc_passed))
failed=$((failed + tc_failed))

# --- 2b'. The build setting that leaves the kernel out (Config/App.xcconfig): the files it excludes are the
# kernel sources project.yml compiles (with TOOLCHAIN_THREADPOOL: rows over ExecuTorch's thread pool), NO is the
# default, and kernel_headers.sh is what turns it on.
xc="$HERE/App/Config/App.xcconfig"
if grep -qx "TOOLCHAIN_NATIVE_KERNELS = NO" "$xc" && grep -q '^#include? "../Vendor/kernels.xcconfig"' "$xc" \
   && grep -qx "TOOLCHAIN_KERNEL_EXCLUDED_NO = kernels.cpp ToolchainKernels.cpp" "$xc" \
   && [ -f "$REPO/toolchain/native/kernels.cpp" ] && [ -f "$HERE/App/Sources/Kernels/ToolchainKernels.cpp" ] \
   && grep -q "path: ../../toolchain/native/kernels.cpp" "$HERE/App/project.yml" && grep -q "Debug: Config/App.xcconfig" "$HERE/App/project.yml" \
   && grep -q 'compilerFlags: \[.*"-DTOOLCHAIN_THREADPOOL"' "$HERE/App/project.yml" \
   && grep -q "TOOLCHAIN_NATIVE_KERNELS = YES" "$HERE/App/kernel_headers.sh"; then
    echo "Kernel build setting: 1 passed, 0 failed"; passed=$((passed + 1))
else
    echo "Kernel build setting: 0 passed, 1 failed (ios/App/Config/App.xcconfig, project.yml, kernel_headers.sh)"; failed=$((failed + 1))
fi

# --- 2c. The stand-in of the ExecuTorch Swift API (ios/typecheck/ExecuTorch.swift, what 2b type-checks the app
# against) declares only what ExecuTorch's own sources declare: every type, member (kind, Swift name with argument
# labels, static, throws; the Swift overlay's members also by their types) and conformance is in the listing recorded
# from extension/apple/ExecuTorch/Exported (ios/typecheck/executorch-swift.json, made by swift_api.py record).
python3 "$HERE/typecheck/swift_api.py" check "$HERE/typecheck/executorch-swift.json" "$HERE/typecheck/ExecuTorch.swift" \
    >"$LOG_DIR/swift-api.log" 2>&1
if [ $? = 0 ]; then api_passed=1; api_failed=0; else api_passed=0; api_failed=1; cat "$LOG_DIR/swift-api.log"; fi
echo "ExecuTorch Swift API stand-in vs listing: $api_passed passed, $api_failed failed ($(tail -1 "$LOG_DIR/swift-api.log"))"
passed=$((passed + api_passed))
failed=$((failed + api_failed))

# --- 3. scripts/ios with a fake xcrun.
bash "$REPO/scripts/ios/tests/run_tests.sh" >"$LOG_DIR/scripts.log" 2>&1
rc=$?
line=$(grep -E "^scripts: [0-9]+ passed, [0-9]+ failed" "$LOG_DIR/scripts.log" | tail -1)
s_passed=$(echo "$line" | sed -E 's/^scripts: ([0-9]+) passed.*/\1/')
s_failed=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
[ -z "$line" ] && { s_passed=0; s_failed=1; }
[ "$rc" != 0 ] && [ "$s_failed" = 0 ] && s_failed=1
grep -E "^FAIL" "$LOG_DIR/scripts.log" | head -20
echo "scripts/ios: $s_passed passed, $s_failed failed (log $LOG_DIR/scripts.log)"
passed=$((passed + s_passed))
failed=$((failed + s_failed))

# --- 4. The app's ExecuTorch call pattern (the stock C++ Module, per-method arenas, set_input/execute)
# as the runtime of the layer loop, against the recorded trace (ios/hostcheck; ~10 s, needs g++ and
# the .venv's executorch wheel).
# The traces with the app's stock kernel set (tiny, tiny_groups: the same program with checkpoint
# groups, ~4 s more, and tiny_qwen3: the Qwen3-shaped program), the stock generation methods only; then
# tiny and tiny_qwen3 with the native int4 kernel linked in as the app target compiles it (--fused:
# the fused generation methods, the same ids).
h_passed=0
h_failed=0
if [ -x "$REPO/.venv/bin/python" ] && command -v g++ >/dev/null 2>&1; then
    for run in tiny tiny_groups tiny_qwen3 tiny:--fused tiny_qwen3:--fused; do
        t=${run%%:*}
        mode=${run#"$t"}
        mode=${mode#:}
        log="$LOG_DIR/hostcheck-$t${mode:+-fused}.log"
        (cd "$REPO" && .venv/bin/python ios/hostcheck/check.py "shared_schemas/traces/$t" $mode) >"$log" 2>&1
        if grep -q "^hostcheck: ok" "$log"; then h_passed=$((h_passed + 1))
        else h_failed=$((h_failed + 1)); tail -20 "$log"; fi
    done
else
    echo "ios: hostcheck needs the .venv and g++"; h_failed=5
fi
echo "hostcheck (C++ Module vs traces, stock x3 + fused x2): $h_passed passed, $h_failed failed (logs $LOG_DIR/hostcheck-*.log)"
passed=$((passed + h_passed))
failed=$((failed + h_failed))

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
