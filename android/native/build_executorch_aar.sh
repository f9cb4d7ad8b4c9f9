#!/usr/bin/env bash
# Build the executorch-android AAR from source with the generation kernel (toolchain::int4_linear_a8.out,
# toolchain/native/kernels.cpp) registered in its libexecutorch.so, for the app's -PexecutorchAar.
#
#   ANDROID_NDK=/path/to/ndk ANDROID_SDK=/path/to/sdk \
#     android/native/build_executorch_aar.sh /path/to/executorch [OUT_DIR]
#
# /path/to/executorch: a checkout of pytorch/executorch at the exporter's version (pyproject.toml pins the
# executorch wheel, 1.5.1: `git clone --branch v1.5.1 https://github.com/pytorch/executorch.git executorch`,
# then `git submodule update --init --recursive` in it), in a directory named exactly `executorch`, with
# its Python build requirements installed (ExecuTorch's install_requirements.sh; its CMake build runs
# Python codegen). OUT_DIR (default android/build/executorch-aar): executorch.aar and the kernel build.
# Env: ANDROID_ABI (default arm64-v8a, the app's only ABI), ANDROID_PLATFORM (default android-26, the
# app's minSdk), PYTHON_EXECUTABLE (passed on to ExecuTorch's script).
#
# Why from source: the kernel must be in the AAR's own libexecutorch.so (ExecuTorch's JNI library exports
# only JNI_OnLoad and Java_*, so a kernel in another .so cannot reach its kernel registry). ExecuTorch's
# extension/android/CMakeLists.txt links the static libraries of EXECUTORCH_JNI_CUSTOM_LIBRARY into it with
# --whole-archive; its scripts/build_android_library.sh builds the .so and the AAR but passes no extra
# CMake options, so this script
#   1. builds libtoolchain_kernels.a with the NDK (android/native/CMakeLists.txt, ExecuTorch's headers);
#   2. configures ExecuTorch's Android build directory (cmake-out-android-$ANDROID_ABI, the preset's) once
#      with EXECUTORCH_JNI_CUSTOM_LIBRARY set: a CMake cache entry, kept by the script's own configure;
#   3. runs scripts/build_android_library.sh for that ABI (libexecutorch.so, then the AAR with Gradle);
#   4. checks the kernel's name and the app's kernel path query are in the built libexecutorch.so and its LOAD
#      segments are 16 KB-aligned, and copies the AAR to OUT_DIR.
# Not run in this repository's CI (no NDK there): docs/android.md, "The generation kernel", says what was
# checked where.
#
# 16 KB pages: Android 15+ phones may run a 16 KB page kernel, which refuses to load a .so whose LOAD segments
# are aligned to less (and Google Play requires 16 KB-aligned libraries of apps targeting Android 15+). NDK r28
# and later link 16 KB-aligned by default; this script refuses an older NDK and checks the built libexecutorch.so
# (every LOAD segment aligned to >= 0x4000, read with the NDK's llvm-readelf).
#   build_executorch_aar.sh --check-16k FILE.so    # only that check (READELF=... to choose the readelf)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
die() { echo "build_executorch_aar.sh: $*" >&2; exit 2; }

# check_16k SO: every PT_LOAD segment of SO aligned to at least 16 KB (prints the alignments).
readelf_tool() {  # READELF, else the NDK's llvm-readelf, else readelf
    local re="${READELF:-}"
    if [ -z "$re" ] && [ -n "${ANDROID_NDK:-}" ]; then
        re="$(ls "$ANDROID_NDK"/toolchains/llvm/prebuilt/*/bin/llvm-readelf 2>/dev/null | head -1 || true)"
    fi
    echo "${re:-readelf}"
}
check_16k() {
    local so="$1" re aligns a
    re="$(readelf_tool)"
    [ -f "$so" ] || die "no $so"
    aligns="$("$re" -lW "$so" | awk '$1 == "LOAD" { print $NF }')" || die "$re cannot read $so"
    [ -n "$aligns" ] || die "$so has no LOAD segment (not a shared library?)"
    for a in $aligns; do
        if [ $((a)) -lt 16384 ]; then
            die "$so has a LOAD segment aligned to $a (< 0x4000): a 16 KB page Android refuses it; build with NDK r28+"
        fi
    done
    echo "$so: LOAD segments aligned to $(echo $aligns | tr ' ' ',') (16 KB pages: ok)"
}
if [ "${1:-}" = "--check-16k" ]; then
    [ $# = 2 ] || die "usage: $0 --check-16k FILE.so"
    check_16k "$2"
    exit 0
fi

[ $# -ge 1 ] || die "usage: ANDROID_NDK=... ANDROID_SDK=... $0 /path/to/executorch [OUT_DIR]"
ET="$(cd "$1" && pwd)" || die "no directory $1"
OUT="${2:-$REPO/android/build/executorch-aar}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ABI="${ANDROID_ABI:-arm64-v8a}"
PLATFORM="${ANDROID_PLATFORM:-android-26}"
NDK="${ANDROID_NDK:-}"
[ -n "$NDK" ] && [ -f "$NDK/build/cmake/android.toolchain.cmake" ] || die "set ANDROID_NDK to an Android NDK (no build/cmake/android.toolchain.cmake under '$NDK')"
ndk_rev="$(sed -n 's/^Pkg.Revision *= *\([0-9]*\).*/\1/p' "$NDK/source.properties" 2>/dev/null | head -1)"
[ -n "$ndk_rev" ] || die "cannot read the NDK version ($NDK/source.properties)"
[ "$ndk_rev" -ge 28 ] || die "NDK r$ndk_rev: use NDK r28 or later (it links 16 KB-aligned libraries, which Android 15+ phones with 16 KB pages need)"
[ -n "${ANDROID_SDK:-${ANDROID_HOME:-}}" ] || die "set ANDROID_SDK (or ANDROID_HOME): ExecuTorch's script builds the AAR with Gradle"
export ANDROID_SDK="${ANDROID_SDK:-$ANDROID_HOME}"
[ "$(basename "$ET")" = executorch ] || die "$ET must be named exactly 'executorch' (ExecuTorch's CMake requires it)"
[ -f "$ET/scripts/build_android_library.sh" ] && [ -f "$ET/extension/android/CMakeLists.txt" ] || die "$ET is not an ExecuTorch checkout"
grep -q EXECUTORCH_JNI_CUSTOM_LIBRARY "$ET/extension/android/CMakeLists.txt" \
    || die "$ET/extension/android/CMakeLists.txt has no EXECUTORCH_JNI_CUSTOM_LIBRARY (an ExecuTorch too old or too new for this script)"
want="$(sed -n 's/^ *"executorch==\([^"]*\)".*/\1/p' "$REPO/pyproject.toml" | head -1)"
have="$(cat "$ET/version.txt" 2>/dev/null || echo unknown)"
if [ -n "$want" ] && [ "${have%%[a-z+]*}" != "$want" ]; then
    echo "build_executorch_aar.sh: warning: $ET is ExecuTorch $have, the exporter's is $want: the .pte and the runtime must match" >&2
fi

# 1. The kernel, for this ABI, with the NDK (and its default STL, as ExecuTorch's build uses).
KB="$OUT/kernels-$ABI"
cmake -S "$HERE" -B "$KB" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$NDK/build/cmake/android.toolchain.cmake" -DANDROID_ABI="$ABI" -DANDROID_PLATFORM="$PLATFORM" \
    -DEXECUTORCH_ROOT="$ET"
cmake --build "$KB" -j "$(nproc 2>/dev/null || echo 4)"
LIB="$KB/libtoolchain_kernels.a"
[ -f "$LIB" ] || die "no $LIB"

# 2. ExecuTorch's Android build directory, configured with the kernel library (a cache entry the script's
#    own `cmake . --preset android-$ABI ... -B cmake-out-android-$ABI` keeps).
cd "$ET"
cmake . --preset "android-$ABI" -B "cmake-out-android-$ABI" \
    -DCMAKE_TOOLCHAIN_FILE="$NDK/build/cmake/android.toolchain.cmake" -DANDROID_PLATFORM="$PLATFORM" \
    -DPYTHON_EXECUTABLE="${PYTHON_EXECUTABLE:-python3}" \
    -DEXECUTORCH_JNI_CUSTOM_LIBRARY="$LIB"
grep -q "^EXECUTORCH_JNI_CUSTOM_LIBRARY:.*=$LIB\$" "cmake-out-android-$ABI/CMakeCache.txt" \
    || die "EXECUTORCH_JNI_CUSTOM_LIBRARY is not in cmake-out-android-$ABI/CMakeCache.txt"

# 3. ExecuTorch's own build of libexecutorch.so and the AAR, for this ABI only.
ANDROID_NDK="$NDK" ANDROID_ABIS="$ABI" BUILD_AAR_DIR="$OUT" bash scripts/build_android_library.sh

# 4. The kernel's name (a string of its registration) is in the JNI library the AAR packs.
so="cmake-out-android-so/$ABI/libexecutorch.so"
[ -f "$so" ] || die "no $ET/$so"
grep -aq "int4_linear_a8.out" "$so" || die "$so does not contain the kernel (toolchain::int4_linear_a8.out): was EXECUTORCH_JNI_CUSTOM_LIBRARY linked?"
# The app's kernel path query (kernel_path_jni.cpp) is exported (the version script keeps Java_*).
ANDROID_NDK="$NDK" "$(ANDROID_NDK="$NDK" readelf_tool)" --dyn-syms -W "$so" | grep -q " Java_org_onphonellm_trainer_app_NativeKernels_kernelPath\$" \
    || die "$so lacks Java_org_onphonellm_trainer_app_NativeKernels_kernelPath (kernel_path_jni.cpp): the screen would say 'path unknown'"
ANDROID_NDK="$NDK" check_16k "$so"
[ -f "$OUT/executorch.aar" ] || die "no $OUT/executorch.aar"
echo "built $OUT/executorch.aar with toolchain::int4_linear_a8.out ($ABI)"
echo "build the app with it: ./gradlew :app:assembleDebug -PexecutorchAar=$OUT/executorch.aar"
