#!/usr/bin/env bash
# Host build + tests of the Android side, without Gradle or Maven (neither is reachable here):
#   1. install what it needs into a cache: the Kotlin compiler (npm `kotlin-compiler`), JUnit 5's console
#      launcher (Debian `junit5`) and a compile-only android.jar, API 23 (Debian 11 `libandroid-23-java`),
#      fetched with a private apt configuration that leaves the system's sources untouched;
#   2. compile trainer-core + its tests for the JVM and run the tests (JUnit 5);
#   3. compile trainer-core + the app glue against android.jar alone (no JDK: the core may use only Java
#      APIs Android has) + host-stubs/ (ExecuTorch API stubs with the real signatures, and the few
#      Android APIs newer than 23 that the glue calls); check the app's XML files are well-formed;
#   4. build the generation kernel's static library (android/native) for this host and link it as the app's
#      ExecuTorch JNI library does (registered, computes; the app's kernel path query answers), and for arm64
#      when a cross g++ is installed; the 16 KB page gate of build_executorch_aar.sh;
#   5. the API checks: the ExecuTorch stubs equal the listing recorded from ExecuTorch's sources
#      (android/api/executorch-android.json), and every ExecuTorch member the compiled app glue calls is in it.
# Prints "N passed, N failed" (JUnit tests + the compile checks) and exits non-zero on any failure.
# JUnit includes, by default: the layer loop replaying the host's ExecuTorch trace of a real exported
# program (shared_schemas/traces/tiny, tiny_groups with checkpoint groups, and tiny_qwen3, the
# same recording on a Qwen3-shaped program: ReplayTest), the
# training session on that program (SessionTest),
# the byte-level BPE against the shared tokenizer corpus (TokenizerTest) and on-device data preparation
# against every case of shared_schemas/data_corpus (DataCorpusTest); the phone-facing logic of
# issue 25: program import and verify-once, saved screen state, capped reads, error events, charging runs
# (PhoneTest), buffer reuse with a counting fake runtime (ReplayTest); issue 42's first-run fixes: the capped and
# cancellable held-out pass, per-step checkpoints in charging windows (SessionTest, ChargingTest), generation beside
# training: no training call while a generation's consumer is within the gate's grace, on the gate's own clock, and
# the decode rate with timed fake calls printed (GenerationTest), Start / Stop states and the
# crash-replay guard (RunStartTest), checkpoints through direct buffers (CheckpointTest); issue 43's feedback records
# (FeedbackTest, then validated with the schema by scripts/apps/check_feedback.py). The Qwen2.5 tokenizer.json is written
# into the cache by the repository's .venv; the tests needing it are skipped, and counted as such, without it.
# Env: TOOLCHAIN_ANDROID_CACHE (default ~/.cache/toolchain-android), KEEP_BUILD=1 keeps android/build/host.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE="${TOOLCHAIN_ANDROID_CACHE:-$HOME/.cache/toolchain-android}"
KOTLIN_VERSION=2.4.20
BUILD="$HERE/build/host"
mkdir -p "$CACHE"

log() { echo "[android/test.sh] $*" >&2; }
die() { log "error: $*"; exit 2; }

# A fresh machine may lack the JDK or npm: install them from Debian when we are root (CI is).
apt_install() {
    [ "$(id -u)" = 0 ] || die "$1 not found; install it (apt-get install -y $2)"
    log "installing $2 (apt-get)"
    apt-get -qq update >/dev/null && apt-get install -y -qq "$2" >/dev/null || die "apt-get install $2 failed"
}
command -v javac >/dev/null || apt_install javac openjdk-17-jdk-headless

# --- 1. tools --------------------------------------------------------------------------------------
KOTLINC_HOME="$CACHE/kotlinc-$KOTLIN_VERSION"
if [ ! -f "$KOTLINC_HOME/lib/kotlin-compiler.jar" ]; then
    command -v npm >/dev/null || apt_install npm npm
    log "fetching kotlin-compiler@$KOTLIN_VERSION from npm"
    tmp="$(mktemp -d "$CACHE/npm.XXXXXX")"
    (cd "$tmp" && npm pack "kotlin-compiler@$KOTLIN_VERSION" --silent >/dev/null && tar xzf kotlin-compiler-*.tgz)
    rm -rf "$KOTLINC_HOME"
    mv "$tmp/package" "$KOTLINC_HOME"
    rm -rf "$tmp"
    chmod +x "$KOTLINC_HOME"/bin/*
fi
KLIB="$KOTLINC_HOME/lib"

# Debian packages, via apt-get download with lists kept in the cache (no change to /etc/apt).
APT_DIR="$CACHE/apt"
DEBS="$CACHE/debs"
apt_opts() {
    echo "-o Dir::Etc::SourceList=$APT_DIR/sources.list -o Dir::Etc::SourceParts=$APT_DIR/none" \
         "-o Dir::State::Lists=$APT_DIR/lists -o Dir::Cache=$APT_DIR/cache -o Debug::NoLocking=1" \
         "-o APT::Sandbox::User=$(id -un)"
}
fetch_deb() {  # fetch_deb PACKAGE FILE-INSIDE -> prints the extracted path
    local pkg="$1" inside="$2" out="$DEBS/$1"
    if [ ! -f "$out/$inside" ]; then
        command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian-based machine"
        mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/none" "$DEBS"
        printf 'deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian bullseye main\n' \
            > "$APT_DIR/sources.list"
        # shellcheck disable=SC2046
        if ! (cd "$DEBS" && apt-get $(apt_opts) -qq download "$pkg" >/dev/null 2>&1); then
            log "apt-get update (private lists in $APT_DIR)"
            # shellcheck disable=SC2046
            apt-get $(apt_opts) -qq update >/dev/null || die "apt-get update failed (is deb.debian.org reachable?)"
            # shellcheck disable=SC2046
            (cd "$DEBS" && apt-get $(apt_opts) -qq download "$pkg" >/dev/null) || die "apt-get download $pkg failed"
        fi
        rm -rf "$out"
        dpkg-deb -x "$(ls -t "$DEBS/${pkg}"_*.deb | head -1)" "$out"
        [ -f "$out/$inside" ] || die "$pkg has no $inside"
    fi
    echo "$out/$inside"
}
JUNIT="$(fetch_deb junit5 usr/share/java/junit-platform-console-standalone.jar)"
ANDROID_JAR="$(fetch_deb libandroid-23-java usr/share/java/com.android.android-23.jar)"

# --- 2..4. compile and test ------------------------------------------------------------------------
rm -rf "$BUILD"
mkdir -p "$BUILD"
kotlinc() { "$KOTLINC_HOME/bin/kotlinc" -nowarn "$@"; }
sources() { find "$@" -name '*.kt' -o -name '*.java' | sort; }

checks_passed=0
checks_failed=0
check() {  # check NAME COMMAND... : a compile step counted as one check
    local name="$1"; shift
    log "$name"
    if "$@" >"$BUILD/$name.log" 2>&1; then
        checks_passed=$((checks_passed + 1))
    else
        checks_failed=$((checks_failed + 1))
        log "FAILED: $name"; cat "$BUILD/$name.log" >&2
        return 1
    fi
}

CORE="$HERE/trainer-core/src"
# JVM: trainer-core and its tests in one compiler run (each kotlinc start costs ~20 s).
jvm_ok=1
check jvm-compile kotlinc -jvm-target 17 -cp "$JUNIT" -d "$BUILD/core-tests.jar" $(sources "$CORE/main" "$CORE/test") || jvm_ok=0
# Android: stubs (javac for the Android and AndroidX ones, kotlinc for ExecuTorch's, which is Kotlin), then
# trainer-core + app glue against android.jar alone (-no-jdk): the core may use only Java APIs Android has, the glue
# only the Android and ExecuTorch APIs it declares. ApiDump.kt (android/api) is compiled with the ExecuTorch stubs.
# Then the API checks against the listing recorded from ExecuTorch's sources (android/api/executorch-android.json):
#   api-stubs: the ExecuTorch stubs declare exactly the listing's classes and members (Kotlin declarations: property
#              or function, parameters, defaults, nullability; and the JVM members they compile to);
#   api-calls: every reference the compiled app glue makes into org.pytorch.executorch is a listed member.
LISTING="$HERE/api/executorch-android.json"
check stubs-compile sh -c "mkdir -p '$BUILD/stubs' && javac -nowarn --release 8 -cp '$ANDROID_JAR' -d '$BUILD/stubs' \
    \$(find '$HERE/host-stubs' -name '*.java' | sort)" \
 && check stubs-executorch-compile kotlinc -no-jdk -jvm-target 1.8 -cp "$ANDROID_JAR:$KLIB/kotlin-reflect.jar" -d "$BUILD/stubs-et" \
        $(sources "$HERE/host-stubs/executorch") "$HERE/api/ApiDump.kt" \
 && { check api-stubs sh -c "java -cp '$BUILD/stubs-et:$KLIB/kotlin-stdlib.jar:$KLIB/kotlin-reflect.jar' ApiDumpKt org.pytorch.executorch \
          '$BUILD/stubs-et' > '$BUILD/stubs-api.json' && python3 '$HERE/api/api_check.py' stubs '$LISTING' '$BUILD/stubs-api.json'" || true; } \
 && check android-compile kotlinc -no-jdk -jvm-target 1.8 -cp "$BUILD/stubs:$BUILD/stubs-et:$ANDROID_JAR" -d "$BUILD/app" \
        $(sources "$CORE/main" "$HERE/app/src/main/kotlin") \
 && check api-calls python3 "$HERE/api/api_check.py" calls "$LISTING" "$BUILD/app" || true
check android-xml python3 -c 'import sys, xml.dom.minidom as m; [m.parse(f) for f in sys.argv[1:]]' \
    $(find "$HERE/app/src/main" -name '*.xml') || true

# The generation kernel as the app links it (android/native/CMakeLists.txt): built with this host's C++
# compiler against the .venv's executorch headers (the exporter's version) and linked --whole-archive, as
# ExecuTorch's JNI library links EXECUTORCH_JNI_CUSTOM_LIBRARY, against its libexecutorch.so: the registry has
# toolchain::int4_linear_a8.out and the kernel computes; linked plainly, the registry lacks it. Then the same
# static library cross-compiled for arm64 (aarch64-linux-gnu-g++, when installed: scripts/check_kernel_arm64.sh
# installs it) with the registration object in it and the thread pool's calls (TOOLCHAIN_THREADPOOL: undefined in the
# archive, defined by the AAR's libexecutorch.so). Not the NDK's clang (not installable here): see
# docs/android.md, "The generation kernel". Skipped, and logged, without cmake, a C++ compiler or the .venv.
ET_PKG="$(ls -d "$REPO"/.venv/lib/python3*/site-packages/executorch 2>/dev/null | head -1 || true)"
if command -v cmake >/dev/null && command -v c++ >/dev/null && [ -n "$ET_PKG" ] && [ -f "$ET_PKG/lib/libexecutorch.so" ]; then
    check native-kernel-host sh -c "cmake -S '$HERE/native' -B '$BUILD/kernels-host' -DCMAKE_BUILD_TYPE=Release \
        -DEXECUTORCH_INCLUDE_DIR='$ET_PKG/include' -DTOOLCHAIN_KERNELS_CHECK=ON -DEXECUTORCH_LIBRARY='$ET_PKG/lib/libexecutorch.so' \
        -DEXECUTORCH_THREADPOOL_LIBRARY='$ET_PKG/lib/libexecutorch_threadpool.so' \
        && cmake --build '$BUILD/kernels-host' -j 2 \
        && '$BUILD/kernels-host/registration_check_whole' present && '$BUILD/kernels-host/registration_check_plain' absent \
        && '$BUILD/kernels-host/kernel_path_check' dotprod" || true
    if command -v aarch64-linux-gnu-g++ >/dev/null && command -v aarch64-linux-gnu-nm >/dev/null; then
        check native-kernel-arm64 sh -c "cmake -S '$HERE/native' -B '$BUILD/kernels-arm64' -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
            -DEXECUTORCH_INCLUDE_DIR='$ET_PKG/include' && cmake --build '$BUILD/kernels-arm64' \
            && aarch64-linux-gnu-nm -C '$BUILD/kernels-arm64/libtoolchain_kernels.a' > '$BUILD/kernels-arm64/nm.txt' \
            && grep -q ' T toolchain_int4_linear_a8\$' '$BUILD/kernels-arm64/nm.txt' \
            && grep -q ' T Java_org_onphonellm_trainer_app_NativeKernels_kernelPath\$' '$BUILD/kernels-arm64/nm.txt' \
            && grep -q ' W toolchain_kernel_path\$' '$BUILD/kernels-arm64/nm.txt' \
            && grep -q ' U executorch::runtime::register_kernels' '$BUILD/kernels-arm64/nm.txt' \
            && grep -q ' U pthreadpool_get_threads_count\$' '$BUILD/kernels-arm64/nm.txt' \
            && grep -q ' U executorch::extension::threadpool::get_pthreadpool()\$' '$BUILD/kernels-arm64/nm.txt' \
            && grep -q '_GLOBAL__sub_I_kernels' '$BUILD/kernels-arm64/nm.txt'" || true
    else
        log "native-kernel-arm64 skipped (no aarch64-linux-gnu-g++; scripts/check_kernel_arm64.sh installs it)"
    fi
else
    log "native-kernel checks skipped (need cmake, c++ and $REPO/.venv with executorch)"
fi

# The 16 KB page gate of build_executorch_aar.sh (--check-16k: every LOAD segment of the built libexecutorch.so
# aligned to >= 16 KB, as Android 15+ phones with 16 KB pages need): a tiny .so linked with 16 KB pages passes, one
# linked with 4 KB pages is refused.
if command -v cc >/dev/null && command -v readelf >/dev/null; then
    check native-16k-gate sh -c "mkdir -p '$BUILD/16k' && printf 'int f(void) { return 1; }\n' > '$BUILD/16k/f.c' \
        && cc -shared -fPIC -Wl,-z,max-page-size=16384 '$BUILD/16k/f.c' -o '$BUILD/16k/ok.so' \
        && cc -shared -fPIC -Wl,-z,max-page-size=4096 -Wl,-z,common-page-size=4096 '$BUILD/16k/f.c' -o '$BUILD/16k/4k.so' \
        && bash '$HERE/native/build_executorch_aar.sh' --check-16k '$BUILD/16k/ok.so' \
        && ! bash '$HERE/native/build_executorch_aar.sh' --check-16k '$BUILD/16k/4k.so'" || true
else
    log "native-16k-gate skipped (no cc / readelf)"
fi

# The Qwen2.5 tokenizer.json for TokenizerTest (4.6 MB, not in the repository): built by the toolchain from
# the vocabulary its pinned dashscope wheel ships, cached by the sha256 of toolchain/text/qwen_vocab.py.
QWEN_TOKENIZER=""
if [ -x "$REPO/.venv/bin/python" ]; then
    tok_key="$(sha256sum "$REPO/toolchain/text/qwen_vocab.py" | cut -c1-16)"
    QWEN_TOKENIZER="$CACHE/qwen2.5-tokenizer-$tok_key.json"
    if [ ! -f "$QWEN_TOKENIZER" ]; then
        log "writing the Qwen2.5 tokenizer.json (toolchain.text, .venv)"
        (cd "$REPO" && "$REPO/.venv/bin/python" -c "import sys; from toolchain.text.tokenizer_source import load_tokenizer; \
open(sys.argv[1] + '.tmp', 'w', encoding='utf-8').write(load_tokenizer('qwen2.5').to_json())" "$QWEN_TOKENIZER") \
            && mv "$QWEN_TOKENIZER.tmp" "$QWEN_TOKENIZER" || { log "could not write the Qwen2.5 tokenizer.json"; QWEN_TOKENIZER=""; }
    fi
else
    log "no $REPO/.venv: the tokenizer comparison is skipped (make test creates the venv)"
fi

tests_passed=0
tests_failed=0
tests_skipped=0
if [ $jvm_ok = 1 ]; then
    log "running trainer-core tests (JUnit $(basename "$JUNIT"))"
    set +e
    mkdir -p "$BUILD/interop"
    java -Drepo.root="$REPO" -Dinterop.dir="$BUILD/interop" -Dqwen.tokenizer="$QWEN_TOKENIZER" -jar "$JUNIT" --disable-banner --details=tree --disable-ansi-colors \
        -cp "$BUILD/core-tests.jar:$KLIB/kotlin-stdlib.jar" \
        --scan-class-path "$BUILD/core-tests.jar" 2>&1 | tee "$BUILD/junit.log"
    set -e
    tests_passed=$(sed -n 's/^\[ *\([0-9]*\) tests successful.*/\1/p' "$BUILD/junit.log" | tail -1)
    tests_failed=$(sed -n 's/^\[ *\([0-9]*\) tests failed.*/\1/p' "$BUILD/junit.log" | tail -1)
    tests_skipped=$(sed -n 's/^\[ *\([0-9]*\) tests aborted.*/\1/p' "$BUILD/junit.log" | tail -1)
    tests_skipped=${tests_skipped:-0}
    tests_passed=${tests_passed:-0}
    tests_failed=${tests_failed:-1}
    [ "$tests_passed" -gt 0 ] || { log "no JUnit test ran"; tests_failed=$((tests_failed + 1)); }
fi

# The host reads the checkpoint and adapter Kotlin wrote (SessionTest, for the trace program; needs the
# repository's venv: `make` creates it).
MANIFEST_EXAMPLE="$REPO/shared_schemas/traces/tiny/program/manifest.json"
if [ -f "$BUILD/interop/checkpoint.safetensors" ] && [ -x "$REPO/.venv/bin/python" ] && [ -f "$MANIFEST_EXAMPLE" ]; then
    check host-interop "$REPO/.venv/bin/python" "$HERE/interop_check.py" "$BUILD/interop" "$MANIFEST_EXAMPLE" || true
else
    log "host-interop skipped (needs the JUnit run, $REPO/.venv and $MANIFEST_EXAMPLE)"
fi

# The feedback records trainer-core wrote (FeedbackTest: keep, edit, discard) against shared_schemas/feedback.schema.json
# with the host's validator (jsonschema; scripts/apps/check_feedback.py), this checkout's toolchain first on the path.
if [ -f "$BUILD/interop/feedback.jsonl" ] && [ -x "$REPO/.venv/bin/python" ]; then
    check feedback-schema env PYTHONPATH="$REPO" "$REPO/.venv/bin/python" "$REPO/scripts/apps/check_feedback.py" android "$BUILD/interop/feedback.jsonl" 4 || true
else
    log "feedback-schema skipped (needs the JUnit run and $REPO/.venv)"
fi

[ "${KEEP_BUILD:-0}" = 1 ] || { rm -rf "$BUILD"; rmdir "$HERE/build" 2>/dev/null || true; }
log "JUnit: $tests_passed passed, $tests_failed failed, $tests_skipped skipped (assumptions); compile checks: $checks_passed passed, $checks_failed failed"
passed=$((tests_passed + checks_passed))
failed=$((tests_failed + checks_failed))
if [ "$tests_skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $tests_skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" = 0 ]
