# Sourced by the scripts in scripts/android/. Environment:
#   ADB (default: adb; ANDROID_SERIAL picks the device), TRAINER_PACKAGE (default org.onphonellm.trainer),
#   TOOLCHAIN (default: toolchain on PATH, else the repository's .venv/bin/toolchain), PYTHON (default python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
ADB="${ADB:-adb}"
PKG="${TRAINER_PACKAGE:-org.onphonellm.trainer}"
PYTHON="${PYTHON:-python3}"
SERVICE="$PKG/org.onphonellm.trainer.app.TrainingService"
ACTIVITY="$PKG/org.onphonellm.trainer.app.MainActivity"
ACTION_START="org.onphonellm.trainer.action.START"
ACTION_STOP="org.onphonellm.trainer.action.STOP"
# The app's external files directory: adb can write it without root, the app needs no permission.
REMOTE="/sdcard/Android/data/$PKG/files"

die() { echo "Error: $*" >&2; exit 2; }
note() { echo "$*" >&2; }

adb_() { "$ADB" "$@"; }

toolchain_bin() {
    if [ -n "${TOOLCHAIN:-}" ]; then echo "$TOOLCHAIN"
    elif command -v toolchain >/dev/null 2>&1; then command -v toolchain
    elif [ -x "$REPO/.venv/bin/toolchain" ]; then echo "$REPO/.venv/bin/toolchain"
    else die "toolchain not found; run 'make' in the repository or set TOOLCHAIN"; fi
}
toolchain_() { "$(toolchain_bin)" "$@"; }

# Values go through the device shell (`adb shell` joins its arguments): allow only plain characters.
safe() {  # safe NAME VALUE
    [[ "$2" =~ ^[A-Za-z0-9._:/@+=-]+$ ]] || die "$1 '$2' has characters the device shell would interpret; use letters, digits and ._:/@+=-"
}

need_device() {
    command -v "$ADB" >/dev/null 2>&1 || die "adb not found (apt-get install adb, or set ADB)"
    local state
    state="$(adb_ get-state 2>/dev/null || true)"
    [ "$state" = device ] || die "no device attached (adb get-state: ${state:-none}); connect a phone with USB debugging on"
}
