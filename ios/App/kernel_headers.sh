#!/usr/bin/env bash
# The ExecuTorch C++ headers the app target's native code compiles against (toolchain/native/kernels.cpp,
# the int4 generation kernel, and Sources/Kernels/ToolchainKernels.cpp, its registry probe), copied into
# ios/App/Vendor/executorch/include (git-ignored), where project.yml's HEADER_SEARCH_PATHS look.
#
# They must be the headers of the runtime the app links: the ExecuTorch Swift package is pinned to
# swiftpm-1.5.1 (project.yml), so the headers of executorch 1.5.1. The source is, in order: $EXECUTORCH_INCLUDE
# (a directory holding executorch/, e.g. an executorch v1.5.1 checkout's parent), else the include/ of the
# executorch wheel of the project's .venv (`make test` installs 1.5.1; the headers are the same on every
# platform). The prebuilt frameworks carry only the headers extension/module and extension/tensor export
# (scripts/build_apple_frameworks.sh in ExecuTorch); the kernel's registration macro needs
# extension/kernel_util/, which is not among them.
#
#   bash ios/App/kernel_headers.sh      # then: cd ios/App && xcodegen generate
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# The one ExecuTorch pin is project.yml's package branch (`branch: swiftpm-X.Y.Z`): the headers' version is read from it.
WANT="$(sed -n 's/^ *branch: *swiftpm-\([0-9][0-9.]*\) *$/\1/p' "$HERE/project.yml" | head -1)"
[ -n "$WANT" ] || { echo "kernel_headers: no 'branch: swiftpm-<version>' in $HERE/project.yml" >&2; exit 1; }
DEST="$HERE/Vendor/executorch/include"
if [ -n "${EXECUTORCH_INCLUDE:-}" ]; then
    SRC="$EXECUTORCH_INCLUDE"
    VERSION="${EXECUTORCH_VERSION:-unknown}"
else
    PY="${PYTHON:-$REPO/.venv/bin/python}"
    if [ ! -x "$PY" ]; then
        echo "kernel_headers: no $PY (run make test, or set EXECUTORCH_INCLUDE to an executorch $WANT include directory)" >&2
        exit 1
    fi
    read -r SRC VERSION < <("$PY" -c 'import executorch, importlib.metadata as m, os; print(os.path.join(executorch.__path__[0], "include"), m.version("executorch"))')
fi
if [ "$VERSION" != "$WANT" ] && [ "$VERSION" != "unknown" ]; then
    echo "kernel_headers: executorch $VERSION at $SRC; the app links the $WANT runtime (project.yml swiftpm-$WANT)" >&2
    exit 1
fi
for f in executorch/runtime/kernel/kernel_includes.h executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h \
         executorch/runtime/kernel/operator_registry.h executorch/runtime/core/portable_type/c10/c10/macros/Macros.h; do
    [ -f "$SRC/$f" ] || { echo "kernel_headers: $SRC lacks $f" >&2; exit 1; }
done
rm -rf "$DEST"
mkdir -p "$DEST"
cp -R "$SRC/executorch" "$DEST/"
# The app target compiles the kernel from now on (Config/App.xcconfig includes this file when it exists).
printf '// Written by kernel_headers.sh: the ExecuTorch headers are in Vendor/, so the native kernel is compiled in.\nTOOLCHAIN_NATIVE_KERNELS = YES\n' \
    > "$HERE/Vendor/kernels.xcconfig"
echo "kernel_headers: executorch $VERSION headers from $SRC -> $DEST; Vendor/kernels.xcconfig sets TOOLCHAIN_NATIVE_KERNELS = YES"
