#!/usr/bin/env bash
# The arm64 paths of the int4 kernels (toolchain/native/kernels.cpp + kernels_arm64.h: neon, dotprod, i8mm, and the
# generic path): toolchain_int4_linear_a8 (generation) and toolchain_int4_dyw_a8 (dX = dY W for training), checked
# on this x86-64 host under qemu-aarch64:
#   - built at the apps' baseline (-march=armv8-a) by GCC (aarch64-linux-gnu-g++) and by clang
#     (clang++-19 --target=aarch64-linux-gnu with the GCC cross sysroot, linked by lld), each linked statically
#     with tests/native/arm64_driver.cpp;
#   - objdump: the dotprod functions (namespace arm64::dotprod) contain sdot, the i8mm ones (arm64::i8mm) smmla,
#     and no other function of the library has either (the rest stays armv8-a);
#   - the training step's float32 ops (attention_train, attention_train_backward, swiglu_train, swiglu, rms_norm,
#     online_softmax_stats, exp_sub_rows, lora_backward, lora_rows_backward, lora_linear_a8, lora_linear_a8_rows,
#     rope_train, rope_train_backward, rms_norm_backward: the `--compute int8` step's 14 native ops) on the
#     deterministic cases of tests/native/arm64_train_ops.cpp (odd shapes, partial groups, NaN / inf rows), linked
#     into the same driver, also built natively for this x86-64 host (the flags of
#     toolchain/native/build.py, -march=native): every arm64 run's outputs equal to x86's bit for bit (NaN = NaN;
#     kernels.cpp writes the scalar tails of its float32 sums, and the products RoPE and the RMSNorm backward add, as
#     std::fma, so no compiler or -march rounds them its own way; also built at -march=x86-64-v3, an AVX2-only
#     machine's -march=native, where GCC gets kernels.cpp's f32x16 as two 8-lane halves: the same bits, NaN = NaN,
#     required when this host has AVX2 and FMA), and the ops that call kernels.cpp's `dot`
#     (attention_train, attention_train_backward, lora_backward, lora_rows_backward, lora_linear_a8,
#     lora_linear_a8_rows) and rms_norm_backward (its row sums) within the float32 bound of a float64 reference too
#     (2e-5 x max |exact| per part, the bound tests/native/test_kernel_train.py holds x86 to; the x86 build is held to
#     it too); the hash of all train outputs equal to the x86 build's on every compiler, path, CPU model and
#     thread count; the pooled build at
#     1 and 2 threads ($TOOLCHAIN_TEST_POOL_THREADS): the same hash, every op split over the pool at 2;
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
driver=("$root/tests/native/arm64_driver.cpp" "$root/tests/native/arm64_train_ops.cpp")
t1="$(now)"
"$cxx" "${kflags[@]}" -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-gcc.o"
for src in "${driver[@]}"; do "$cxx" "${dflags[@]}" -c "$src" -o "$tmp/$(basename "$src" .cpp)-gcc.o"; done
"$cxx" -static "$tmp/kernel-gcc.o" "$tmp/arm64_driver-gcc.o" "$tmp/arm64_train_ops-gcc.o" -o "$tmp/check-gcc"
"$clangxx" "${clang_target[@]}" "${kflags[@]}" -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-clang.o"
for src in "${driver[@]}"; do
  "$clangxx" "${clang_target[@]}" "${dflags[@]}" -c "$src" -o "$tmp/$(basename "$src" .cpp)-clang.o"
done
"$clangxx" "${clang_target[@]}" --ld-path="$lld" -static "$tmp/kernel-clang.o" "$tmp/arm64_driver-clang.o" \
  "$tmp/arm64_train_ops-clang.o" -o "$tmp/check-clang"
# The pooled build: kernels.cpp's thread-pool code (TOOLCHAIN_THREADPOOL) against the stand-in pool.
"$cxx" "${kflags[@]}" -DTOOLCHAIN_THREADPOOL -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-gcc-pool.o"
"$cxx" -std=c++17 -O2 -Wall -Wextra -march=armv8-a -c "$root/tests/native/arm64_pool.cpp" -o "$tmp/pool-gcc.o"
"$cxx" -static -pthread "$tmp/kernel-gcc-pool.o" "$tmp/arm64_driver-gcc.o" "$tmp/arm64_train_ops-gcc.o" "$tmp/pool-gcc.o" \
  -o "$tmp/check-gcc-pool"
# The same driver for this x86-64 host: the kernel with toolchain/native/build.py's flags (-march=native).
hostcxx="${HOSTCXX:-g++}"
"$hostcxx" -std=c++17 -O3 -march=native -ffp-contract=fast -DTOOLCHAIN_NO_EXECUTORCH -w \
  -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-x86.o"
for src in "${driver[@]}"; do
  "$hostcxx" -std=c++17 -O2 -ffp-contract=off -Wall -Wextra -c "$src" -o "$tmp/$(basename "$src" .cpp)-x86.o"
done
"$hostcxx" "$tmp/kernel-x86.o" "$tmp/arm64_driver-x86.o" "$tmp/arm64_train_ops-x86.o" -o "$tmp/check-x86"
# And for an AVX2-only x86-64 machine (-march=x86-64-v3, what -march=native gives there; under GCC kernels.cpp's
# f32x16 is then two 8-lane halves): its train ops must give the native build's bits.
"$hostcxx" -std=c++17 -O3 -march=x86-64-v3 -ffp-contract=fast -DTOOLCHAIN_NO_EXECUTORCH -w \
  -c "$root/toolchain/native/kernels.cpp" -o "$tmp/kernel-x86v3.o"
"$hostcxx" "$tmp/kernel-x86v3.o" "$tmp/arm64_driver-x86.o" "$tmp/arm64_train_ops-x86.o" -o "$tmp/check-x86v3"
echo "arm64: compiled the GCC, clang, pooled GCC and x86-64 builds in $(since "$t1") s (beside the making of the cases)"

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

# The train ops on x86-64: the outputs every arm64 run is compared with (the float64 references' bound must hold
# here too), and the generic x86 path's bits equal to the default one's.
x86_out="$("$tmp/check-x86" --train x86 --write "$tmp/train-x86.bin" 2>"$tmp/err")" || true
x86_hash="$(sed -n 's/.* train ops: .*outputs hash \([0-9a-f]*\)$/\1/p' <<<"$x86_out")"
echo "arm64: $(grep -m1 ': kernel path' <<<"$x86_out"): train ops outputs hash ${x86_hash:-none}"
check "x86-64: the train ops hold their float64 bounds" test "$(grep -c '^x86 (.*) train ops passed$' <<<"$x86_out")" -eq 1
x86g_out="$(TOOLCHAIN_KERNEL_PATH=generic "$tmp/check-x86" --train x86-generic --compare "$tmp/train-x86.bin" 2>&1)" || true
check "x86-64 generic path: the train ops' outputs equal the default path's" \
  test "$(grep -c 'train ops: 14 ops, .*, 14/14 ops; differing from x86 within the float64 bound: none;' <<<"$x86g_out")" -eq 1
x86v3_out="$("$tmp/check-x86v3" --train x86-64-v3 --compare "$tmp/train-x86.bin" 2>&1)" || true
x86v3_hash="$(sed -n 's/.* train ops: .*outputs hash \([0-9a-f]*\)$/\1/p' <<<"$x86v3_out")"
echo "arm64: x86-64-v3 build ($hostcxx -march=x86-64-v3) train ops outputs hash ${x86v3_hash:-none}"
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  check "x86-64-v3 build (AVX2, no AVX-512): the train ops' outputs equal the -march=native build's" \
    test "$(grep -c 'train ops: 14 ops, .*, 14/14 ops; differing from x86 within the float64 bound: none;' <<<"$x86v3_out")" -eq 1 \
      -a -n "$x86v3_hash" -a "$x86v3_hash" = "$x86_hash"
fi

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
    "$tmp/train-x86.bin" 2>"$tmp/err")" || rc=$?
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
  train_checks "$cc" "$label" "$out"
  if [ "$cc" = gcc-pool ]; then
    local chunks
    chunks="$(sed -n 's/.*: rows split over the thread pool in \([0-9]*\) chunks$/\1/p' <<<"$out")"
    echo "arm64: $label: rows split over the thread pool in ${chunks:-no} chunks"
    check "$label: the weight rows were split over the pool" test "${chunks:-0}" -gt 0
  fi
}

# train_checks CC LABEL OUTPUT: the train ops of one run (the driver's "train" lines): every op equal to x86's
# outputs bit for bit (and, the ops with a float64 reference, within its bound), and the hash of all train outputs
# equal to the x86 build's.
train_checks() {
  local label="$2" out="$3" summary thash
  summary="$(grep -F "path) train ops: " <<<"$out" || true)"
  thash="$(sed -n 's/.*outputs hash \([0-9a-f]*\)$/\1/p' <<<"$summary")"
  echo "arm64: ${summary:-$label: no train ops result}"
  check "$label: train ops: every op passed (bits equal to x86, float64 bounds)" \
    test "$(grep -c "path) train ops passed$" <<<"$out")" -eq 1
  check "$label: train ops: every output equal to x86's bit for bit" \
    test "$(grep -c "14/14 ops; differing from x86 within the float64 bound: none;" <<<"$summary")" -eq 1
  check "$label: train ops hash = the x86 build's (${x86_hash:-none})" test -n "$thash" -a "$thash" = "$x86_hash"
}

# train_threads N: the pooled build's train ops alone at N pool threads (-cpu max, the default path): the same
# hash as GCC's other runs; at 2 threads every op's calls were split over the pool, at 1 none.
train_threads() {
  local n="$1" label="gcc-pool -cpu max TOOLCHAIN_TEST_POOL_THREADS=$1" out rc=0 split
  out="$(TOOLCHAIN_TEST_POOL_THREADS="$n" "$qemu" -cpu max "$tmp/check-gcc-pool" --train "$label" --compare \
    "$tmp/train-x86.bin" 2>"$tmp/err")" || rc=$?
  train_checks gcc "$label" "$out"
  split="$(grep -c "path) train [a-z0-9_]*: .*pool chunks [1-9][0-9]*; hash" <<<"$out" || true)"
  echo "arm64: $label: $split of 14 train ops split over the pool (exit $rc)"
  if [ "$n" -gt 1 ]; then
    check "$label: every train op was split over the pool" test "$rc" -eq 0 -a "$split" -eq 14
  else
    check "$label: no train op used the pool" test "$rc" -eq 0 -a "$split" -eq 0
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
train_threads 1
train_threads 2
run gcc max avx512_vnni refused 'it lacks an x86-64 CPU'   # an x86 path on arm64
run gcc max sve refused "unknown kernel path 'sve'"           # not a path name
echo "arm64: ran the qemu checks in $(since "$t2") s; total $(since "$t_start") s"
echo "arm64: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
