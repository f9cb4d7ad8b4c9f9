#!/usr/bin/env bash
# Programs on the phones' ISA: the aarch64 ExecuTorch runtime under qemu-aarch64, against the x86 runtime.
#
#   bash scripts/check_arm64.sh                        # CI: kernels, every shared trace, the CI programs
#   bash scripts/check_arm64.sh --program DIR [--fp32-twin DIR] [--steps N] [--cpus max,cortex-a76,cortex-a53]
#
# 1. Installs Debian's g++-aarch64-linux-gnu and qemu-user when missing (root + apt-get), fetches the aarch64
#    executorch wheel of the pinned version (pip download --platform manylinux_2_28_aarch64, cached under
#    ~/.cache/toolchain/arm64/), and builds the apps' C++ Module driver (ios/hostcheck/module_check.cpp + the
#    app's kernel probe) stock and fused (+ toolchain/native/kernels.cpp) for aarch64, and natively for x86.
# 2. Runs scripts/check_kernel_arm64.sh (the int4 kernel's arm64 build on random cases) as one case.
# 3. Under qemu-aarch64 at -cpu max (dotprod, i8mm, fp16), cortex-a76 (dotprod), cortex-a53 (neither) runs
#    every shared trace (shared_schemas/traces/*/), stock and fused, and the programs: with --program, DIR;
#    without, the CI set exported here (the tiny preset int4; a Qwen3 and a Llama program of the tiny preset's
#    size, scripts/arm64_checkpoint.py; a --compute fp16 and a --compute int8 program with their fp32 twin). Each
#    session: training
#    steps (full backprop, then LCSB phases chosen at run time), an eval pass, a greedy generation; the x86
#    side is the same driver built natively (scripts/arm64_runtime.py says why).
# Bounds (derived in scripts/arm64_runtime.py's docstring and docs/kernels.md "Programs on aarch64 (qemu)"):
#   exact:   the kernel probe, the calls (count and methods), eval's token count, the integer kernel sums
#            (check_kernel_arm64.sh), and greedy ids wherever x86's logit margin exceeds twice the logit bound;
#   bounded: |arm64 - x86| <= 2 u N(q) max|q_x86| for losses, each state entry, eval loss and logits, u = 2^-24,
#            N(q) the sum of the reduction lengths on q's chain: per training step L (n_f + n_b) + n_h,
#            n_f = 4d + r + hd + T + qd + I, n_b = n_f + T, n_h = 2d + V + T, times the steps the value depends
#            on; Adam params may also differ by their updates' first-order error (up to 2 lr per step where the
#            gradient's sign is noise); an fp16 program adds one 2^-11 rounding per frozen-weight product;
#   fused:   the generation also in lockstep (both drivers on the same inputs, call by call), each call within
#            its own bound (int8 activations make the free run discontinuous);
#   fp16:    with --fp32-twin, on each CPU, the fp16 program's LoRA gradient vs its fp32 twin's, both on
#            aarch64: cosine >= 0.9999, relative L2 <= 1e-2 (docs/benchmarks.md, tests/export/test_compute_fp16.py);
#            on FEAT_FP16 CPUs (XNNPACK's f16 GEMMs accumulate in float16: no usable summation bound) the fp16
#            program's floats are not compared with x86, only the exact checks and this gradient bound.
#   int8:    the stock drivers (x86 and each CPU) must refuse the program at load (missing toolchain kernels);
#            fused, its floats are not compared with x86 (an int8 rounding is discontinuous in its float input),
#            only the exact checks; with --fp32-twin, on each CPU, its LoRA gradient vs the twin's on aarch64:
#            cosine >= 0.999, relative L2 <= 5e-2 (tests/mesp/ops/test_int8.py), and vs x86's int8 gradient:
#            cosine >= 2 * 0.999^2 - 1 = 0.996002 (scripts/arm64_runtime.py derives it).
# Prints one line per case and `arm64: N passed, N failed`; exit 1 on any failure, 2 on bad input, 77
# ("skipped") only when the tools or the wheel cannot be installed (or TOOLCHAIN_ARM64_NO_INSTALL=1 and they
# are missing). Environment: PYTHON (default .venv/bin/python), ARM64_JOBS (CPU levels at once, default cores).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
SKIP=77
source "$root/scripts/arm64_tools.sh"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
die() { echo "Error: $*"; exit 2; }

program= twin= steps= cpus="max,cortex-a76,cortex-a53"
while [ $# -gt 0 ]; do
  case "$1" in
    --program) [ $# -ge 2 ] || die "--program needs a directory"; program="$2"; shift 2 ;;
    --fp32-twin) [ $# -ge 2 ] || die "--fp32-twin needs a directory"; twin="$2"; shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a number"; steps="$2"; shift 2 ;;
    --cpus) [ $# -ge 2 ] || die "--cpus needs a list"; cpus="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ -z "$program" ] || [ -f "$program/manifest.json" ] || die "$program is not an exported program (no manifest.json)"
[ -z "$twin" ] || [ -n "$program" ] || die "--fp32-twin goes with --program"
[ -z "$twin" ] || [ -f "$twin/manifest.json" ] || die "$twin is not an exported program (no manifest.json)"
[ -z "$steps" ] || [[ "$steps" =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer, got $steps"
[ -x "$py" ] || die "no Python at $py (run make test first, or set PYTHON)"

t_start="$(now)"

# ---- 1. tools (the install is scripts/arm64_tools.sh, shared with check_kernel_arm64.sh)
find_tools() {
  cxx="$(command -v aarch64-linux-gnu-g++ || true)"
  qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
}
find_tools
if [ -z "$cxx" ] || [ -z "$qemu" ]; then
  pkgs=()
  [ -n "$cxx" ] || pkgs+=(g++-aarch64-linux-gnu)
  [ -n "$qemu" ] || pkgs+=(qemu-user)
  arm64_install "${pkgs[@]}"   # scripts/arm64_tools.sh (exits 77 when it cannot)
  find_tools
  if [ -z "$cxx" ] || [ -z "$qemu" ]; then
    echo "arm64: skipped: ${pkgs[*]} installed but aarch64-linux-gnu-g++ / qemu-aarch64 are not on PATH"; exit $SKIP
  fi
fi
# qemu's -L: where the aarch64 loader and libc/libstdc++ are (Debian's cross packages put them here)
sysroot=/usr/aarch64-linux-gnu
[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] || { echo "arm64: FAIL: no aarch64 loader in $sysroot/lib"; exit 1; }
echo "arm64: $("$cxx" --version | head -n 1); $("$qemu" --version | head -n 1)"
known_cpus="$("$qemu" -cpu help 2>/dev/null || true)"
for c in ${cpus//,/ }; do
  grep -qw -- "$c" <<<"$known_cpus" || die "--cpus: $qemu has no CPU model '$c' (qemu-aarch64 -cpu help)"
done

# ---- the aarch64 wheel of the pinned executorch (the venv's version), cached
version="$("$py" -c 'import importlib.metadata as m; print(m.version("executorch"))')" \
  || die "executorch is not installed in $py's environment"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/toolchain/arm64"
wheel_dir="$cache/executorch-$version"
if [ ! -f "$wheel_dir/.complete" ]; then
  mkdir -p "$cache"
  t0="$(now)"
  if ! "$py" -m pip download -q --no-deps --platform manylinux_2_28_aarch64 --only-binary=:all: \
      --python-version 3.11 "executorch==$version" -d "$cache" >"$cache/pip.log" 2>&1; then
    echo "arm64: skipped: could not download the aarch64 executorch $version wheel; pip said:"
    tail -n 5 "$cache/pip.log" | sed 's/^/  /'; exit $SKIP
  fi
  whl="$(ls "$cache"/executorch-"$version"-*manylinux_2_28_aarch64.whl | head -n 1)"
  rm -rf "$wheel_dir.tmp" && mkdir -p "$wheel_dir.tmp"
  "$py" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(("executorch/lib/", "executorch/include/"))])' \
    "$whl" "$wheel_dir.tmp"
  touch "$wheel_dir.tmp/.complete"
  rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
  echo "arm64: fetched $(basename "$whl") in $(since "$t0") s -> $wheel_dir"
fi

tmp="$(mktemp -d)"
bg=()
cleanup() {  # the background export job: its children, then itself (by process id)
  for p in "${bg[@]}"; do
    kill $(pgrep -P "$p" 2>/dev/null) "$p" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the CI programs, exported in the background while the drivers build and the traces run
export_program() {  # name, toolchain export args... (scripts/arm64_export.py: every weight matmul on XNNPACK)
  local name="$1"; shift
  local t0; t0="$(now)"
  if (cd "$root" && PYTHONPATH="$root" "$py" "$root/scripts/arm64_export.py" "$@" --out "$tmp/programs/$name") \
      >"$tmp/programs/$name.log" 2>&1; then
    echo "$(since "$t0")" >"$tmp/programs/$name.ok"
  else
    echo "export failed" >"$tmp/programs/$name.failed"
  fi
}
if [ -z "$program" ]; then
  mkdir -p "$tmp/programs"
  small=(--seq-len 16 --rank 4 --prefill-chunk 4)
  (
    set +e
    for fam in qwen3 llama; do
      PYTHONPATH="$root" "$py" "$root/scripts/arm64_checkpoint.py" --family "$fam" "$tmp/checkpoints/$fam" \
        >"$tmp/programs/ck-$fam.log" 2>&1
    done
    export_program tiny --model tiny --init random --optimizer adamw "${small[@]}"
    export_program qwen3 --model "$tmp/checkpoints/qwen3" --optimizer adamw "${small[@]}"
    export_program llama --model "$tmp/checkpoints/llama" --optimizer adamw "${small[@]}"
    export_program tiny-fp16 --model tiny --init random --compute fp16 "${small[@]}"
    export_program tiny-int8 --model tiny --init random --compute int8 "${small[@]}"
    export_program tiny-fp32 --model tiny --init random --no-generate "${small[@]}"
  ) &
  bg+=($!)
fi

# ---- the drivers: module_check + the app's kernel probe, stock and fused, for aarch64 and x86
t1="$(now)"
mkdir -p "$tmp/drivers"
build_driver() {  # isa cxx executorch-dir kernel-flags...
  local isa="$1" cc="$2" et="$3"; shift 3
  local inc=(-Wno-deprecated-declarations -DC10_USING_CUSTOM_GENERATED_MACROS -I"$et/include"
             -I"$et/include/executorch/runtime/core/portable_type/c10" -I"$root/ios/App/Sources/Kernels")
  local libs=(-L"$et/lib" -Wl,--no-as-needed -lexecutorch -lexecutorch_kernels_optimized
              -lexecutorch_kernels_quantized -lexecutorch_backend_xnnpack -Wl,-rpath,"$et/lib")
  # the kernels with the toolchain's flags (toolchain/native/build.py) less -march=native, -fPIC, -shared
  "$cc" -std=c++17 -O3 -ffp-contract=fast "$@" "${inc[@]}" -c "$root/toolchain/native/kernels.cpp" \
    -o "$tmp/drivers/kernels-$isa.o"
  "$cc" -std=c++17 -O1 "${inc[@]}" -c "$root/ios/hostcheck/module_check.cpp" -o "$tmp/drivers/mc-$isa.o"
  "$cc" -std=c++17 -O1 "${inc[@]}" -c "$root/ios/App/Sources/Kernels/ToolchainKernels.cpp" -o "$tmp/drivers/probe-$isa.o"
  "$cc" "$tmp/drivers/mc-$isa.o" "$tmp/drivers/probe-$isa.o" -o "$tmp/drivers/module_check-$isa-stock" "${libs[@]}"
  "$cc" "$tmp/drivers/mc-$isa.o" "$tmp/drivers/probe-$isa.o" "$tmp/drivers/kernels-$isa.o" \
    -o "$tmp/drivers/module_check-$isa-fused" "${libs[@]}"
}
x86_et="$("$py" -c 'import executorch; print(executorch.__path__[0])')"
build_driver arm64 "$cxx" "$wheel_dir/executorch" -march=armv8-a
build_driver x86 "${CXX:-g++}" "$x86_et" -march=native
echo "arm64: built the drivers (aarch64 and x86, stock and fused) in $(since "$t1") s"

passed=0 failed=0
count() {  # rc of a case runner, counts file ("passed failed")
  if [ -f "$2" ]; then
    read -r p f <"$2"; passed=$((passed + p)); failed=$((failed + f))
  fi
  if [ "$1" -ne 0 ] && [ "$1" -ne 1 ]; then failed=$((failed + 1)); fi
}
runtime() {  # kind dir [args...]
  local rc=0
  rm -f "$tmp/counts"
  (cd "$root" && PYTHONPATH="$root" "$py" "$root/scripts/arm64_runtime.py" "$@" --drivers "$tmp/drivers" \
     --qemu "$qemu" --sysroot "$sysroot" --cpus "$cpus" --jobs "${ARM64_JOBS:-$(nproc)}" --counts "$tmp/counts") || rc=$?
  count "$rc" "$tmp/counts"
}

if [ -n "$program" ]; then
  runtime program "$program" ${steps:+--steps "$steps"} ${twin:+--fp32-twin "$twin"}
else
  # ---- 2. the kernel-level check (its own script, one case)
  t2="$(now)"
  krc=0
  bash "$root/scripts/check_kernel_arm64.sh" >"$tmp/kernel.log" 2>&1 || krc=$?
  if [ "$krc" -eq 0 ]; then passed=$((passed + 1)); k=PASS; else failed=$((failed + 1)); k=FAIL; fi
  echo "arm64: $k kernels (scripts/check_kernel_arm64.sh, exit $krc) [$(since "$t2") s]"
  [ "$krc" -eq 0 ] || sed 's/^/         /' "$tmp/kernel.log"
  # ---- 3. every shared trace
  for d in "$root"/shared_schemas/traces/*/; do
    [ -f "$d/trace.json" ] || continue
    runtime trace "$d"
  done
  # ---- the CI programs, each as soon as its export is done
  exported() { [ -f "$tmp/programs/$1.ok" ] || [ -f "$tmp/programs/$1.failed" ]; }
  for name in tiny qwen3 llama tiny-fp16 tiny-int8; do
    while ! exported "$name" && kill -0 "${bg[0]}" 2>/dev/null; do sleep 1; done
    case "$name" in tiny-fp16|tiny-int8)
      while ! exported tiny-fp32 && kill -0 "${bg[0]}" 2>/dev/null; do sleep 1; done ;;
    esac
    if [ ! -f "$tmp/programs/$name.ok" ]; then
      failed=$((failed + 1))
      echo "arm64: FAIL program $name: the export failed:"; tail -n 5 "$tmp/programs/$name.log" | sed 's/^/         /'
      continue
    fi
    echo "arm64: exported $name in $(cat "$tmp/programs/$name.ok") s"
    if [ "$name" = tiny-fp16 ] || [ "$name" = tiny-int8 ]; then
      if [ -f "$tmp/programs/tiny-fp32.ok" ]; then
        runtime program "$tmp/programs/$name" --steps 3 --fp32-twin "$tmp/programs/tiny-fp32"
      else
        failed=$((failed + 1))
        echo "arm64: FAIL program tiny-fp32 (the $name program's twin): the export failed:"
        tail -n 5 "$tmp/programs/tiny-fp32.log" | sed 's/^/         /'
        runtime program "$tmp/programs/$name" --steps 3
      fi
    else
      runtime program "$tmp/programs/$name" --steps 3
    fi
  done
  wait "${bg[0]}" || true
  bg=()
fi
echo "arm64: total $(since "$t_start") s"
echo "arm64: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
