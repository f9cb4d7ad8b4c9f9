#!/usr/bin/env bash
# Installs (once) and enters a Debian 13 (trixie) chroot that has Swift 6.0.3 (`swiftlang`).
#
# Source it, then call:
#   swift_chroot_ensure            # debootstrap trixie + swiftlang into $SWIFT_CHROOT (cached; ~2 min, ~3.2 GB)
#   swift_chroot_run REPO CMD...   # run CMD in the chroot with REPO bind-mounted at /repo (cwd /repo)
#
# Needs /proc inside the chroot: swift locates its runtime libraries through $ORIGIN.
# Why a chroot: the host is Debian 12, whose archive has no Swift; trixie's `swiftlang` is a complete
# toolchain (swiftc, SwiftPM, Foundation, XCTest). Needs root (debootstrap, mount, chroot).
# SWIFT_CHROOT overrides the cache location (default /var/cache/toolchain-swift/trixie).

SWIFT_CHROOT="${SWIFT_CHROOT:-/var/cache/toolchain-swift/trixie}"
SWIFT_MIRROR="${SWIFT_MIRROR:-http://deb.debian.org/debian}"

swift_chroot_ensure() {
    # (/usr/bin/swift is an absolute symlink: test the real file, which resolves from outside too)
    if [ -f "$SWIFT_CHROOT/.toolchain-ready" ] && [ -x "$SWIFT_CHROOT/usr/libexec/swift/bin/swift-frontend" ]; then
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "Error: installing the Swift chroot needs root (debootstrap); run ios/test.sh as root" >&2
        return 2
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "ios: installing debootstrap" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
    fi
    # A half-made chroot (killed install) is removed and made again, but never while anything is
    # mounted inside it (a bind-mounted repository or /dev would be deleted with it).
    swift_chroot_unmount
    if grep -q " $SWIFT_CHROOT/" /proc/mounts 2>/dev/null; then
        echo "Error: something is still mounted under $SWIFT_CHROOT (see /proc/mounts); unmount it first" >&2
        return 2
    fi
    rm -rf "$SWIFT_CHROOT"
    mkdir -p "$(dirname "$SWIFT_CHROOT")"
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    local keyopt=()
    [ -f "$keyring" ] && keyopt=(--keyring="$keyring")
    echo "ios: debootstrap trixie + swiftlang into $SWIFT_CHROOT (first run only, a few minutes)" >&2
    debootstrap --variant=minbase "${keyopt[@]}" --include=swiftlang,libc6-dev,libstdc++-14-dev,ca-certificates \
        trixie "$SWIFT_CHROOT" "$SWIFT_MIRROR" >"$SWIFT_CHROOT.log" 2>&1 || {
        echo "Error: debootstrap failed; see $SWIFT_CHROOT.log" >&2
        return 2
    }
    # swift finds its libraries through $ORIGIN, which the loader resolves via /proc/self/exe.
    mount -t proc proc "$SWIFT_CHROOT/proc"
    local ok=0
    chroot "$SWIFT_CHROOT" /usr/bin/swift --version >&2 || ok=$?
    umount -l "$SWIFT_CHROOT/proc"
    if [ "$ok" != 0 ]; then
        echo "Error: swift does not run in $SWIFT_CHROOT; delete it and re-run" >&2
        return 2
    fi
    touch "$SWIFT_CHROOT/.toolchain-ready"
}

swift_chroot_unmount() {
    local m
    for m in repo dev/pts dev proc; do
        if mountpoint -q "$SWIFT_CHROOT/$m" 2>/dev/null; then
            umount -l "$SWIFT_CHROOT/$m" || true
        fi
    done
}

swift_chroot_run() {
    local repo="$1"
    shift
    mkdir -p "$SWIFT_CHROOT/repo" "$SWIFT_CHROOT/proc" "$SWIFT_CHROOT/dev"
    mountpoint -q "$SWIFT_CHROOT/proc" || mount -t proc proc "$SWIFT_CHROOT/proc"
    mountpoint -q "$SWIFT_CHROOT/dev" || mount --bind /dev "$SWIFT_CHROOT/dev"
    mountpoint -q "$SWIFT_CHROOT/repo" && umount -l "$SWIFT_CHROOT/repo"
    mount --bind "$repo" "$SWIFT_CHROOT/repo"
    local rc=0
    chroot "$SWIFT_CHROOT" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8 \
        /bin/sh -c 'cd /repo && exec "$@"' sh "$@" || rc=$?
    swift_chroot_unmount
    return $rc
}
