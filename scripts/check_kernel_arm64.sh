#!/usr/bin/env bash
# The arm64 paths of the int4 kernels (toolchain/native/kernels.cpp + kernels_arm64.h: neon, dotprod, i8mm, and the
# generic path): toolchain_int4_linear_a8 (generation) and toolchain_int4_dyw_a8 (dX = dY W for training), checked
# on this x86-64 host under qemu-aarch64:
#   - built at the apps' baseline (-march=armv8-a) by GCC (aarch64-linux-gnu-g++) and by clang
#     (clang++-19 --target=aarch64-linux-gnu with the GCC cross sysroot, linked by lld), each linked statically
#     with tests/native/arm64_driver.cpp;
#   - objdump: the dotprod functions (namespace arm64::dotprod) contain sdot, the i8mm ones (arm64::i8mm) smmla,
#     and no other function of the library has either (the rest stays armv8-a);
#   - run under qemu-aarch64 -cpu max (dotprod + i8mm), -cpu cortex-a76 (dotprod, no i8mm) and -cpu cortex-a53
#     (neither): every path that CPU has, forced in turn with TOOLCHAIN_KERNEL_PATH, and the default choice, on the
#     cases of tests/native/make_arm64_cases.py (random shapes, odd sizes, partial last groups, T = 1, 2..9,
#     >= 10, groups of 32 / 64 / 96 / 128 / 256 and any even width, rows of x with NaN / inf, rounding ties).
#     Each run: the float32 bound against a float64 reference on every case, every output equal to the x86
#     kernel's bit for bit (NaN = NaN), and the hash of all outputs equal to the generic path's (GCC, -cpu max);
#     the same three for int4_dyw_a8 on its own cases (make_arm64_cases.py --dyw: T = 1, 2..9, >= 10, groups of
#     32 / 64 / 96 / 128 and others, odd o, partial blocks and k-groups, NaN / inf rows, ties, zero scales):
#     every path, CPU and compiler gives the same bits; and on the same cases toolchain_int4_dyw_a8_acc (acc + dy W,
#     the addition in the paths' stores) is acc + dx bit for bit, into another buffer and in place. A third build (GCC, -DTOOLCHAIN_THREADPOOL with the
#     stand-in pool of tests/native/arm64_pool.cpp: 3 threads) runs every path at -cpu max with the weight rows of
#     large calls split into chunks over the pool: the same checks, and chunks were run. The default choice at each CPU level is the expected path (i8mm, dotprod,
#     neon); a forced path the CPU lacks (and an unknown name) is refused as kernels.cpp's header says: a valid
#     int4 call returns -2 and toolchain_kernel_path_error() says why (the driver prints it as its one "Error:"
#     line, exit 3), no result.
# Prints each check and then "arm64: N passed, N failed"; exit 1 when a check failed.
#
# Installs g++-aarch64-linux-gnu, qemu-user, clang-19 and lld-19 from Debian's packages when missing (root and
# apt-get needed; the apt lists are refreshed only if an install from the present ones fails). Exit 77 when the
# tools are missing and cannot be installed (tests/native/test_kernel_arm64.py then skips), or when they are
# missing and TOOLCHAIN_ARM64_NO_INSTALL=1. Options via the environment: ARM64_CASES (random cases, default
# 300), ARM64_DYW_CASES (random int4_dyw_a8 cases, default 60), ARM64_SEED, PYTHON (default .venv/bin/python),
# CLANGXX (another clang++ to use; clang 19 is what was checked: NDK r28's major).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"   # needs torch and the repo (tests/native/make_arm64_cases.py)
SKIP=77
source "$root/scripts/arm64_tools.sh"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

find_tools() {
  cxx="$(command -v aarch64-linux-gnu-g++ || true)"
  objdump="$(command -v aarch64-linux-gnu-objdump || true)"
  qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
  clangxx="${CLANGXX:-$(command -v clang++-19 || true)}"
  lld="$(command -v ld.lld-19 || command -v ld.lld || true)"
}

t_start="$(now)"
find_tools
if [ -z "$cxx" ] || [ -z "$objdump" ] || [ -z "$qemu" ] || [ -z "$clangxx" ] || [ -z "$lld" ]; then
  pkgs=()
  [ -n "$cxx" ] && [ -n "$objdump" ] || pkgs+=(g++-aarch64-linux-gnu binutils-aarch64-linux-gnu)
  [ -n "$qemu" ] || pkgs+=(qemu-user)
  [ -n "$clangxx" ] || pkgs+=(clang-19)
  [ -n "$lld" ] || pkgs+=(lld-19)
  arm64_install "${pkgs[@]}"   # scripts/arm64_tools.sh (exits 77 when it cannot)
  find_tools
  if [ -z "$cxx" ] || [ -z "$objdump" ] || [ -z "$qemu" ] || [ -z "$clangxx" ] || [ -z "$lld" ]; then
    echo "arm64: skipped: ${pkgs[*]} installed but the cross tools are not all on PATH"
    exit $SKIP
  fi
fi
echo "arm64: $("$cxx" --version | head -n 1); $("$clangxx" --version | head -n 1); $("$qemu" --version | head -n 1)"

tmp="$(mktemp -d)"
cases_pid=
trap '[ -z "$cases_pid" ] || kill "$cases_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT

# The cases (and the x86 output), while the arm64 builds compile.
(
  t0="$(now)"
  "$py" "$root/tests/native/make_arm64_cases.py" "$tmp/cases.bin" --cases "${ARM64_CASES:-300}" \
    --dyw "$tmp/dyw.bin" --dyw-cases "${ARM64_DYW_CASES:-60}" ${ARM64_SEED:+--seed "$ARM64_SEED"} >"$tmp/cases.log" 2>&1
  since "$t0" >"$tmp/cases.time"
) &
cases_pid=$!

# The kernel's flags as toolchain/native/build.py's and the apps' (less -march=native, -fPIC -shared): the
# apps' arm64 baseline; the driver's float64 reference without contraction.
kflags=(-std=c++17 -O3 -ffp-contract=fast -DTOOLCHAIN_NO_EXECUTORCH -Wall -Wno-psabi -march=armv8-a)
dflags=(-std=c++17 -O2 -ffp-contract=off -Wall -Wextra -march=armv8-a)
clang_target=(--target=aarch64-linux-gnu)
t1="$(now)"
"$cxx" "${kflags[@]}" -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-gcc.o"
"$cxx" "${dflags[@]}" -c "$root/tests/native/arm64_driver.cpp" -o "$tmp/driver-gcc.o"
"$cxx" -static "$tmp/kernel-gcc.o" "$tmp/driver-gcc.o" -o "$tmp/check-gcc"
"$clangxx" "${clang_target[@]}" "${kflags[@]}" -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-clang.o"
"$clangxx" "${clang_target[@]}" "${dflags[@]}" -c "$root/tests/native/arm64_driver.cpp" -o "$tmp/driver-clang.o"
"$clangxx" "${clang_target[@]}" --ld-path="$lld" -static "$tmp/kernel-clang.o" "$tmp/driver-clang.o" -o "$tmp/check-clang"
# The pooled build: kernels.cpp's thread-pool code (TOOLCHAIN_THREADPOOL) against the stand-in pool.
"$cxx" "${kflags[@]}" -DTOOLCHAIN_THREADPOOL -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-gcc-pool.o"
"$cxx" -std=c++17 -O2 -Wall -Wextra -march=armv8-a -c "$root/tests/native/arm64_pool.cpp" -o "$tmp/pool-gcc.o"
"$cxx" -static -pthread "$tmp/kernel-gcc-pool.o" "$tmp/driver-gcc.o" "$tmp/pool-gcc.o" -o "$tmp/check-gcc-pool"
echo "arm64: compiled the GCC, clang and pooled GCC builds in $(since "$t1") s (beside the making of the cases)"

passed=0
failed=0
check() {   # check DESCRIPTION COMMAND...: counts and prints one line
  local what="$1"
  shift
  if "$@"; then
    passed=$((passed + 1))
    echo "  ok   $what"
  else
    failed=$((failed + 1))
    echo "  FAIL $what"
  fi
}

# objdump: per function (demangled), the count of sdot and smmla.
for cc in gcc clang; do
  "$objdump" -d -C "$tmp/kernel-$cc.o" | awk -v out="$tmp/isa-$cc.txt" '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
    /\tsdot\t/ { sdot[fn]++ } /\tsmmla\t/ { smmla[fn]++ }
    END {
      for (f in sdot) printf "%s\tsdot\t%d\n", f, sdot[f] > out
      for (f in smmla) printf "%s\tsmmla\t%d\n", f, smmla[f] > out
      close(out)
    }'
  touch "$tmp/isa-$cc.txt"
  count() { awk -F'\t' -v ns="$1" -v op="$2" -v neg="$3" '
    $2 == op && ((index($1, ns) > 0) != (neg == 1)) { n += $3 } END { print n + 0 }' "$tmp/isa-$cc.txt"; }
  n_sdot="$(count 'arm64::dotprod::' sdot 0)"
  n_smmla="$(count 'arm64::i8mm::' smmla 0)"
  other_sdot="$(awk -F'\t' '$2 == "sdot" && index($1, "arm64::dotprod::") == 0 && index($1, "arm64::i8mm::") == 0 { n += $3 }
                END { print n + 0 }' "$tmp/isa-$cc.txt")"
  other_smmla="$(count 'arm64::i8mm::' smmla 1)"
  echo "arm64: $cc objdump: $n_sdot sdot in arm64::dotprod, $n_smmla smmla in arm64::i8mm; elsewhere $other_sdot sdot, $other_smmla smmla"
  check "$cc: the dotprod functions contain sdot ($n_sdot)" test "$n_sdot" -gt 0
  check "$cc: the i8mm functions contain smmla ($n_smmla)" test "$n_smmla" -gt 0
  check "$cc: no other function has sdot or smmla (the rest is armv8-a)" test "$((other_sdot + other_smmla))" -eq 0
done

cases_rc=0
wait "$cases_pid" || cases_rc=$?
cases_pid=
if [ "$cases_rc" -ne 0 ]; then
  echo "arm64: making the cases failed:" >&2
  cat "$tmp/cases.log" >&2
  exit 2
fi
echo "arm64: $(grep -v '^dyw cases:' "$tmp/cases.log") [made in $(cat "$tmp/cases.time") s]"
echo "arm64: $(grep '^dyw cases:' "$tmp/cases.log")"
ncases="$(sed -n 's/^cases: \([0-9]*\) .*/\1/p' "$tmp/cases.log")"
ndcases="$(sed -n 's/^dyw cases: \([0-9]*\) .*/\1/p' "$tmp/cases.log")"

ref_hash=
ref_dhash=
t2="$(now)"
# run CC CPU PATH ("" = the default choice) EXPECT (the path the run must report, or "refused") [REASON: what the
# refusal's Error: line must say]
run() {
  local cc="$1" cpu="$2" path="$3" expect="$4" reason="${5:-}" label out rc=0
  label="$cc -cpu $cpu ${path:+TOOLCHAIN_KERNEL_PATH=$path}"
  label="${label% }"
  [ -n "$path" ] || label="$label (default)"
  out="$(TOOLCHAIN_KERNEL_PATH="$path" "$qemu" -cpu "$cpu" "$tmp/check-$cc" "$tmp/cases.bin" "$label" "$tmp/dyw.bin" \
    2>"$tmp/err")" || rc=$?
  if [ "$expect" = refused ]; then
    echo "arm64: $label: $(grep -m1 '^Error:' "$tmp/err" || echo '(no Error line)')"
    check "$label is refused (exit 3, one Error: line naming $reason, a valid call returns -2)" \
      test "$rc" -eq 3 -a "$(grep -c '^Error:' "$tmp/err")" -eq 1 -a "$(grep -c '^Error:.*'"$reason" "$tmp/err")" -eq 1 \
        -a "$(grep -c 'kernel path refused (the kernel returns -2 for a valid call)' <<<"$out")" -eq 1
    return
  fi
  local summary got hash dsummary dhash
  summary="$(grep -F "path): float32 bound" <<<"$out" || true)"
  dsummary="$(grep -F "path) dyw: float32 bound" <<<"$out" || true)"
  dhash="$(sed -n 's/.*outputs hash \([0-9a-f]*\)$/\1/p' <<<"$dsummary")"
  got="$(sed -n 's/.*: kernel path \([a-z0-9_]*\)$/\1/p' <<<"$out" | head -n 1)"
  hash="$(sed -n 's/.*outputs hash \([0-9a-f]*\)$/\1/p' <<<"$summary")"
  echo "arm64: ${summary:-$label: no result (exit $rc): $(tail -n 3 "$tmp/err" | tr '\n' ' ')}"
  [ -n "$ref_hash" ] || ref_hash="$hash"
  check "$label runs the $expect path" test "$got" = "$expect"
  check "$label: float32 bound on every case" \
    test "$rc" -eq 0 -a "$(grep -c "bound held on $ncases/$ncases cases" <<<"$summary")" -eq 1
  check "$label: every output equal to x86's" test "$(grep -c "bitwise equal to x86 on $ncases/$ncases cases" <<<"$summary")" -eq 1
  check "$label: outputs hash = the generic path's ($ref_hash)" test -n "$hash" -a "$hash" = "$ref_hash"
  echo "arm64: ${dsummary:-$label: no dyw result}"
  [ -n "$ref_dhash" ] || ref_dhash="$dhash"
  check "$label: dyw: float32 bound on every case" \
    test "$rc" -eq 0 -a "$(grep -c "bound held on $ndcases/$ndcases cases" <<<"$dsummary")" -eq 1
  check "$label: dyw: every output equal to x86's" \
    test "$(grep -c "bitwise equal to x86 on $ndcases/$ndcases cases" <<<"$dsummary")" -eq 1
  check "$label: dyw: outputs hash = the generic path's ($ref_dhash)" test -n "$dhash" -a "$dhash" = "$ref_dhash"
  check "$label: dyw_acc: acc + dy W = acc + dx bit for bit on every case (into another buffer and in place)" \
    test "$(grep -c "dyw_acc: acc + dy W equal to acc + dx on $ndcases/$ndcases cases" <<<"$out")" -eq 1
  if [ "$cc" = gcc-pool ]; then
    local chunks
    chunks="$(sed -n 's/.*: rows split over the thread pool in \([0-9]*\) chunks$/\1/p' <<<"$out")"
    echo "arm64: $label: rows split over the thread pool in ${chunks:-no} chunks"
    check "$label: the weight rows were split over the pool" test "${chunks:-0}" -gt 0
  fi
}

for cc in gcc clang; do
  run "$cc" max generic generic   # first: GCC's generic path gives the reference hash
  run "$cc" max neon neon
  run "$cc" max dotprod dotprod
  run "$cc" max i8mm i8mm
  run "$cc" max "" i8mm
  run "$cc" cortex-a76 generic generic
  run "$cc" cortex-a76 neon neon
  run "$cc" cortex-a76 dotprod dotprod
  run "$cc" cortex-a76 "" dotprod
  run "$cc" cortex-a76 i8mm refused 'it lacks FEAT_I8MM (smmla)'
  run "$cc" cortex-a53 generic generic
  run "$cc" cortex-a53 neon neon
  run "$cc" cortex-a53 "" neon
  run "$cc" cortex-a53 dotprod refused 'it lacks FEAT_DotProd (sdot)'
  run "$cc" cortex-a53 i8mm refused 'it lacks FEAT_DotProd (sdot)'
done
for p in generic neon dotprod i8mm; do
  run gcc-pool max "$p" "$p"
done
run gcc max avx512_vnni refused 'it lacks an x86-64 CPU'   # an x86 path on arm64
run gcc max sve refused "unknown kernel path 'sve'"           # not a path name
echo "arm64: ran the qemu checks in $(since "$t2") s; total $(since "$t_start") s"
echo "arm64: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
