#!/usr/bin/env bash
# The arm64 build of the int4 generation kernel (toolchain/native/kernels.cpp), checked on this x86-64
# host: cross-compiled with Debian's aarch64-linux-gnu g++ (static, so qemu needs no sysroot) together with
# tests/native/arm64_driver.cpp, and run under qemu-aarch64 on the cases of tests/native/make_arm64_cases.py
# (the x86 kernel's output included). Two builds: -march=armv8-a (the NEON path at the apps' arm64 baseline)
# and -march=armv8-a+nosimd (no __ARM_NEON: the generic path, vector extensions lowered to scalar code).
# Each must hold the float32 dot-product bound against a float64 reference on every case (else exit 1);
# the number of cases equal to the x86 output bit for bit is reported.
#
# Installs g++-aarch64-linux-gnu and qemu-user from Debian's packages when missing (root and apt-get
# needed; the apt lists are refreshed only if an install from the present ones fails). Exit 77 when the
# tools are missing and cannot be installed (tests/native/test_kernel_arm64.py then skips), or when they
# are missing and TOOLCHAIN_ARM64_NO_INSTALL=1. Options via the environment: ARM64_CASES (random cases,
# default 300), ARM64_SEED, PYTHON (default .venv/bin/python).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"   # needs torch and the repo (tests/native/make_arm64_cases.py)
SKIP=77

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

find_tools() {
  cxx="$(command -v aarch64-linux-gnu-g++ || true)"
  qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
}

t_start="$(now)"
find_tools
if [ -z "$cxx" ] || [ -z "$qemu" ]; then
  pkgs=()
  [ -n "$cxx" ] || pkgs+=(g++-aarch64-linux-gnu)
  [ -n "$qemu" ] || pkgs+=(qemu-user)
  if [ "${TOOLCHAIN_ARM64_NO_INSTALL:-0}" = 1 ]; then
    echo "arm64: skipped: ${pkgs[*]} not installed (TOOLCHAIN_ARM64_NO_INSTALL=1)"
    exit $SKIP
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "arm64: skipped: ${pkgs[*]} not installed, and installing them needs root and apt-get"
    exit $SKIP
  fi
  log="$(mktemp)"
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0 "${pkgs[@]}" >>"$log" 2>&1
  }
  echo "arm64: installing ${pkgs[*]} (Debian packages)"
  if ! apt_install; then
    if ! { apt-get update -q -o DPkg::Lock::Timeout=300 >>"$log" 2>&1 && apt_install; }; then
      echo "arm64: skipped: could not install ${pkgs[*]}; apt-get said:"
      tail -n 5 "$log" | sed 's/^/  /'
      rm -f "$log"
      exit $SKIP
    fi
  fi
  rm -f "$log"
  find_tools
  if [ -z "$cxx" ] || [ -z "$qemu" ]; then
    echo "arm64: skipped: ${pkgs[*]} installed but aarch64-linux-gnu-g++ / qemu-aarch64 are not on PATH"
    exit $SKIP
  fi
  echo "arm64: install took $(since "$t_start") s"
fi
echo "arm64: $("$cxx" --version | head -n 1); $("$qemu" --version | head -n 1)"

tmp="$(mktemp -d)"
cases_pid=
trap '[ -z "$cases_pid" ] || kill "$cases_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT

# The cases (and the x86 output), while the two arm64 builds compile.
(
  t0="$(now)"
  "$py" "$root/tests/native/make_arm64_cases.py" "$tmp/cases.bin" --cases "${ARM64_CASES:-300}" \
    ${ARM64_SEED:+--seed "$ARM64_SEED"} >"$tmp/cases.log" 2>&1
  since "$t0" >"$tmp/cases.time"
) &
cases_pid=$!

# The kernel's flags as toolchain/native/build.py's (less -march=native, -fPIC -shared); the driver's
# float64 reference without contraction.
kflags=(-std=c++17 -O3 -ffp-contract=fast -DTOOLCHAIN_NO_EXECUTORCH -Wall -Wno-psabi)
builds=("neon:-march=armv8-a" "generic:-march=armv8-a+nosimd")
t1="$(now)"
for b in "${builds[@]}"; do
  name="${b%%:*}" march="${b#*:}"
  "$cxx" "${kflags[@]}" "$march" -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-$name.o"
  "$cxx" -std=c++17 -O2 -ffp-contract=off -Wall -Wextra "$march" -c "$root/tests/native/arm64_driver.cpp" \
    -o "$tmp/driver-$name.o"
  "$cxx" -static "$tmp/kernel-$name.o" "$tmp/driver-$name.o" -o "$tmp/check-$name"
done
echo "arm64: compiled ${#builds[@]} builds in $(since "$t1") s (beside the making of the cases)"

cases_rc=0
wait "$cases_pid" || cases_rc=$?
cases_pid=
if [ "$cases_rc" -ne 0 ]; then
  echo "arm64: making the cases failed:" >&2
  cat "$tmp/cases.log" >&2
  exit 2
fi
echo "arm64: $(cat "$tmp/cases.log") [made in $(cat "$tmp/cases.time") s]"

rc=0
for b in "${builds[@]}"; do
  name="${b%%:*}" march="${b#*:}"
  t2="$(now)"
  "$qemu" "$tmp/check-$name" "$tmp/cases.bin" "arm64 $march" || rc=1
  echo "arm64: ran $name under qemu in $(since "$t2") s"
done
echo "arm64: total $(since "$t_start") s"
exit $rc
