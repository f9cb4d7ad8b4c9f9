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
#   4. checks the kernel's name is in the built libexecutorch.so, and copies the AAR to OUT_DIR.
# Not run in this repository's CI (no NDK there): docs/android.md, "The generation kernel", says what was
# checked where.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
die() { echo "build_executorch_aar.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: ANDROID_NDK=... ANDROID_SDK=... $0 /path/to/executorch [OUT_DIR]"
ET="$(cd "$1" && pwd)" || die "no directory $1"
OUT="${2:-$REPO/android/build/executorch-aar}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ABI="${ANDROID_ABI:-arm64-v8a}"
PLATFORM="${ANDROID_PLATFORM:-android-26}"
NDK="${ANDROID_NDK:-}"
[ -n "$NDK" ] && [ -f "$NDK/build/cmake/android.toolchain.cmake" ] || die "set ANDROID_NDK to an Android NDK (no build/cmake/android.toolchain.cmake under '$NDK')"
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
[ -f "$OUT/executorch.aar" ] || die "no $OUT/executorch.aar"
echo "built $OUT/executorch.aar with toolchain::int4_linear_a8.out ($ABI)"
echo "build the app with it: ./gradlew :app:assembleDebug -PexecutorchAar=$OUT/executorch.aar"
