#!/usr/bin/env bash
# Instructions the arm64 paths of the int4 kernel execute per call (no arm64 timing here: this is what can be
# measured on this host). Builds toolchain/native/kernels.cpp (+ kernels_arm64.h) with tests/native/arm64_count.cpp
# for aarch64 (GCC by default, CC=clang: clang++-19 --target=aarch64-linux-gnu), runs it under
# `qemu-aarch64 -cpu max -d in_asm,exec,nochain` (every executed translation block logged, unchained) and sums
# the instructions of the executed blocks; a call's count is the run with 2 calls minus the run with 1 (setup
# and the first call's buffer allocations excluded). Prints, per shape and path, the instructions per call and
# per 32 multiply-adds (T x O x I / 32). Needs the cross tools of scripts/check_kernel_arm64.sh (run it first).
#
#   scripts/arm64_kernel_instructions.sh [T,O,I,GROUP ...]   # default: the 0.5B's 896 x 896 and 4864 -> 896
#                                                             # projections at T = 1, 2, 3 and 32, groups 32 / 64 / 128
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(1,896,896,64 1,896,4864,64 1,896,896,32 1,896,896,128 2,896,896,64 3,896,896,64
                                   32,896,896,64 32,896,896,32 32,896,896,128)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
kflags=(-std=c++17 -O3 -ffp-contract=fast -DTOOLCHAIN_NO_EXECUTORCH -Wall -Wno-psabi -march=armv8-a)
if [ "${CC:-gcc}" = clang ]; then
  cxx=(clang++-19 --target=aarch64-linux-gnu)
  link=(clang++-19 --target=aarch64-linux-gnu -fuse-ld=lld)
else
  cxx=(aarch64-linux-gnu-g++)
  link=(aarch64-linux-gnu-g++)
fi
"${cxx[@]}" "${kflags[@]}" -c "$root/toolchain/native/kernels.cpp" -o "$tmp/k.o"
"${cxx[@]}" -std=c++17 -O2 -march=armv8-a -c "$root/tests/native/arm64_count.cpp" -o "$tmp/c.o"
"${link[@]}" -static "$tmp/k.o" "$tmp/c.o" -o "$tmp/count"
echo "compiler: $("${cxx[0]}" --version | head -n 1); qemu-aarch64 -cpu max; $(date -u +%Y-%m-%dT%H:%MZ)"

executed() {   # executed PATH T O I GROUP CALLS -> instructions of the whole run (the log streamed through a fifo)
  rm -f "$tmp/log"
  mkfifo "$tmp/log"
  TOOLCHAIN_KERNEL_PATH="$1" qemu-aarch64 -cpu max -d in_asm,exec,nochain -D "$tmp/log" "$tmp/count" "${@:2}" >/dev/null &
  awk '
    /^IN:/ { inblk = 1; pc = ""; n = 0; next }
    inblk && /^0x[0-9a-f]+:/ { if (pc == "") pc = substr($1, 3, length($1) - 3); n++; next }
    inblk && /^$/ { if (pc != "") { k = pc; sub(/^0+/, "", k); size[k] = n } inblk = 0; next }
    /^Trace / { split($4, f, "/"); p = f[2]; sub(/^0+/, "", p); total += size[p]; next }
    END { printf "%d\n", total }' "$tmp/log"
  wait $!
  rm -f "$tmp/log"
}

printf '%-18s %-8s %14s %12s\n' "T,O,I,group" path "instr/call" "per 32 MACs"
for s in "${shapes[@]}"; do
  IFS=, read -r T O I G <<<"$s"
  for p in generic neon dotprod i8mm; do
    one="$(executed "$p" "$T" "$O" "$I" "$G" 1)"
    two="$(executed "$p" "$T" "$O" "$I" "$G" 2)"
    awk -v s="$s" -v p="$p" -v d="$((two - one))" -v m="$((T * O * I))" \
      'BEGIN { printf "%-18s %-8s %14d %12.2f\n", s, p, d, d / (m / 32) }'
  done
done
