# Sourced by scripts/check_arm64.sh and scripts/check_kernel_arm64.sh: installs the Debian packages of the arm64
# tools a caller lacks (it finds its tools and names the missing packages; this is the install both share).
#
#   arm64_install PKG...   no packages: nothing. Else installs them with apt-get (root needed; the apt lists are
#                          refreshed only if an install from the present ones fails) and prints how long it took.
#                          Exits the caller with 77 ("skipped", with one "arm64: skipped: ..." line) when
#                          TOOLCHAIN_ARM64_NO_INSTALL=1, without root or apt-get, or when apt-get fails (its last
#                          lines shown).
# The caller then looks for its tools again and exits 77 if they are still missing.

arm64_install() {
  [ $# -gt 0 ] || return 0
  local pkgs=("$@") log t0
  if [ "${TOOLCHAIN_ARM64_NO_INSTALL:-0}" = 1 ]; then
    echo "arm64: skipped: ${pkgs[*]} not installed (TOOLCHAIN_ARM64_NO_INSTALL=1)"
    exit 77
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "arm64: skipped: ${pkgs[*]} not installed, and installing them needs root and apt-get"
    exit 77
  fi
  t0="$(date +%s)"
  log="$(mktemp)"
  echo "arm64: installing ${pkgs[*]} (Debian packages)"
  if ! _arm64_apt_install "$log" "${pkgs[@]}"; then
    if ! { apt-get update -q -o DPkg::Lock::Timeout=300 >>"$log" 2>&1 && _arm64_apt_install "$log" "${pkgs[@]}"; }; then
      echo "arm64: skipped: could not install ${pkgs[*]}; apt-get said:"
      tail -n 5 "$log" | sed 's/^/  /'
      rm -f "$log"
      exit 77
    fi
  fi
  rm -f "$log"
  echo "arm64: install took $(( $(date +%s) - t0 )) s"
}

_arm64_apt_install() {  # log, packages...
  local log="$1"; shift
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0 "$@" >>"$log" 2>&1
}
