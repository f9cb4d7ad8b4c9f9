#!/usr/bin/env bash
# Record the public API of ExecuTorch's Android library (package org.pytorch.executorch: Module, Tensor,
# EValue, DType, ...) from its sources, as android/api/executorch-android.json: the listing android/test.sh
# checks the host stubs and the app's calls against (android/api/api_check.py).
#
#   android/api/generate_listing.sh GIT_DIR COMMIT [OUT]
#
# GIT_DIR: a clone of pytorch/executorch (a bare one will do), COMMIT: the revision to record (the tag of the
# exporter's version when the clone has it). The sources are read with `git show`, compiled with the Kotlin
# compiler android/test.sh installs (against the API 23 android.jar and four small stand-ins of fbjni's
# HybridData / DoNotStrip and SoLoader's NativeLoader / SystemDelegate, which only the bodies use), and
# described by ApiDump.kt with kotlin-reflect. Nothing fetched is written into the repository: only the listing.
# Run android/test.sh once first (it installs kotlinc and android.jar into TOOLCHAIN_ANDROID_CACHE).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 2 ] || { echo "usage: $0 GIT_DIR COMMIT [OUT]" >&2; exit 2; }
GIT_DIR="$1"
COMMIT="$2"
OUT="${3:-$HERE/executorch-android.json}"
CACHE="${TOOLCHAIN_ANDROID_CACHE:-$HOME/.cache/toolchain-android}"
KOTLINC_HOME="$(ls -d "$CACHE"/kotlinc-* 2>/dev/null | sort | tail -1)"
ANDROID_JAR="$CACHE/debs/libandroid-23-java/usr/share/java/com.android.android-23.jar"
[ -n "$KOTLINC_HOME" ] && [ -f "$ANDROID_JAR" ] || { echo "Error: no kotlinc / android.jar in $CACHE: run android/test.sh once" >&2; exit 2; }
PKG_DIR=extension/android/executorch_android/src/main/java/org/pytorch/executorch
git --git-dir="$GIT_DIR" rev-parse --verify -q "$COMMIT^{commit}" >/dev/null || { echo "Error: no commit $COMMIT in $GIT_DIR" >&2; exit 2; }
SHA="$(git --git-dir="$GIT_DIR" rev-parse "$COMMIT^{commit}")"
VERSION="$(git --git-dir="$GIT_DIR" show "$SHA:version.txt" | tr -d '[:space:]')"

W="$(mktemp -d)"
[ -n "${KEEP_LISTING_WORK:-}" ] && echo "work dir: $W" >&2 || trap 'rm -rf "$W"' EXIT
mkdir -p "$W/src" "$W/shim/com/facebook/jni/annotations" "$W/shim/com/facebook/soloader/nativeloader" "$W/classes" "$W/dump"
# The package's own files (not its extension/ and training/ subpackages), and the annotation it uses.
mapfile -t files < <(git --git-dir="$GIT_DIR" ls-tree --name-only "$SHA" "$PKG_DIR/" "$PKG_DIR/annotations/" | grep -E '\.(kt|java)$' | sort)
for f in "${files[@]}"; do
    mkdir -p "$W/src/$(dirname "$f")"
    git --git-dir="$GIT_DIR" show "$SHA:$f" > "$W/src/$f"
done
cat > "$W/shim/com/facebook/jni/HybridData.java" <<'EOF'
package com.facebook.jni;
public class HybridData { public boolean isValid() { return false; } public void resetNative() {} }
EOF
cat > "$W/shim/com/facebook/jni/annotations/DoNotStrip.java" <<'EOF'
package com.facebook.jni.annotations;
public @interface DoNotStrip {}
EOF
cat > "$W/shim/com/facebook/soloader/nativeloader/NativeLoaderDelegate.java" <<'EOF'
package com.facebook.soloader.nativeloader;
public interface NativeLoaderDelegate {}
EOF
cat > "$W/shim/com/facebook/soloader/nativeloader/SystemDelegate.java" <<'EOF'
package com.facebook.soloader.nativeloader;
public class SystemDelegate implements NativeLoaderDelegate {}
EOF
cat > "$W/shim/com/facebook/soloader/nativeloader/NativeLoader.java" <<'EOF'
package com.facebook.soloader.nativeloader;
public class NativeLoader {
  public static boolean isInitialized() { return true; }
  public static void init(NativeLoaderDelegate d) {}
  public static boolean loadLibrary(String name) { return true; }
}
EOF
javac -nowarn --release 8 -d "$W/classes" $(find "$W/shim" -name '*.java')
"$KOTLINC_HOME/bin/kotlinc" -nowarn -no-jdk -jvm-target 1.8 -cp "$W/classes:$ANDROID_JAR" -d "$W/classes" \
    $(find "$W/src" -name '*.kt' -o -name '*.java' | sort)
"$KOTLINC_HOME/bin/kotlinc" -nowarn -cp "$KOTLINC_HOME/lib/kotlin-reflect.jar" -d "$W/dump" "$HERE/ApiDump.kt"
KLIB="$KOTLINC_HOME/lib"
java -cp "$W/classes:$ANDROID_JAR:$W/dump:$KLIB/kotlin-stdlib.jar:$KLIB/kotlin-reflect.jar" ApiDumpKt org.pytorch.executorch "$W/classes" > "$W/api.json"
python3 - "$W/api.json" "$OUT" "$SHA" "$VERSION" "$COMMIT" "${files[@]}" <<'EOF'
import json, sys
api, out, sha, version, ref, files = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
doc = {"source": {"repository": "https://github.com/pytorch/executorch", "ref": ref, "commit": sha, "version_txt": version,
                  "files": files},
       "how": "android/api/generate_listing.sh: the sources compiled with kotlinc, described by android/api/ApiDump.kt (kotlin-reflect)",
       "classes": api}
open(out, "w").write(json.dumps(doc, indent=1, sort_keys=False) + "\n")
print(f"{out}: {len(api)} classes from {ref} ({sha[:10]}, version.txt {version})")
EOF
