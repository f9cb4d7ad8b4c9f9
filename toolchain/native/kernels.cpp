// The fused generation methods' native kernels (ExecuTorch custom ops; their PyTorch references are in
// toolchain/mesp/ops/quant.py, toolchain/mesp/decode.py and toolchain/mesp/decode_ops.py):
//   toolchain::int4_linear_a8     y = x W^T for group-wise int4 W
//   toolchain::attention_decode   softmax attention of C tokens over the KV cache and themselves
//   toolchain::lora_linear_a8     residual + (x W^T + bias + s (x A^T) B^T): a projection with its LoRA pair
//   toolchain::rms_norm, toolchain::rope_heads, toolchain::swiglu   the element-wise rest of a block
// (a decode layer is 13 calls of these and one permute_copy; the stock graph of the same layer is 173 portable ops);
// and for training (`--compute int8`):
//   toolchain::int4_dyw_a8       dX = dY W for the same int4 W: the gradient of x W^T with int8 products
//   toolchain::int4_dyw_a8_acc   acc + dY W[row0 : row0 + o]: the same product on rows of W read in place, added to
//                                a gradient already held (one addition, as the panels store: the MLP chunks' dn2
//                                and da, the head's running sum)
//   toolchain::lora_linear_a8_rows   lora_linear_a8 on rows of W and B read in place (an MLP chunk's gate / up)
//   toolchain::attention_train, toolchain::attention_train_backward   causal attention of the whole sequence
//                                and its gradients (float32, over the thread pool: the step's float32 rest)
//   toolchain::swiglu_train      an MLP chunk's SwiGLU recomputed with its gradients, one pass
//   toolchain::online_softmax_stats, toolchain::exp_sub_rows   the LM head chunk's online softmax
//   toolchain::lora_backward, toolchain::lora_rows_backward   a projection's LoRA gradients and dx + dh A; an
//                                MLP chunk's LoRA rows
//
// toolchain::int4_linear_a8: y = x W^T for group-wise int4 W, read in place (no float copy of W), with x
// quantized to int8 per row and group on the fly (W4A8, as ExecuTorch's own 8da4w LLM programs compute).
//
// The layout is the weights file's (toolchain/mesp/ops/quant.py): W [o, i] as q [o, i/2] bytes, byte j of
// a row holding column 2j in its high nibble and 2j + 1 in its low one, value n - 8 for nibble n, and a
// float scale sw per row and group of `group` columns, scales [o, ng], ng = ceil(i / group) (the last group
// may be partial). The op's definition (the reference is `int4_linear_a8_reference` in quant.py):
//   per row t of x and group g:  sa[t, g] = max_k |x[t, k]| / 127 over the group's columns
//                                a[t, k] = round_half_even(x[t, k] / sa[t, g]) in [-127, 127] (0 where sa is 0)
//   per output r:                isum[t, r, g] = sum_k a[t, k] * (n[r, k] - 8)      (exact, in int32)
//                                y[t, r] = sum_g float(isum) * (sw[r, g] * sa[t, g])
// The integer sums are exact in any order, so every path gives the same isum. The float sum is in one fixed
// order on every machine: group g goes into lane g mod 16 with a fused multiply-add (groups in increasing
// order), then the 16 lanes are summed as a fixed pairwise tree. So every kernel path gives the generic path's
// bits (tests/native/test_kernel_paths.py on x86; the arm64 paths and the generic one under qemu, against this
// host's x86 output: scripts/check_kernel_arm64.sh); docs/kernels.md says which path runs where.
//
// dX for training, toolchain::int4_dyw_a8: dx [T, i] = dy [T, o] W, the same W and layout (the reference is
// `int4_dyw_a8_reference` in quant.py). The reduction runs over W's rows n, along which W's scales vary, so W^T is
// requantized to int8 once per call with one scale per (k-group g, block b of `group` consecutive n), and dy is
// rounded once per (row, block), as x above:
//   swt[g, b] = max_{n in b} |sw[n, g]| / 15.875 (float32; 15.875 = 127 / 8, so the largest int4 value 8 of the
//               block's largest scale maps to 127)
//   e[n, g]   = sw[n, g] / swt[g, b] (float32; 0 where swt is 0)
//   Wt8[n, k] = round_half_even(e[n, g] * (n[n, k] - 8)) in [-127, 127] (the product exact)
//   per row t and block b:  sa[t, b] = max_n |dy[t, n]| / 127, a[t, n] = round_half_even(dy / sa) in [-127, 127]
//                           (0 where sa is 0 or dy / sa is not a number; sa = NaN where the block holds a NaN or
//                           an infinity)
//   isum[t, b, k] = sum_{n in b} a[t, n] * Wt8[n, k]                        (exact, in int32)
//   dx[t, k] = sum_b float(isum[t, b, k]) * c, c = sa[t, b] * swt[g, b]: blocks in increasing order by fused
//   multiply-adds from 0 (one chain per output).
// Computed so (toolchain_int4_dyw_a8 below): dy is rounded per (row, block) (the path's fold_row with unit scales,
// the scalar loop for the rest) and laid out block-major; per (k-group, n) a table of the 16 int8 values its
// nibbles map to; then per panel of 16 columns k the panel's Wt8 is packed (table lookups: pshufb on x86) in
// dwords of 16 lanes (o * 16 bytes: L2) and multiplied with every row of dy by the path's panel kernel (64-byte
// vpdpbusd with broadcast dwords of dy on AVX-512 VNNI, 2 x 256-bit on AVX-VNNI / AVX2, the generic loop
// elsewhere). The integer sums are exact, c is one float32 product and the block sum has one order on every path,
// so every path gives the generic bits. With one NaN constant (sa) every NaN of dx is the same NaN, whatever
// order a path adds in. Threads: the panels are split over the pool; each is computed the same way by any thread.
// W's scales must be finite (the weights file's are). tests/native/test_kernel_dyw.py (x86 paths, threads, the
// ExecuTorch op), scripts/check_kernel_arm64.sh (arm64).
//
// Kernel paths, chosen once at load (KernelPath below; docs/kernels.md): the best the CPU has, or the one
// $TOOLCHAIN_KERNEL_PATH names (for testing):
//   generic       the portable C++ below (any CPU; vectorized by the compiler as far as it can)
//   avx2          x86 AVX2 + FMA: 256-bit vpmaddubsw + vpmaddwd            (kernels_x86.h)
//   avx_vnni      x86 AVX-VNNI (Intel since Alder Lake): 256-bit vpdpbusd  (kernels_x86.h)
//   avx512_vnni   x86 AVX-512 F/BW/VL/DQ + VNNI: 512-bit vpdpbusd           (kernels_x86.h)
//   neon          arm64 baseline Advanced SIMD: widening smull / smlal      (kernels_arm64.h, aarch64 builds)
//   dotprod       arm64 FEAT_DotProd: sdot                                   (kernels_arm64.h)
//   i8mm          arm64 FEAT_I8MM: smmla 2 x 2 tiles for T >= 2, dotprod's rows for decode (kernels_arm64.h)
// A path the CPU (or the build) lacks, or an unknown name, is refused, never replaced by another, and nothing is
// printed: every int4 call returns -2 (not 0, not -1: -1 is bad arguments) and toolchain_kernel_path_error() says
// what is missing ("kernel path i8mm is not available on this CPU: it lacks FEAT_I8MM (smmla)");
// toolchain_kernel_path() keeps naming the path chosen before (at load: the CPU's best). A caller with a user
// turns the refusal into one "Error:" line and a non-zero exit (load_kernels() raises KernelUnavailable;
// tests/native/arm64_driver.cpp prints it).
// Each x86 path is compiled for its own instruction set (target regions) and each arm64 one with a target
// attribute, so one library holds them all whatever -march the rest is built with (the apps: armv8-a). The x86
// vector paths cover groups of 32, 64 and 128 columns (other groups take the generic rows; the arm64 ones any
// multiple of 32 columns) with three kernels each: decode (T = 1) streams the weight rows past one row of x;
// row tiles (T = 2..9) share each weight load among up to 4 rows of x; the broadcast kernel (a prefill chunk)
// puts weight rows in the vector lanes (16 in AVX-512, 8 per register in 256 bits), gathers their group
// bytes into registers once and multiplies every row of x with its 4-byte dwords broadcast. The AVX-512 one:
// 64 weight bytes (128 weights) are split into their high and low nibbles (0..15, unsigned) and multiplied
// into the even / odd columns of the int8 x with vpdpbusd (64 products per instruction); 4-lane partial sums
// are folded into 16 group sums per block of 16 groups with permutes, and the correction for the nibble
// offset (- 8 sum_k a[t, k] per group) is subtracted once per group.
//
// Threads: the weight rows of a call are split in chunks of 16 over as many threads as the runtime's thread pool has
// (ExecuTorch's, the one XNNPACK uses, when built with TOOLCHAIN_THREADPOOL; the units run on this library's own
// workers, SpinPool below); rows are independent, so the bits are the same.
//
// Built by toolchain/native/build.py (g++ -O3 -march=native, against the executorch wheel's headers,
// libexecutorch and libexecutorch_threadpool) for the host, and by the apps' native builds (android/, ios/)
// for arm64. Registers the ExecuTorch kernels `toolchain::<op>.out` of the ops above at load;
// `toolchain_<op>` are the same computations as C functions for the kernel tests, with
// toolchain_kernel_path() / toolchain_select_kernel_path() / toolchain_kernel_threads() beside them.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>   // getpid (the kernels' workers: a forked child starts its own)

#if defined(__x86_64__) || defined(__i386__)
#define TOOLCHAIN_X86 1   // kernels_x86.h: the avx2, avx_vnni and avx512_vnni paths, chosen at run time
#endif

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The kernel path: chosen once at load, the best this CPU has, or $TOOLCHAIN_KERNEL_PATH=<name> (for testing; a
// path the CPU lacks is refused: every kernel call then returns -2 and toolchain_kernel_path_error() says why,
// never a silent fallback). The same names on every platform; a path of another architecture is "lacking" here.
enum class KernelPath { generic, avx2, avx_vnni, avx512_vnni, neon, dotprod, i8mm };
constexpr const char* kKernelPathNames[] = {"generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm"};
constexpr KernelPath kKernelPathPreference[] = {KernelPath::avx512_vnni, KernelPath::avx_vnni, KernelPath::avx2,
                                                KernelPath::i8mm, KernelPath::dotprod, KernelPath::neon,
                                                KernelPath::generic};

const char* kernel_path_missing(KernelPath p);   // nullptr when this CPU runs p, else what it lacks (below)

}  // namespace

#if defined(__aarch64__)
#include "kernels_arm64.h"   // the neon / dotprod / i8mm paths and their run-time CPU checks (needs KernelPath)
#endif

namespace {

struct KernelPathState {
  KernelPath path = KernelPath::generic;
  std::string error;   // non-empty: the forced path cannot run here

  KernelPathState() {
    for (KernelPath p : kKernelPathPreference)
      if (kernel_path_missing(p) == nullptr) {
        path = p;
        break;
      }
    const char* forced = std::getenv("TOOLCHAIN_KERNEL_PATH");
    if (forced != nullptr && *forced != '\0') error = select(forced);
  }
  // "" after choosing `name`, else why not (the state is then unchanged).
  std::string select(const char* name) {
    for (size_t i = 0; i < sizeof kKernelPathNames / sizeof *kKernelPathNames; ++i)
      if (std::strcmp(name, kKernelPathNames[i]) == 0) {
        if (const char* missing = kernel_path_missing(static_cast<KernelPath>(i)))
          return std::string("kernel path ") + name + " is not available on this CPU: it lacks " + missing;
        path = static_cast<KernelPath>(i);
        return "";
      }
    std::string known;
    for (const char* n : kKernelPathNames) known += std::string(known.empty() ? "" : ", ") + n;
    return std::string("unknown kernel path '") + name + "' (known: " + known + ")";
  }
};

KernelPathState& kernel_path_state() {
  static KernelPathState state;
  return state;
}
const bool kKernelPathChosenAtLoad = (kernel_path_state(), true);

constexpr int64_t L = 16;   // float accumulator lanes (group g -> lane g mod 16)
constexpr int64_t TT = 4;   // rows of x per weight load

// Lanes summed pairwise: ((a0 + a8) + (a4 + a12)) + ... (a fixed tree).
inline float lane_sum(const float* a) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX512F__)
// GCC on x86 without AVX-512 (an AVX2 machine's -march=native): GCC 12 lowers a 64-byte vector type it has no
// register for through the stack and general registers (attention_train took 10x the AVX-512 build's CPU time), so
// there f32x16 is two 8-lane halves (lanes 0..7, 8..15: the same 64 bytes in the same order) with the operators the
// code uses, each lane-wise on both halves, moved by load16 / store16: every lane runs the same IEEE operations (and
// GCC fuses the same multiply-adds, -ffp-contract=fast acting after inlining), so the bits are the vector type's.
// scripts/check_kernel_arm64.sh builds this case (-march=x86-64-v3) and requires the native build's bits
// (docs/kernels.md#train-ops-avx2). Elsewhere (clang, AVX-512, arm64) the vector type, as before.
#define TOOLCHAIN_F32X16_HALVES 1
typedef float f32x8 __attribute__((vector_size(32)));
struct f32x16 {
  f32x8 lo, hi;
  float& operator[](int64_t l) { return l < 8 ? lo[l] : hi[l - 8]; }   // lane l (GCC: a vector's lane is an lvalue)
  float operator[](int64_t l) const { return l < 8 ? lo[l] : hi[l - 8]; }
  f32x16 operator-() const { return {-lo, -hi}; }
  f32x16& operator+=(const f32x16& b) {
    lo += b.lo;
    hi += b.hi;
    return *this;
  }
};
static_assert(sizeof(f32x16) == 64, "f32x16: 16 floats, no padding");
// 16 floats from / to memory by halves (a memcpy of the whole struct goes through the stack in 16-byte pieces).
inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v.lo, p, sizeof v.lo);
  std::memcpy(&v.hi, p + 8, sizeof v.hi);
  return v;
}
inline void store16(float* p, const f32x16& v) {
  std::memcpy(p, &v.lo, sizeof v.lo);
  std::memcpy(p + 8, &v.hi, sizeof v.hi);
}
#define TOOLCHAIN_F32X16_OP(op)                                                                                 \
  inline f32x16 operator op(const f32x16& a, const f32x16& b) { return {a.lo op b.lo, a.hi op b.hi}; }       \
  inline f32x16 operator op(const f32x16& a, float b) { return {a.lo op b, a.hi op b}; }                     \
  inline f32x16 operator op(float a, const f32x16& b) { return {a op b.lo, a op b.hi}; }
TOOLCHAIN_F32X16_OP(+)
TOOLCHAIN_F32X16_OP(-)
TOOLCHAIN_F32X16_OP(*)
TOOLCHAIN_F32X16_OP(/)
#undef TOOLCHAIN_F32X16_OP
#else
typedef float f32x16 __attribute__((vector_size(64)));   // GCC / Clang vector extensions: 16 lanes
inline f32x16 load16(const float* p) {   // 16 floats from / to memory
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, const f32x16& v) { std::memcpy(p, &v, sizeof v); }
#endif

// x quantized per row and group: int8 even / odd columns (each row padded with zeros to `stride` bytes),
// sa and 8 * sum_k a per group (padded with zeros to `gstride` groups).
struct QuantizedX {
  int64_t stride = 0, gstride = 0;
  int64_t rows = -1, cols = -1, groups = -1;   // the shape of the last resize()
  std::vector<int8_t> even, odd;
  std::vector<int8_t> teven, todd;   // the same bytes per block of 16 groups of gb bytes, dword k of group y at
                                     // (k * 16 + y) * 4: what rows_vnni_tiles multiplies (transposed())
  std::vector<float> sa;
  std::vector<int32_t> corr;

  // Zeroed buffers for T rows of `in` columns (in even) in ng groups, rows padded to pad_bytes bytes. keep: when
  // the shape is the one of the last resize, only the padding is known zero (a caller that overwrites every
  // row's in / 2 bytes and ng groups: toolchain_int4_dyw_a8's blocks).
  void resize(int64_t T, int64_t in, int64_t ng, int64_t pad_bytes, bool keep = false) {
    const int64_t half = in / 2;
    const int64_t new_stride = (half + pad_bytes - 1) / pad_bytes * pad_bytes, new_gstride = (ng + L - 1) / L * L;
    if (keep && new_stride == stride && new_gstride == gstride && rows == T && cols == in && groups == ng) return;
    stride = new_stride;
    gstride = new_gstride;
    rows = T, cols = in, groups = ng;
    even.assign(static_cast<size_t>(T * stride), 0);
    odd.assign(static_cast<size_t>(T * stride), 0);
    sa.assign(static_cast<size_t>(T * gstride), 0.0f);
    corr.assign(static_cast<size_t>(T * gstride), 0);
  }

  // Row t: xt [in] quantized per group into the buffers (after resize()), groups g0 .. ng - 1: every byte of the
  // row's in / 2 and every group's sa and corr written (so a resize(..., keep = true) before it is enough). group16:
  // the path's vector quantization of a group of a multiple of 16 columns (the same values as the scalar loop below),
  // or nullptr.
  void quantize_row(const float* xt, int64_t t, int64_t in, int64_t group, int64_t ng,
                    void (*group16)(QuantizedX&, const float*, int64_t, int64_t, int64_t, int64_t), int64_t g0 = 0) {
    for (int64_t g = g0; g < ng; ++g) {
      const int64_t k0 = g * group, k1 = std::min(in, k0 + group);
      if (group16 != nullptr && (k1 - k0) % 16 == 0) {   // whole vectors of 16 columns
        group16(*this, xt, k0, k1, t, g);
        continue;
      }
      float amax = 0.0f;
      bool nan = false;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = std::fabs(xt[k]);
        nan = nan || v != v;
        amax = v > amax ? v : amax;
      }
      const float s = nan ? NAN : amax / 127.0f;
      int32_t sum = 0;
      for (int64_t k = k0; k < k1; ++k) {
        float r = s > 0.0f ? std::nearbyint(xt[k] / s) : 0.0f;   // ties to even (the default rounding mode)
        r = r != r ? 0.0f : std::min(127.0f, std::max(-127.0f, r));
        const int8_t a = static_cast<int8_t>(r);
        (k % 2 ? odd : even)[static_cast<size_t>(t * stride + k / 2)] = a;
        sum += a;
      }
      sa[static_cast<size_t>(t * gstride + g)] = s;
      corr[static_cast<size_t>(t * gstride + g)] = 8 * sum;
    }
  }

  // teven / todd for groups of gb bytes (16, 32 or 64): within each block of 16 groups, dword k of group y
  // (bytes 4k .. 4k + 3 of the group) moves to dword k * 16 + y of the block.
  void transposed(int64_t T, int64_t gb) {
    teven.assign(even.size(), 0);
    todd.assign(odd.size(), 0);
    const int64_t block = L * gb, dwords = gb / 4;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < stride; b += block)
        for (int64_t y = 0; y < L; ++y)
          for (int64_t k = 0; k < dwords; ++k) {
            const size_t from = static_cast<size_t>(t * stride + b + y * gb + 4 * k);
            const size_t to = static_cast<size_t>(t * stride + b + (k * L + y) * 4);
            std::memcpy(&teven[to], &even[from], 4);
            std::memcpy(&todd[to], &odd[from], 4);
          }
  }
};

// One output row r for rows t0 .. t0 + NT - 1 of x, any group: per group the integer sum, then the lanes.
template <int NT>
void row_generic(const QuantizedX& a, int64_t t0, const uint8_t* __restrict q, const float* __restrict s,
                 int64_t half, int64_t gb, int64_t ng, float* y, int64_t ystride) {
  float acc[NT][L] = {};
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t j0 = g * gb, j1 = std::min(half, j0 + gb);
    for (int t = 0; t < NT; ++t) {
      const int8_t* __restrict xe = a.even.data() + (t0 + t) * a.stride;
      const int8_t* __restrict xo = a.odd.data() + (t0 + t) * a.stride;
      int32_t isum = 0;
      for (int64_t j = j0; j < j1; ++j)
        isum += static_cast<int32_t>(q[j] >> 4) * xe[j] + static_cast<int32_t>(q[j] & 15) * xo[j];
      const size_t gi = static_cast<size_t>((t0 + t) * a.gstride + g);
      isum -= a.corr[gi];
      const float c = s[g] * a.sa[gi];
      acc[t][g % L] = std::fma(static_cast<float>(isum), c, acc[t][g % L]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ystride] = lane_sum(acc[t]);
}

#ifdef TOOLCHAIN_X86
#include "kernels_x86.h"
#endif

const char* kernel_path_missing(KernelPath p) {
  switch (p) {
    case KernelPath::generic: return nullptr;
#ifdef TOOLCHAIN_X86
    case KernelPath::avx2: return x86_cpu().missing_avx2();
    case KernelPath::avx_vnni: return x86_cpu().missing_avx_vnni();
    case KernelPath::avx512_vnni: return x86_cpu().missing_avx512_vnni();
    default: return "an arm64 CPU (this is x86)";
#else
    case KernelPath::avx2:
    case KernelPath::avx_vnni:
    case KernelPath::avx512_vnni: return "an x86-64 CPU";
#if defined(__aarch64__)
    case KernelPath::neon:
    case KernelPath::dotprod:
    case KernelPath::i8mm: return arm64::missing(p);   // hwcaps / sysctl, and the compiler's intrinsics
#endif
    default: return "its kernels in this build";
#endif
  }
}


// All o output rows for rows t0 .. t0 + NT - 1 of x, the generic path.
template <int NT>
void rows(const QuantizedX& a, int64_t t0, const uint8_t* q, const float* s, int64_t half, int64_t gb, int64_t ng,
          int64_t o, float* y, int64_t ystride) {
  for (int64_t r = 0; r < o; ++r) row_generic<NT>(a, t0, q + r * half, s + r * ng, half, gb, ng, y + r, ystride);
}

// Outputs n0 .. n0 + nb - 1 (nb <= NB) of one row of toolchain_lora_linear_a8, in registers: d[k] = sum_j h[j]
// B[n0 + k, j] as fused multiply-adds in increasing j (from 0), then v = y[k] (+ bias[k]) (+ s d[k]),
// residual[k] + v; B[n0 + k, j] = bt[j * sj + k * SK] (b transposed: sj = o, SK = 1; b itself: sj = 1, SK = r).
// Element-wise, so neither the block size nor the layout changes any bits.
template <int NB, int64_t SK>
inline void lora_epilogue(float* __restrict y, const float* __restrict bias, const float* __restrict h,
                          const float* __restrict bt, int64_t sj, int64_t r, float s, const float* __restrict residual,
                          int64_t nb) {
  float v[NB], d[NB];
  for (int k = 0; k < NB; ++k) v[k] = k < nb ? y[k] : 0.0f;
  if (bias != nullptr)
    for (int k = 0; k < NB; ++k) v[k] = v[k] + (k < nb ? bias[k] : 0.0f);
  if (h != nullptr) {
    for (int k = 0; k < NB; ++k) d[k] = 0.0f;
    for (int64_t j = 0; j < r; ++j) {
      const float hj = h[j];
      const float* bj = bt + j * sj;
      for (int k = 0; k < NB; ++k) d[k] = std::fma(hj, k < nb ? bj[k * SK] : 0.0f, d[k]);
    }
    for (int k = 0; k < NB; ++k) v[k] = v[k] + s * d[k];
  }
  if (residual != nullptr)
    for (int k = 0; k < NB; ++k) v[k] = (k < nb ? residual[k] : 0.0f) + v[k];
  for (int k = 0; k < nb; ++k) y[k] = v[k];
}

constexpr int LORA_BLOCK = 64;


#if defined(__aarch64__)
// The arm64 paths' quantization of one group (NEON; the same values as the scalar loop): QuantizedX::build calls it
// for groups of a multiple of 16 columns, as x86's group16 (arm64::quantize_group takes any multiple of 8).
void arm64_group16(QuantizedX& a, const float* xt, int64_t k0, int64_t k1, int64_t t, int64_t g) {
  const size_t b = static_cast<size_t>(t * a.stride + k0 / 2), gi = static_cast<size_t>(t * a.gstride + g);
  arm64::quantize_group(xt, k0, k1, &a.even[b], &a.odd[b], &a.sa[gi], &a.corr[gi]);
}
#endif

// The vector quantization of x's groups for `path` (nullptr: the scalar loop).
using Group16 = void (*)(QuantizedX&, const float*, int64_t, int64_t, int64_t, int64_t);
Group16 group16_of(KernelPath path) {
  switch (path) {
#ifdef TOOLCHAIN_X86
    case KernelPath::avx512_vnni: return x86_avx512::group16;
    case KernelPath::avx_vnni: return x86_avx_vnni::group16;
    case KernelPath::avx2: return x86_avx2::group16;
#endif
#if defined(__aarch64__)
    case KernelPath::neon:
    case KernelPath::dotprod:
    case KernelPath::i8mm: return arm64_group16;
#endif
    default: return nullptr;
  }
}

#if defined(__aarch64__)
// The arm64 paths' fold + rounding of row t for toolchain_int4_dyw_a8 (NEON; the scalar loop's values): the whole
// blocks of a group of a multiple of 16 n, up to 256.
int64_t arm64_fold_row(QuantizedX& a, const float* dy, const float* s, int64_t o, int64_t group, int64_t t) {
  if (group % 16 != 0 || group > 256) return 0;
  const int64_t nb = o / group;
  for (int64_t b = 0; b < nb; ++b) {
    const size_t at = static_cast<size_t>(t * a.stride + b * group / 2), gi = static_cast<size_t>(t * a.gstride + b);
    arm64::fold_block(dy + b * group, s + b * group, group, &a.even[at], &a.odd[at], &a.sa[gi], &a.corr[gi]);
  }
  return nb;
}

// toolchain_int4_dyw_a8 on the arm64 paths (kernels.cpp's dyw_panel_generic has the definition, the layouts and
// the order; the same integer sums, products and fused multiply-adds, so its bits): whole blocks of a panel packed
// with NEON (tbl through the row's table, as x86_ssse3::dyw_pack_block), and the panel product with the block's
// bytes in L1 and the rows of dy in order: neon by widening multiplies (smull / smull2, a product of two int8 is
// at most 127 * 127 in 16 bits) and sadalp into 32-bit pairs, dotprod (and i8mm's CPUs) by sdot with the row's
// dword broadcast. Any group (a block's halves are whole dwords, zero-padded).
void arm64_dyw_pack_block(const uint8_t* __restrict q, int64_t half, int64_t k0, int64_t n0, int64_t G,
                          const int8_t* __restrict lut, uint8_t /*flip: 0 here*/, uint8_t* __restrict dst) {
  for (int64_t m = 0; m < G; m += 4) {
    int8x16_t v[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + m + i;
      const uint8x8_t x = vld1_u8(q + n * half + k0 / 2);
      const uint8x8x2_t z = vzip_u8(vshr_n_u8(x, 4), vand_u8(x, vdup_n_u8(15)));   // nibbles in column order
      v[i] = vqtbl1q_s8(vld1q_s8(lut + n * 16), vcombine_u8(z.val[0], z.val[1]));
    }
    const int16x8_t a = vreinterpretq_s16_s8(vzip1q_s8(v[0], v[1])), b = vreinterpretq_s16_s8(vzip2q_s8(v[0], v[1]));
    const int16x8_t c = vreinterpretq_s16_s8(vzip1q_s8(v[2], v[3])), d = vreinterpretq_s16_s8(vzip2q_s8(v[2], v[3]));
    int8_t* out = reinterpret_cast<int8_t*>(dst + (m / 4) * 64);
    vst1q_s8(out, vreinterpretq_s8_s16(vzip1q_s16(a, c)));        // lanes 0..3
    vst1q_s8(out + 16, vreinterpretq_s8_s16(vzip2q_s16(a, c)));   // lanes 4..7
    vst1q_s8(out + 32, vreinterpretq_s8_s16(vzip1q_s16(b, d)));   // lanes 8..11
    vst1q_s8(out + 48, vreinterpretq_s8_s16(vzip2q_s16(b, d)));   // lanes 12..15
  }
}

// acc[t] (16 floats per row of dy) += float(isum) * (sa * swt) of block b, lanes 4q .. 4q + 3 from isum[q].
inline void arm64_dyw_accumulate(float* acc, const int32x4_t* isum, float sa, const float* sw) {
  const float32x4_t sv = vdupq_n_f32(sa);
  for (int q = 0; q < 4; ++q)
    vst1q_f32(acc + 4 * q, vfmaq_f32(vld1q_f32(acc + 4 * q), vcvtq_f32_s32(isum[q]), vmulq_f32(sv, vld1q_f32(sw + 4 * q))));
}

// dx = the chains, or add + the chains (toolchain_int4_dyw_a8_acc; add the first operand: one rounding).
inline void arm64_dyw_store(const float* acc, int64_t T, const float* add, float* dx, int64_t ldx, int64_t nk) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < nk; ++r) dx[t * ldx + r] = add == nullptr ? acc[t * 16 + r] : add[t * ldx + r] + acc[t * 16 + r];
}

void arm64_dyw_panel_neon(const int8_t* __restrict ab, const float* __restrict sa, int64_t T, int64_t nb, int64_t gp,
                          const uint8_t* __restrict wp, const float* __restrict swp, const float* add, float* dx,
                          int64_t ldx, int64_t nk) {
  thread_local std::vector<float> acc_buffer;
  acc_buffer.assign(static_cast<size_t>(T * 16), 0.0f);
  float* acc = acc_buffer.data();
  const int64_t D = gp / 4;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* wb = reinterpret_cast<const int8_t*>(wp) + b * D * 64;
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* x = ab + (b * T + t) * gp;
      int32x4_t lo[4], hi[4];
      for (int q = 0; q < 4; ++q) lo[q] = hi[q] = vdupq_n_s32(0);
      for (int64_t d = 0; d < D; ++d) {
        int32_t v;
        std::memcpy(&v, x + 4 * d, 4);
        const int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(v));
        for (int q = 0; q < 4; ++q) {
          const int8x16_t w = vld1q_s8(wb + d * 64 + 16 * q);
          lo[q] = vpadalq_s16(lo[q], vmull_s8(vget_low_s8(w), vget_low_s8(av)));   // lanes 4q, 4q + 1: 2 pairs each
          hi[q] = vpadalq_s16(hi[q], vmull_high_s8(w, av));                         // lanes 4q + 2, 4q + 3
        }
      }
      int32x4_t isum[4];
      for (int q = 0; q < 4; ++q) isum[q] = vpaddq_s32(lo[q], hi[q]);
      arm64_dyw_accumulate(acc + t * 16, isum, sa[b * T + t], swp + b * 16);
    }
  }
  arm64_dyw_store(acc, T, add, dx, ldx, nk);
}

#if TOOLCHAIN_ARM64_EXTENSIONS
namespace arm64 {
namespace dotprod {   // (the sdot functions' namespace: scripts/check_kernel_arm64.sh checks where sdot is)
TOOLCHAIN_ARM64_DOTPROD
void dyw_panel(const int8_t* __restrict ab, const float* __restrict sa, int64_t T, int64_t nb,
                             int64_t gp, const uint8_t* __restrict wp, const float* __restrict swp, const float* add,
                             float* dx, int64_t ldx, int64_t nk) {
  thread_local std::vector<float> acc_buffer;
  acc_buffer.assign(static_cast<size_t>(T * 16), 0.0f);
  float* acc = acc_buffer.data();
  const int64_t D = gp / 4;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* wb = reinterpret_cast<const int8_t*>(wp) + b * D * 64;
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* x = ab + (b * T + t) * gp;
      int32x4_t isum[4];
      for (int q = 0; q < 4; ++q) isum[q] = vdupq_n_s32(0);
      for (int64_t d = 0; d < D; ++d) {
        int32_t v;
        std::memcpy(&v, x + 4 * d, 4);
        const int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(v));
        for (int q = 0; q < 4; ++q) isum[q] = vdotq_s32(isum[q], vld1q_s8(wb + d * 64 + 16 * q), av);
      }
      arm64_dyw_accumulate(acc + t * 16, isum, sa[b * T + t], swp + b * 16);
    }
  }
  arm64_dyw_store(acc, T, add, dx, ldx, nk);
}
}  // namespace dotprod
}  // namespace arm64
#endif
#endif

// The path's fused fold + rounding of a row for toolchain_int4_dyw_a8 (returns the whole blocks it did), or nullptr.
using FoldRow = int64_t (*)(QuantizedX&, const float*, const float*, int64_t, int64_t, int64_t);
FoldRow fold_row_of(KernelPath path) {
  switch (path) {
#ifdef TOOLCHAIN_X86
    case KernelPath::avx512_vnni: return x86_avx512::fold_row;
    case KernelPath::avx_vnni: return x86_avx_vnni::fold_row;
    case KernelPath::avx2: return x86_avx2::fold_row;
#endif
#if defined(__aarch64__)
    case KernelPath::neon:
    case KernelPath::dotprod:
    case KernelPath::i8mm: return arm64_fold_row;
#endif
    default: return nullptr;
  }
}

// One toolchain_int4_linear_a8 call after x is quantized: weight rows are split over threads in chunks.
struct RowsTask {
  KernelPath path;
  const QuantizedX* a;
  int64_t T;
  const uint8_t* q;
  const float* scales;
  int64_t half, gb, ng, o;
  float* y;
  int64_t chunk;
  int64_t ldy;   // y's row stride (o for toolchain_int4_linear_a8; i for a k-group of toolchain_int4_dyw_a8)
};

// Output rows r0 .. r1 - 1 of a task (all T rows of x): the path's kernels, else the generic rows.
void linear_rows(const RowsTask& k, int64_t r0, int64_t r1) {
  const uint8_t* q = k.q + r0 * k.half;
  const float* scales = k.scales + r0 * k.ng;
  float* y = k.y + r0;
  const int64_t n = r1 - r0;
#ifdef TOOLCHAIN_X86
  switch (k.path) {
    case KernelPath::avx512_vnni:
      if (x86_avx512::linear(*k.a, k.T, q, scales, k.half, k.gb, k.ng, n, y, k.ldy)) return;
      break;
    case KernelPath::avx_vnni:
      if (x86_avx_vnni::linear(*k.a, k.T, q, scales, k.half, k.gb, k.ng, n, y, k.ldy)) return;
      break;
    case KernelPath::avx2:
      if (x86_avx2::linear(*k.a, k.T, q, scales, k.half, k.gb, k.ng, n, y, k.ldy)) return;
      break;
    default:
      break;
  }
#endif
#if defined(__aarch64__)
  if (arm64::int4_rows(k.path, {k.a->even.data(), k.a->odd.data(), k.a->sa.data(), k.a->corr.data(), k.a->stride,
                                k.a->gstride}, k.T, q, scales, k.half, k.gb, k.ng, n, y, k.ldy))
    return;
#endif
  for (int64_t t0 = 0; t0 < k.T; t0 += TT) {
    float* yt = y + t0 * k.ldy;
    switch (std::min(TT, k.T - t0)) {
      case 4: rows<4>(*k.a, t0, q, scales, k.half, k.gb, k.ng, n, yt, k.ldy); break;
      case 3: rows<3>(*k.a, t0, q, scales, k.half, k.gb, k.ng, n, yt, k.ldy); break;
      case 2: rows<2>(*k.a, t0, q, scales, k.half, k.gb, k.ng, n, yt, k.ldy); break;
      default: rows<1>(*k.a, t0, q, scales, k.half, k.gb, k.ng, n, yt, k.ldy); break;
    }
  }
}

void rows_chunk(void* task, size_t i) {
  const RowsTask& k = *static_cast<const RowsTask*>(task);
  const int64_t r0 = static_cast<int64_t>(i) * k.chunk;
  linear_rows(k, r0, std::min(k.o, r0 + k.chunk));
}

// toolchain_int4_linear_a8's quantization of x: rows [i * rows, (i + 1) * rows) of T (the pool's unit of work).
struct QuantizeTask {
  QuantizedX* a;   // resize()d for the T rows
  const float* x;
  int64_t in, group, ng;
  Group16 group16;
  int64_t T, rows;
};

void quantize_rows(void* task, size_t i) {
  const QuantizeTask& k = *static_cast<const QuantizeTask*>(task);
  const int64_t t0 = static_cast<int64_t>(i) * k.rows;
  for (int64_t t = t0; t < std::min(k.T, t0 + k.rows); ++t)
    k.a->quantize_row(k.x + t * k.in, t, k.in, k.group, k.ng, k.group16);
}

// The threads: as many as the runtime's thread pool has (ExecuTorch's, the one XNNPACK uses: its size is the
// runtime's thread count, e.g. `toolchain train --threads N`), when the library is built with TOOLCHAIN_THREADPOOL
// (build.py, against the wheel's libexecutorch_threadpool; the wheel ships no threadpool.h, so the pthreadpool C
// API it needs is declared here). The kernels' units run on workers of their own (SpinPool, below) rather than on
// that pool's: pthreadpool's workers sleep (futex) after ~1000 pauses without work off Android, a few microseconds,
// so a training step's ~3,400 pool calls, each after a stretch of single-threaded ops, paid a worker's wake-up
// each (~20 us on this host, far more when the idle core's vCPU had halted: the first calls of a method ran at one
// thread's speed). SpinPool's workers spin for 200 us after their last unit before sleeping, as pthreadpool's
// do on Android (100,000 pauses). Measured on the int8 0.5B step at 2 threads (docs/benchmarks.md): 2.01 -> 1.92 s.
#ifdef TOOLCHAIN_THREADPOOL
}  // namespace
extern "C" {
typedef struct pthreadpool* pthreadpool_t;
size_t pthreadpool_get_threads_count(pthreadpool_t);
}
namespace executorch::extension::threadpool {
pthreadpool_t get_pthreadpool();
}
namespace {
int64_t pool_threads() {
  pthreadpool_t pool = executorch::extension::threadpool::get_pthreadpool();
  return pool != nullptr ? static_cast<int64_t>(pthreadpool_get_threads_count(pool)) : 1;
}

// A worker's spin after its last unit, before it sleeps: 200 us, or $TOOLCHAIN_POOL_SPIN_US (0 .. 100000; 0 sleeps
// at once), read when the workers start.
int64_t spin_micros() {
  const char* v = std::getenv("TOOLCHAIN_POOL_SPIN_US");
  const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 200;
  return n >= 0 && n <= 100000 ? n : 200;
}
thread_local bool tl_pool_worker = false;   // this thread is a SpinPool worker (a nested call runs in place)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Pause `spins` (counted from 0) of a spin-wait: every 64th also yields the core, so a thread waiting for it (a loaded
// or smaller machine) runs; returns whether it did (the workers check their spin's time there).
inline bool spin_pause(int spins) {
  cpu_relax();
  if (spins % 64 != 63) return false;
  std::this_thread::yield();
  return true;
}

// Fork-join workers: run(fn, ctx, n) calls fn(ctx, i) for every i < n on the calling thread and the workers, each
// unit taken from a shared counter, and returns when all are done and every worker has seen the call. Units are
// computed the same way by any thread, so the bits depend on neither the thread count nor the schedule. One call at
// a time: a second caller (another thread) while one runs, or a unit calling run, runs its units in place.
class SpinPool {
 public:
  explicit SpinPool(int64_t workers) : workers_(workers), spin_(spin_micros()) {
    for (int64_t w = 0; w < workers; ++w) std::thread([this] { work(); }).detach();   // never joined: leaked
  }
  void run(void (*fn)(void*, size_t), void* ctx, int64_t n) {
    std::unique_lock<std::mutex> one(running_, std::try_to_lock);
    if (!one.owns_lock() || tl_pool_worker) {
      for (int64_t i = 0; i < n; ++i) fn(ctx, static_cast<size_t>(i));
      return;
    }
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    seen_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);           // publishes the call to the workers
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lock(sleep_); }                 // a worker between its check and its wait
      wake_.notify_all();
    }
    units();
    for (int spins = 0; seen_.load(std::memory_order_acquire) < workers_; ++spins) spin_pause(spins);   // last units
  }

 private:
  void units() {
    for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) fn_(ctx_, static_cast<size_t>(i));
  }
  void work() {
    tl_pool_worker = true;
    uint64_t seen = 0;
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        if (!spin_pause(spins)) continue;
        if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(spin_)) {
          std::unique_lock<std::mutex> lock(sleep_);
          sleeping_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
          sleeping_.fetch_sub(1, std::memory_order_relaxed);
          break;
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      units();
      seen_.fetch_add(1, std::memory_order_release);
    }
  }
  const int64_t workers_, spin_;
  std::mutex running_, sleep_;
  std::condition_variable wake_;
  void (*fn_)(void*, size_t) = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int64_t> seen_{0};
  alignas(64) std::atomic<int> sleeping_{0};
};

// The SpinPool of `threads` threads (the caller and threads - 1 workers), one per thread count the runtime's pool has
// had in this process (kept: a test alternating 1 and 2 threads reuses them). A forked child starts its own: the
// parent's workers do not exist in it.
SpinPool& spin_pool(int64_t threads) {
  static std::mutex m;
  static std::vector<SpinPool*> pools;   // by thread count; never freed (their workers sleep)
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(m);
  if (owner != getpid()) {
    pools.clear();
    owner = getpid();
  }
  if (static_cast<int64_t>(pools.size()) <= threads) pools.resize(static_cast<size_t>(threads) + 1, nullptr);
  SpinPool*& pool = pools[static_cast<size_t>(threads)];
  if (pool == nullptr) pool = new SpinPool(threads - 1);
  return *pool;
}

std::atomic<int64_t> pool_units{0};   // units run over more than one thread (toolchain_pool_units)
}  // namespace

// The kernels' one entry to their threads (fn(ctx, i) for i < n over pool_threads() threads), a global symbol so a
// diagnostic shim can interpose it: scripts/bench_prefill_threads.py records each call's per-thread task CPU.
extern "C" void kernels_pool_run(void (*fn)(void*, size_t), void* ctx, int64_t n) {
  pool_units.fetch_add(n, std::memory_order_relaxed);
  spin_pool(pool_threads()).run(fn, ctx, n);
}

namespace {
// fn(task, i) for i in [0, chunks), over the threads.
void run_in_pool(void (*fn)(void*, size_t), void* task, int64_t chunks) {
  if (pool_threads() <= 1 || chunks <= 1) {
    for (int64_t i = 0; i < chunks; ++i) fn(task, static_cast<size_t>(i));
    return;
  }
  kernels_pool_run(fn, task, chunks);
}
#else
int64_t pool_threads() { return 1; }
std::atomic<int64_t> pool_units{0};   // stays 0: no threads
void run_in_pool(void (*fn)(void*, size_t), void* task, int64_t chunks) {
  for (int64_t i = 0; i < chunks; ++i) fn(task, static_cast<size_t>(i));
}
#endif

// toolchain_int4_dyw_a8 (dX = dY W; the definition: the top of the file). The call quantizes dy per row and block
// of `group` n once (QuantizedX in the halves layout below: the path's fold_row with unit scales, the scalar loop
// for the rest), makes the table of each (k-group g, n): lut[v] = W's int4 value v - 8 times e[n, g] = sw[n, g] /
// swt[b, g] rounded, the int8 W^T values a row of nibbles maps to, and then, per panel of 16 columns k of dx (the
// vector kernels' lanes), packs the panel's int8 W^T (o * 16 bytes, about 78 KiB at o = 4864: it stays in L2
// across all rows of dy; no W^T is kept beyond the panel) and multiplies it with every row of dy. Panels are
// independent and each is computed the same way by any thread, so the bits depend on neither the thread count nor
// which task runs a panel.
constexpr int64_t DYW_LANES = 16;   // columns of dx per panel

struct DywTask {
  KernelPath path;
  const float* dy;       // [T, o]
  int64_t T, o, op, in, ng, group, nb, dh;   // op = o rounded up to even; nb blocks of n; dh dwords per half block
  const uint8_t* q;      // W: [o, in / 2]
  const float* scales;   // [o, ng]
  const float* swt;      // [ng, nb]: the int8 W^T's scale per (k-group, block)
  QuantizedX* a;         // dy quantized per row and block (QuantizedX's halves layout, rows of op / 2 bytes)
  int8_t* ab;            // the same bytes block-major: [nb, T, gp] (row t of block b: its even half padded to dh
                         // dwords, then its odd half), so a panel's loop over the rows of a block reads them in order
  float* sab;            // [nb, T] the blocks' sa
  int32_t* corrb;        // [nb, T] 8 sum_n a of the block (QuantizedX's corr)
  int64_t gp;            // 8 dh bytes per (block, row)
  int8_t* luts;          // [ng, o, 16]
  uint8_t flip;          // xor of the packed bytes: 0x80 where the path's kernel takes them unsigned (vpdpbusd)
  bool vector_panel;     // the path has a panel kernel for this group
  const float* add;      // [T, in] or nullptr: dx = add + dy W (toolchain_int4_dyw_a8_acc)
  float* dx;             // [T, in]
  int64_t rows_chunk, row_chunks, gchunk, panels, pchunk;
};

// The packed panel p (columns k0 = 16 p .. k0 + 15 of dx; lanes past `in` are zero weights): per block b of n, its
// two halves (the block's first lb / 2 n, then the rest: QuantizedX's even / odd bytes of that block), per half dh
// dwords, per dword 16 lanes of 4 bytes: lane r's 4 bytes are Wt8[k0 + r, n] for the half's 4 consecutive n of
// the dword (zero past the half's end: a partial last block, group % 8 != 0, the padding n = o of an odd o), each
// byte xor `flip`. So a 64-byte load is one dword of 16 columns (vpdpbusd's and sdot's operand).
void dyw_pack_scalar(const DywTask& k, int64_t k0, uint8_t* wp) {
  const int64_t half = k.in / 2, G = k.group;
  std::memset(wp, k.flip, static_cast<size_t>(k.nb * 2 * k.dh * 64));
  for (int64_t b = 0; b < k.nb; ++b) {
    const int64_t n0 = b * G, lb = std::min(G, k.op - n0), h = lb / 2;
    for (int64_t m = 0; m < lb && n0 + m < k.o; ++m) {
      const int64_t n = n0 + m, hf = m >= h ? 1 : 0, j = m - hf * h;
      uint8_t* dst = wp + ((b * 2 + hf) * k.dh + j / 4) * 64 + j % 4;
      const uint8_t* qr = k.q + n * half;
      for (int64_t r = 0; r < DYW_LANES && k0 + r < k.in; ++r) {
        const int64_t c = k0 + r;
        const int nib = c & 1 ? qr[c / 2] & 15 : qr[c / 2] >> 4;
        dst[4 * r] = static_cast<uint8_t>(k.luts[((c / G) * k.o + n) * 16 + nib]) ^ k.flip;
      }
    }
  }
}

// The generic panel product (the definition's order): per row t and block b, the exact isum of each lane, then
// acc[lane] = fma(float(isum), sa[t, b] * swt[b, lane], acc[lane]), blocks in increasing order from acc = 0; stored
// as it is, or (toolchain_int4_dyw_a8_acc) as add + acc, one float32 addition with `add` the first operand.
// swp: [nb, 16] the lanes' swt (0 past `in`). wp packed with flip 0. add: the panel's columns of k.add, or nullptr.
void dyw_panel_generic(const DywTask& k, const uint8_t* wp, const float* swp, const float* add, float* dx,
                       int64_t nk) {
  for (int64_t t = 0; t < k.T; ++t) {
    float acc[DYW_LANES] = {};
    for (int64_t b = 0; b < k.nb; ++b) {
      int32_t isum[DYW_LANES] = {};
      const int8_t* x = k.ab + (b * k.T + t) * k.gp;   // 4 dh bytes of each half (zero past the half's end)
      const uint8_t* w = wp + b * k.gp * 16;
      for (int64_t j = 0; j < k.gp; ++j) {
        const int32_t av = x[j];
        const uint8_t* wj = w + (j / 4) * 64 + j % 4;
        for (int r = 0; r < DYW_LANES; ++r) isum[r] += av * static_cast<int32_t>(static_cast<int8_t>(wj[4 * r]));
      }
      const float sa = k.sab[b * k.T + t];
      for (int r = 0; r < DYW_LANES; ++r) acc[r] = std::fma(static_cast<float>(isum[r]), sa * swp[b * DYW_LANES + r], acc[r]);
    }
    for (int64_t r = 0; r < nk; ++r) dx[t * k.in + r] = add == nullptr ? acc[r] : add[t * k.in + r] + acc[r];
  }
}

// A block of u with an infinity (dy infinite, or dy * sw overflowing) has sa = NaN, as one with a NaN, where
// QuantizedX's loop would have sa = inf: its dx is NaN either way (its a are 0, and 0 * inf is NaN), but every NaN
// of toolchain_int4_dyw_a8 is then the one NAN constant propagated (0 * inf would make x86's negative default NaN,
// and which of two different NaNs a sum keeps depends on its operand order: the paths' bits would differ).
// Row t of u = dy_t * s (blocks b0 .. nb - 1; toolchain_int4_dyw_a8 passes s = 1, so u = dy), quantized as
// QuantizedX's scalar loop into the halves layout (a block's first lb / 2 values in `even`, the rest in `odd`).
void fold_blocks_scalar(QuantizedX& x, const float* __restrict dy, const float* __restrict s, int64_t o,
                        int64_t group, int64_t nb, int64_t t, int64_t b0) {
  const int64_t op = o + (o & 1);
  thread_local std::vector<float> ub;
  ub.resize(static_cast<size_t>(group));
  float* u = ub.data();
  for (int64_t b = b0; b < nb; ++b) {
    const int64_t n0 = b * group, lb = std::min(group, op - n0), h = lb / 2;
    float amax = 0.0f;
    bool nan = false;
    for (int64_t m = 0; m < lb; ++m) {
      const float v = n0 + m < o ? dy[n0 + m] * s[n0 + m] : 0.0f;
      u[m] = v;
      const float av = std::fabs(v);
      nan = nan || av != av;
      amax = av > amax ? av : amax;
    }
    const float sa = nan || amax == INFINITY ? NAN : amax / 127.0f;   // NaN for an infinity too (above)
    int32_t sum = 0;
    int8_t* even = &x.even[static_cast<size_t>(t * x.stride + n0 / 2)];
    int8_t* odd = &x.odd[static_cast<size_t>(t * x.stride + n0 / 2)];
    for (int64_t m = 0; m < lb; ++m) {
      float r = sa > 0.0f ? std::nearbyint(u[m] / sa) : 0.0f;   // ties to even (the default rounding mode)
      r = r != r ? 0.0f : std::min(127.0f, std::max(-127.0f, r));
      const int8_t a = static_cast<int8_t>(r);
      (m < h ? even[m] : odd[m - h]) = a;
      sum += a;
    }
    x.sa[static_cast<size_t>(t * x.gstride + b)] = sa;
    x.corr[static_cast<size_t>(t * x.gstride + b)] = 8 * sum;
  }
}

// Preparation task i: rows [i * rows_chunk, + rows_chunk) of dy quantized (i < row_chunks), else the tables of
// k-groups [(i - row_chunks) * gchunk, + gchunk): lut[v] = clamp(round_half_even(e * (v - 8)), -127, 127),
// e = sw[n, g] / swt[b, g] (0 where swt is 0), the product exact (one fused multiply-add into 1.5 * 2^23, whose
// ulp is 1: |e (v - 8)| <= 8 * 32 here, far below 2^22).
void dyw_prepare_chunk(void* task, size_t i) {
  const DywTask& k = *static_cast<const DywTask*>(task);
  const int64_t c = static_cast<int64_t>(i);
  if (c < k.row_chunks) {
    thread_local std::vector<float> ones;
    if (ones.size() < static_cast<size_t>(k.op)) ones.assign(static_cast<size_t>(k.op), 1.0f);
    const FoldRow fold_row = fold_row_of(k.path);
    for (int64_t t = c * k.rows_chunk; t < std::min(k.T, (c + 1) * k.rows_chunk); ++t) {
      const float* dyt = k.dy + t * k.o;
      // the path's vector rounding of the whole blocks (u = dy * 1 = dy), the scalar loop for the rest
      const int64_t done = fold_row != nullptr ? fold_row(*k.a, dyt, ones.data(), k.o, k.group, t) : 0;
      fold_blocks_scalar(*k.a, dyt, ones.data(), k.o, k.group, k.nb, t, done);
      const QuantizedX& a = *k.a;
      const int64_t hb = k.group / 2;
      for (int64_t b = 0; b < k.nb; ++b) {   // block-major, each half padded to 4 dh bytes
        int8_t* dst = k.ab + (b * k.T + t) * k.gp;
        std::memcpy(dst, &a.even[static_cast<size_t>(t * a.stride + b * hb)], static_cast<size_t>(hb));
        std::memcpy(dst + k.gp / 2, &a.odd[static_cast<size_t>(t * a.stride + b * hb)], static_cast<size_t>(hb));
        if (k.gp / 2 > hb) {
          std::memset(dst + hb, 0, static_cast<size_t>(k.gp / 2 - hb));
          std::memset(dst + k.gp / 2 + hb, 0, static_cast<size_t>(k.gp / 2 - hb));
        }
        k.sab[b * k.T + t] = a.sa[static_cast<size_t>(t * a.gstride + b)];
        k.corrb[b * k.T + t] = a.corr[static_cast<size_t>(t * a.gstride + b)];
      }
    }
    return;
  }
  constexpr float M = 0x1.8p23f;
  const int64_t g0 = (c - k.row_chunks) * k.gchunk;
  for (int64_t g = g0; g < std::min(k.ng, g0 + k.gchunk); ++g) {
    const float* swt = k.swt + g * k.nb;
    int8_t* lut = k.luts + g * k.o * 16;
    for (int64_t n = 0; n < k.o; ++n) {
      const float s = swt[n / k.group];
      const float e = s > 0.0f ? k.scales[n * k.ng + g] / s : 0.0f;
      for (int v = 0; v < 16; ++v) {
        const float r = std::fma(e, static_cast<float>(v - 8), M) - M;
        lut[n * 16 + v] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
      }
    }
  }
}

// Panel task i: panels [i * pchunk, + pchunk), each packed (the path's vector packing of whole blocks, else the
// scalar loop) and multiplied by every row of dy (the path's panel kernel, else the generic one).
void dyw_panel_chunk(void* task, size_t i) {
  const DywTask& k = *static_cast<const DywTask*>(task);
  thread_local std::vector<uint8_t> wpb;
  thread_local std::vector<float> swpb;
  const int64_t bytes = k.nb * 2 * k.dh * 64;
  wpb.resize(static_cast<size_t>(bytes));
  swpb.resize(static_cast<size_t>(k.nb * DYW_LANES));
  uint8_t* wp = wpb.data();
  float* swp = swpb.data();
  const int64_t p0 = static_cast<int64_t>(i) * k.pchunk;
  for (int64_t p = p0; p < std::min(k.panels, p0 + k.pchunk); ++p) {
    const int64_t k0 = p * DYW_LANES, nk = std::min(DYW_LANES, k.in - k0), G = k.group;
    for (int64_t b = 0; b < k.nb; ++b)
      for (int64_t r = 0; r < DYW_LANES; ++r) swp[b * DYW_LANES + r] = r < nk ? k.swt[((k0 + r) / G) * k.nb + b] : 0.0f;
    // the path's vector packing of whole blocks (pshufb / tbl table lookups), the scalar loop for the rest
    using PackBlock = void (*)(const uint8_t*, int64_t, int64_t, int64_t, int64_t, const int8_t*, uint8_t, uint8_t*);
    PackBlock pack_block = nullptr;
#ifdef TOOLCHAIN_X86
    if (k.path != KernelPath::generic) pack_block = x86_ssse3::dyw_pack_block;
#endif
#if defined(__aarch64__)
    if (k.path == KernelPath::neon || k.path == KernelPath::dotprod || k.path == KernelPath::i8mm)
      pack_block = arm64_dyw_pack_block;
#endif
    bool packed = false;
    if (pack_block != nullptr && G % 16 == 0 && nk == DYW_LANES) {   // the panel inside one k-group
      const int64_t whole = k.o / G;                                  // blocks wholly inside [0, o)
      const int8_t* lut = k.luts + (k0 / G) * k.o * 16;
      for (int64_t b = 0; b < whole; ++b) pack_block(k.q, k.in / 2, k0, b * G, G, lut, k.flip, wp + b * 2 * k.dh * 64);
      if (whole < k.nb) {   // the last, partial block: the scalar loop into a scratch panel, its block copied
        thread_local std::vector<uint8_t> tail;
        tail.resize(static_cast<size_t>(bytes));
        dyw_pack_scalar(k, k0, tail.data());
        const int64_t at = whole * 2 * k.dh * 64;
        std::memcpy(wp + at, tail.data() + at, static_cast<size_t>(bytes - at));
      }
      packed = true;
    }
    if (!packed) dyw_pack_scalar(k, k0, wp);
    float* dx = k.dx + k0;
    const float* add = k.add == nullptr ? nullptr : k.add + k0;
    bool done = false;
    if (k.vector_panel) {
      switch (k.path) {
#ifdef TOOLCHAIN_X86
        case KernelPath::avx512_vnni: done = x86_avx512::dyw_panel_of(G, k.ab, k.sab, k.corrb, k.T, k.nb, wp, swp, add, dx, k.in, nk); break;
        case KernelPath::avx_vnni: done = x86_avx_vnni::dyw_panel_of(G, k.ab, k.sab, k.corrb, k.T, k.nb, wp, swp, add, dx, k.in, nk); break;
        case KernelPath::avx2: done = x86_avx2::dyw_panel_of(G, k.ab, k.sab, k.corrb, k.T, k.nb, wp, swp, add, dx, k.in, nk); break;
#endif
#if defined(__aarch64__)
        case KernelPath::neon:
          arm64_dyw_panel_neon(k.ab, k.sab, k.T, k.nb, k.gp, wp, swp, add, dx, k.in, nk);
          done = true;
          break;
#if TOOLCHAIN_ARM64_EXTENSIONS
        case KernelPath::dotprod:
        case KernelPath::i8mm:
          arm64::dotprod::dyw_panel(k.ab, k.sab, k.T, k.nb, k.gp, wp, swp, add, dx, k.in, nk);
          done = true;
          break;
#endif
#endif
        default: break;
      }
    }
    if (!done) dyw_panel_generic(k, wp, swp, add, dx, nk);
  }
}
// fn(ctx, i) for i < n: on the runtime's thread pool when it has more than one thread and the call is worth a
// dispatch (`work`: about the call's multiply-adds or elements, at least `least`), else in order on this thread.
// kPoolWork (2^20) for calls whose units exist in a decode step too (attention's heads, SwiGLU's blocks): a decode
// step's calls stay on this thread, where waking the pool would cost about what it saves, and more when the other
// core is busy. kPoolRowWork (2^14) for calls split by rows of x or tokens of a chunk (RMSNorm, RoPE, the LoRA
// epilogue, the quantization of x): a decode step has one row, so they never reach the pool there, and in a prefill
// chunk a dispatch to spinning workers costs 0.1-0.4 us (an empty pthreadpool_parallelize_1d of 2-14 tasks, this
// host; SpinPool's workers spin the same way between a step's calls) against 10-60 us of work (a [32, 896] RMSNorm, the quantization of a [32, 4864] x).
// Every kernel that uses it computes each output element the same way whichever thread runs it, so the bits do not
// depend on the thread count.
constexpr int64_t kPoolWork = int64_t{1} << 20;
constexpr int64_t kPoolRowWork = int64_t{1} << 14;
// Units [i per, (i + 1) per) of a parallel_for's n (one pool task: a run of consecutive units, in order).
struct UnitRun {
  void (*fn)(void*, size_t);
  void* ctx;
  int64_t n, per;
};
void unit_run(void* task, size_t i) {
  const UnitRun& u = *static_cast<const UnitRun*>(task);
  const int64_t k0 = static_cast<int64_t>(i) * u.per;
  for (int64_t k = k0; k < std::min(u.n, k0 + u.per); ++k) u.fn(u.ctx, static_cast<size_t>(k));
}

void parallel_for(void (*fn)(void*, size_t), void* ctx, int64_t n, int64_t work, int64_t least = kPoolWork) {
#ifdef TOOLCHAIN_THREADPOOL
  const int64_t threads = n > 1 && work >= least ? pool_threads() : 1;
  if (threads > 1) {
    // more than 8 units per thread (a chunk's 32 rows, SwiGLU's blocks): about 4 tasks per thread, each a run of
    // units (the pool's per-task cost paid 8 times instead of n); else a task per unit (attention's 14 heads)
    UnitRun run{fn, ctx, n, n > 8 * threads ? (n + 4 * threads - 1) / (4 * threads) : 1};
    run_in_pool(unit_run, &run, (n + run.per - 1) / run.per);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) fn(ctx, static_cast<size_t>(i));
}
}  // namespace

extern "C" {

// The kernel path in use ("generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm"; after a
// refusal, the one chosen before it, which the kernels do not run until a path is selected).
const char* toolchain_kernel_path() { return kKernelPathNames[static_cast<int>(kernel_path_state().path)]; }

// The threads the int4 kernels split rows over (the runtime's thread pool; 1 without it).
int64_t toolchain_kernel_threads() { return pool_threads(); }

// The units of work the kernels have run over more than one thread since load (0 without the thread pool): the
// arm64 check's proof that a pooled build split its calls.
int64_t toolchain_pool_units() { return pool_units.load(std::memory_order_relaxed); }

// nullptr, or why the forced path cannot run here (then every kernel call returns -2).
const char* toolchain_kernel_path_error() {
  const std::string& e = kernel_path_state().error;
  return e.empty() ? nullptr : e.c_str();
}

// For the kernel tests: use path `name` from now on (not thread-safe against running kernels). Returns 0, -1 for an
// unknown name, -2 for a path this CPU lacks; after a refusal toolchain_kernel_path_error() says why and the kernels
// return -2 (as with a refused $TOOLCHAIN_KERNEL_PATH) until a path is selected.
int toolchain_select_kernel_path(const char* name) {
  KernelPathState& st = kernel_path_state();
  std::string why = st.select(name);
  if (why.empty()) {
    st.error.clear();
    return 0;
  }
  const bool unknown = why.rfind("unknown", 0) == 0;
  st.error = why;
  return unknown ? -1 : -2;
}

// y [T, o] = x [T, i] W^T with x quantized per row and group (see the top of the file); q [o, i/2],
// scales [o, ng] (ng = ceil(i / group)). Returns 0, or -1 for bad arguments (i odd, group odd or < 2,
// ng != ceil(i / group)).
int toolchain_int4_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales, int64_t o,
                             int64_t ng, int64_t group, float* y) {
  if (in <= 0 || in % 2 || group < 2 || group % 2 || ng != (in + group - 1) / group || T < 0 || o < 0) return -1;
  const int64_t half = in / 2, gb = group / 2;
  const KernelPath path = kernel_path_state().path;
  if (!kernel_path_state().error.empty()) return -2;   // a forced path this CPU lacks: no silent fallback
  thread_local QuantizedX a;
  a.resize(T, in, ng, 16 * 64, true);   // padded to whole blocks (16 groups of <= 64 bytes); every row rewritten below
  const int64_t threads = pool_threads();
  const bool split = threads > 1 && o >= 32 && T * o * in >= (int64_t{1} << 18);
  // x's rows (independent: the same bits) over the pool too when W's rows are split, in about 4 chunks per thread
  const int64_t rows = std::max<int64_t>(1, split ? (T + 4 * threads - 1) / (4 * threads) : T);
  QuantizeTask quantize{&a, x, in, group, ng, group16_of(path), T, rows};
  parallel_for(quantize_rows, &quantize, (T + rows - 1) / rows, T * in, kPoolRowWork);
#ifdef TOOLCHAIN_X86
  if (path == KernelPath::avx512_vnni) x86_avx512::prepare(a, T, gb);
#endif
  RowsTask task{path, &a, T, q, scales, half, gb, ng, o, y, o, o};
  if (split) {   // split the rows (independent: the same bits)
    task.chunk = std::max<int64_t>(16, (o + 4 * threads - 1) / (4 * threads) + 15) / 16 * 16;
    run_in_pool(rows_chunk, &task, (o + task.chunk - 1) / task.chunk);
  } else {
    linear_rows(task, 0, o);
  }
  return 0;
}


// toolchain_int4_dyw_a8 (add nullptr) and toolchain_int4_dyw_a8_acc.
static int dyw_a8(const float* dy, int64_t T, int64_t o, const uint8_t* q, const float* scales, int64_t in, int64_t ng,
           int64_t group, const float* add, float* dx) {
  if (in <= 0 || in % 2 || group < 2 || group % 2 || ng != (in + group - 1) / group || T < 0 || o < 0) return -1;
  const KernelPath path = kernel_path_state().path;
  if (!kernel_path_state().error.empty()) return -2;   // a forced path this CPU lacks: no silent fallback
  if (T == 0) return 0;
  if (o == 0) {   // an empty reduction: dx = 0, or add + 0
    for (int64_t j = 0; j < T * in; ++j) dx[j] = add == nullptr ? 0.0f : add[j] + 0.0f;
    return 0;
  }
  const int64_t op = o + (o & 1), nb = (o + group - 1) / group;   // = ceil(op / group): group is even
  thread_local std::vector<float> swt;       // [ng, nb]: max_n |sw[n, g]| over the block / 15.875 (= 127 / 8)
  thread_local std::vector<int8_t> luts;     // [ng, o, 16]
  thread_local QuantizedX a;
  thread_local std::vector<int8_t> ab;      // dy's bytes block-major [nb, T, gp]
  thread_local std::vector<float> sab;      // [nb, T]
  thread_local std::vector<int32_t> corrb;  // [nb, T]
  const int64_t dh = (group / 2 + 3) / 4;
  ab.resize(static_cast<size_t>(nb * T * 8 * dh));
  sab.resize(static_cast<size_t>(nb * T));
  corrb.resize(static_cast<size_t>(nb * T));
  swt.resize(static_cast<size_t>(ng * nb));
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      float m = 0.0f;
      for (int64_t n = b * group; n < std::min(o, (b + 1) * group); ++n) {
        const float v = std::fabs(scales[n * ng + g]);
        m = v > m ? v : m;
      }
      swt[static_cast<size_t>(g * nb + b)] = m / 15.875f;
    }
  luts.resize(static_cast<size_t>(ng * o * 16));
  a.resize(T, op, nb, 16 * 64, true);   // every byte and block of the T rows is written (dyw_prepare_chunk)
  const bool vnni = path == KernelPath::avx512_vnni || path == KernelPath::avx_vnni;
  const bool arm64 = path == KernelPath::neon || path == KernelPath::dotprod || path == KernelPath::i8mm;
  const bool vector_panel = arm64 || ((vnni || path == KernelPath::avx2) && (group == 32 || group == 64 || group == 128));
  const int64_t panels = (in + DYW_LANES - 1) / DYW_LANES;
  DywTask task{path, dy, T, o, op, in, ng, group, nb, dh, q, scales, swt.data(), &a, ab.data(), sab.data(),
               corrb.data(), 8 * dh, luts.data(),
               static_cast<uint8_t>(vnni && vector_panel ? 0x80 : 0), vector_panel, add, dx, T, 1, ng, panels, panels};
  const int64_t threads = pool_threads();
  if (threads > 1 && T * o * in >= (int64_t{1} << 18)) {
    task.row_chunks = std::min<int64_t>(T, 2 * threads);
    task.rows_chunk = (T + task.row_chunks - 1) / task.row_chunks;
    task.row_chunks = (T + task.rows_chunk - 1) / task.rows_chunk;
    task.gchunk = (ng + 2 * threads - 1) / (2 * threads);
    run_in_pool(dyw_prepare_chunk, &task, task.row_chunks + (ng + task.gchunk - 1) / task.gchunk);
    task.pchunk = (panels + 4 * threads - 1) / (4 * threads);   // about 4 tasks per thread
    run_in_pool(dyw_panel_chunk, &task, (panels + task.pchunk - 1) / task.pchunk);
  } else {
    dyw_prepare_chunk(&task, 0);   // rows_chunk = T: every row
    dyw_prepare_chunk(&task, 1);   // gchunk = ng: every table
    dyw_panel_chunk(&task, 0);     // pchunk = panels: every panel
  }
  return 0;
}

// dx [T, i] = dy [T, o] W for the same int4 W as toolchain_int4_linear_a8 (q [o, i/2], scales [o, ng],
// ng = ceil(i / group)), the gradient of x W^T (the definition: the top of the file, "dX for training").
// Returns 0, or -1 for bad arguments (as toolchain_int4_linear_a8), -2 for a forced path this CPU lacks.
int toolchain_int4_dyw_a8(const float* dy, int64_t T, int64_t o, const uint8_t* q, const float* scales, int64_t in,
                          int64_t ng, int64_t group, float* dx) {
  return dyw_a8(dy, T, o, q, scales, in, ng, group, nullptr, dx);
}

// dx [T, i] = add [T, i] + dy [T, o] W[row0 : row0 + o] for the same int4 layout as toolchain_int4_linear_a8 (q, scales
// W's whole [O, i/2] bytes and [O, ng] scales, ng = ceil(i / group); rows row0 .. row0 + o - 1 read in place, the
// caller checks that they exist: an MLP chunk's gate / up rows without a copy of them): the gradient of x W^T (the
// definition: the top of the file, "dX for training") added to a gradient `add` already held (the MLP chunks' dn2
// and da, the head's running sum), one float32 addition per element after the block chain, `add` its first
// operand: the bits of add + toolchain_int4_dyw_a8's dx for those rows, without a pass of its own (the panel kernels
// add it as they store). add may be dx itself; nullptr: toolchain_int4_dyw_a8's dx. Returns 0, or -1 for bad
// arguments (as toolchain_int4_linear_a8; row0 < 0), -2 for a forced path this CPU lacks.
int toolchain_int4_dyw_a8_acc(const float* dy, int64_t T, int64_t o, const uint8_t* q, const float* scales, int64_t in,
                              int64_t ng, int64_t group, int64_t row0, const float* add, float* dx) {
  if (row0 < 0 || in <= 0 || in % 2) return -1;
  return dyw_a8(dy, T, o, q + row0 * (in / 2), scales + row0 * ng, in, ng, group, add, dx);
}
struct AttentionTask {
  const float *q, *k, *v, *k_cache, *v_cache;
  int64_t H, Hk, C, S, D, pos;
  float scale;
  float* out;
};

// Query head h of toolchain_attention_decode, all C tokens (the pool's unit of work).
static void attention_head(void* task, size_t head) {
  const AttentionTask& a = *static_cast<const AttentionTask*>(task);
  const int64_t h = static_cast<int64_t>(head), D = a.D, S = a.S, C = a.C, H = a.H;
  const int64_t G = H / a.Hk, n = std::min(a.pos, S);
  thread_local std::vector<float> p, o;
  p.resize(static_cast<size_t>(n + C));
  o.resize(static_cast<size_t>(D));
  const int64_t j = h / G;
  const float* kc = a.k_cache + j * S * D;
  const float* vc = a.v_cache + j * S * D;
  const float* kn = a.k + j * C * D;
  const float* vn = a.v + j * C * D;
  for (int64_t c = 0; c < C; ++c) {
    const float* qv = a.q + (h * C + c) * D;
    float m = -INFINITY;
    for (int64_t s = 0; s < n + c + 1; ++s) {
      const float* kr = s < n ? kc + s * D : kn + (s - n) * D;
      f32x16 acc = f32x16{};
      float tail = 0.0f;
      int64_t d = 0;
      for (; d + L <= D; d += L) {
        f32x16 x, y;
        x = load16(qv + d);
        y = load16(kr + d);
        acc = acc + x * y;
      }
      for (; d < D; ++d) tail = std::fma(qv[d], kr[d], tail);
      float lanes[L];
      store16(lanes, acc);
      const float sc = (lane_sum(lanes) + tail) * a.scale;
      p[static_cast<size_t>(s)] = sc;
      m = sc > m ? sc : m;
    }
    std::fill(o.begin(), o.end(), 0.0f);
    float denom = 0.0f;
    for (int64_t s = 0; s < n + c + 1; ++s) {
      const float e = std::exp(p[static_cast<size_t>(s)] - m);
      denom += e;
      const float* vr = s < n ? vc + s * D : vn + (s - n) * D;
      for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += e * vr[d];
    }
    float* dst = a.out + c * H * D + h * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = o[static_cast<size_t>(d)] / denom;
  }
}

// out [C, H*D] = softmax attention of C query tokens (q [H, C, D], after RoPE) at positions pos .. pos + C - 1
// over the cache rows [0, min(pos, S)) of k_cache / v_cache [Hk, S, D] and, causally, the chunk's own k / v
// [Hk, C, D] (query head h reads kv head h / (H / Hk)); scores scaled by `scale`. Per query: the scores,
// their max m, then sum_s exp(s - m) v_s / sum_s exp(s - m). The query heads are split over the thread pool.
// Returns 0, or -1 for bad arguments.
int toolchain_attention_decode(const float* q, const float* k, const float* v, const float* k_cache,
                               const float* v_cache, int64_t H, int64_t Hk, int64_t C, int64_t S, int64_t D,
                               int64_t pos, float scale, float* out) {
  if (H <= 0 || Hk <= 0 || H % Hk || C <= 0 || S < 0 || D <= 0 || pos < 0) return -1;
  AttentionTask task{q, k, v, k_cache, v_cache, H, Hk, C, S, D, pos, scale, out};
  parallel_for(attention_head, &task, H, 2 * H * C * (std::min(pos, S) + C) * D);   // the heads over the pool
  return 0;
}


// The small ops around them, one call each instead of ExecuTorch's portable graphs (references in
// toolchain/mesp/decode_ops.py):

struct RmsNormTask {
  const float* x;
  int64_t d;
  const float* w;
  float eps;
  float* y;
};

// Row t of toolchain_rms_norm (the pool's unit of work).
static void rms_norm_row(void* task, size_t row) {
  const RmsNormTask& rn = *static_cast<const RmsNormTask*>(task);
  const int64_t t = static_cast<int64_t>(row), d = rn.d;
  const float* xt = rn.x + t * d;
  f32x16 acc = f32x16{};
  float tail = 0.0f;
  int64_t k = 0;
  for (; k + L <= d; k += L) {
    f32x16 a;
    a = load16(xt + k);
    acc = acc + a * a;
  }
  for (; k < d; ++k) tail = std::fma(xt[k], xt[k], tail);
  float lanes[L];
  store16(lanes, acc);
  const float r = 1.0f / std::sqrt((lane_sum(lanes) + tail) / static_cast<float>(d) + rn.eps);
  float* yt = rn.y + t * d;
  for (k = 0; k < d; ++k) yt[k] = rn.w[k] * (xt[k] * r);
}

// y [T, d] = w * (x * r), r = 1 / sqrt(mean_k x[t, k]^2 + eps) per row (RMSNorm; rows split over the thread pool).
int toolchain_rms_norm(const float* x, int64_t T, int64_t d, const float* w, float eps, float* y) {
  if (T < 0 || d <= 0) return -1;
  RmsNormTask task{x, d, w, eps, y};
  parallel_for(rms_norm_row, &task, T, T * d, kPoolRowWork);   // the rows of x over the pool (a prefill chunk)
  return 0;
}

// Sum of x[k] y[k] over k < n: 16 lanes (k mod 16, fused multiply-adds in increasing k), lane_sum's tree,
// then the tail in order by std::fma (written out: left to `-ffp-contract=fast`, GCC fuses a scalar tail on aarch64
// while x86 builds and clang vectorize part of it unfused, so the bits would differ by compiler and -march).
inline float dot(const float* __restrict x, const float* __restrict y, int64_t n) {
  f32x16 acc = f32x16{};
  int64_t k = 0;
  for (; k + L <= n; k += L) {
    f32x16 a, b;
    a = load16(x + k);
    b = load16(y + k);
    acc = acc + a * b;
  }
  float lanes[L];
  store16(lanes, acc);
  float tail = 0.0f;
  for (; k < n; ++k) tail = std::fma(x[k], y[k], tail);
  return lane_sum(lanes) + tail;
}

struct LoraTask {
  const float* x;
  int64_t in, o;
  const float *bias, *a, *b, *bt;
  int64_t r;
  float s;
  const float* residual;
  float* y;
  float* h;          // [T, r]: x A^T, row t written by row t's task
  bool in_place;
};

// Row t of toolchain_lora_linear_a8 after the int4 product (the pool's unit of work): h[t] = x[t] A^T, then the
// epilogue over the row's o outputs.
static void lora_row(void* task, size_t row) {
  const LoraTask& k = *static_cast<const LoraTask*>(task);
  const int64_t t = static_cast<int64_t>(row), in = k.in, o = k.o, r = k.r;
  const float *bias = k.bias, *b = k.b;
  const float s = k.s;
  float* ht = nullptr;
  if (k.a != nullptr) {
    ht = k.h + t * r;
    for (int64_t j = 0; j < r; ++j) ht[j] = dot(k.x + t * in, k.a + j * in, in);
  }
  const float* rt = k.residual != nullptr ? k.residual + t * o : nullptr;
  float* yt = k.y + t * o;
  int64_t n0 = 0;
  if (k.in_place) {
    for (; n0 + LORA_BLOCK <= o; n0 += LORA_BLOCK)
      lora_epilogue<LORA_BLOCK, 8>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, b + n0 * r, 1, r, s,
                                   rt != nullptr ? rt + n0 : nullptr, LORA_BLOCK);
    for (; n0 < o; n0 += L)
      lora_epilogue<L, 8>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, b + n0 * r, 1, r, s,
                          rt != nullptr ? rt + n0 : nullptr, std::min<int64_t>(L, o - n0));
    return;
  }
  for (; n0 + LORA_BLOCK <= o; n0 += LORA_BLOCK)
    lora_epilogue<LORA_BLOCK, 1>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, k.bt + n0, o, r, s,
                                 rt != nullptr ? rt + n0 : nullptr, LORA_BLOCK);
  for (; n0 < o; n0 += L)
    lora_epilogue<L, 1>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, k.bt + n0, o, r, s,
                        rt != nullptr ? rt + n0 : nullptr, std::min<int64_t>(L, o - n0));
}

// b [o, r] transposed into bt [r, o], outputs [i kBTransposeBlock, (i + 1) kBTransposeBlock) (the pool's unit of work).
struct BTransposeTask {
  const float* b;
  int64_t o, r;
  float* bt;
};
constexpr int64_t kBTransposeBlock = 512;
static void b_transpose_block(void* task, size_t i) {
  const BTransposeTask& k = *static_cast<const BTransposeTask*>(task);
  const int64_t n0 = static_cast<int64_t>(i) * kBTransposeBlock, n1 = std::min(k.o, n0 + kBTransposeBlock);
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t j = 0; j < k.r; ++j) k.bt[j * k.o + n] = k.b[n * k.r + j];
}

// y [T, o] = residual + ((x W^T + bias) + s (x A^T) B^T): the int4 W4A8 product (toolchain_int4_linear_a8)
// with the projection's bias, its LoRA pair a [r, in], b [o, r] (scale s) and a residual [T, o] added;
// bias, a / b and residual may each be null (absent). h = x A^T per row is `dot`; (h B^T)[n] = sum_j h[j]
// b[n, j] as fused multiply-adds in increasing j (explicit std::fma, not left to the compiler's contraction),
// from b transposed once per call, 64 outputs at a time in registers together with the bias and residual adds
// (lora_epilogue: one pass over y instead of r + 1); after the int4 product the rows of x are split over the
// thread pool (`lora_row`). Returns 0, or -1 for bad arguments.
int toolchain_lora_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales, int64_t o,
                             int64_t ng, int64_t group, const float* bias, const float* a, const float* b, int64_t r,
                             float s, const float* residual, float* y) {
  if ((a == nullptr) != (b == nullptr) || r < 0) return -1;
  const int rc = toolchain_int4_linear_a8(x, T, in, q, scales, o, ng, group, y);
  if (rc != 0) return rc;
  thread_local std::vector<float> h, bt;
  // b is read in place for one row of x when r is a small constant (decode, rank 8: the epilogue's loads of b
  // are strided, no transposed copy per call), else transposed once per call for all rows (blocks of outputs
  // over the pool for a prefill chunk: a copy, the same bits).
  const bool in_place = T == 1 && r == 8;
  if (a != nullptr) {
    h.resize(static_cast<size_t>(T * r));
    if (!in_place) {
      bt.resize(static_cast<size_t>(r * o));
      BTransposeTask tr{b, o, r, bt.data()};
      parallel_for(b_transpose_block, &tr, (o + kBTransposeBlock - 1) / kBTransposeBlock, T > 1 ? r * o : 0,
                   kPoolRowWork);
    }
  }
  LoraTask task{x, in, o, bias, a, b, bt.data(), r, s, residual, y, h.data(), in_place};
  parallel_for(lora_row, &task, T, T * (r * in + (r + 2) * o), kPoolRowWork);   // the rows of x over the pool
  return 0;
}

// y [T, rows] = x W[row0 : row0 + rows]^T + s (x A^T) B[row0 : row0 + rows]^T: toolchain_lora_linear_a8 (no bias, no
// residual) on rows row0 .. row0 + rows - 1 of W [o, i] (q, scales) and of B [o, r], read in place (an MLP chunk's
// gate / up product in the training step without copies of the chunk's weight rows): the bits of
// toolchain_lora_linear_a8 on copies of those rows. Returns 0, or -1 for bad arguments (the rows outside [0, o)).
int toolchain_lora_linear_a8_rows(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales,
                                  int64_t o, int64_t ng, int64_t group, int64_t row0, int64_t rows, const float* a,
                                  const float* b, int64_t r, float s, float* y) {
  if (row0 < 0 || rows < 0 || row0 + rows > o || in <= 0 || in % 2 || r < 0) return -1;
  return toolchain_lora_linear_a8(x, T, in, q + row0 * (in / 2), scales + row0 * ng, rows, ng, group, nullptr, a,
                                  b == nullptr ? nullptr : b + row0 * r, r, s, nullptr, y);
}

struct RopeTask {
  const float* x;
  int64_t C, n, D, pos;
  float inv_freq[512];
  float* out;
};

// Token c of toolchain_rope_heads, all n heads (the pool's unit of work).
static void rope_token(void* task, size_t token) {
  const RopeTask& k = *static_cast<const RopeTask*>(task);
  const int64_t c = static_cast<int64_t>(token), C = k.C, n = k.n, D = k.D, half = D / 2;
  float cs[512], sn[512];
  const float p = static_cast<float>(k.pos + c);
  for (int64_t i = 0; i < half; ++i) {
    const float f = p * k.inv_freq[i];
    cs[i] = std::cos(f);
    sn[i] = std::sin(f);
  }
  for (int64_t h = 0; h < n; ++h) {
    const float* xh = k.x + c * n * D + h * D;
    float* oh = k.out + (h * C + c) * D;
    for (int64_t i = 0; i < half; ++i) {
      oh[i] = xh[i] * cs[i] + (-xh[i + half]) * sn[i];
      oh[i + half] = xh[i + half] * cs[i] + xh[i] * sn[i];
    }
  }
}

// out [n, C, D] = RoPE of x [C, n * D] split into n heads, the C tokens at positions pos .. pos + C - 1:
// out = x cos + rot(x) sin, rot(x) = (-x[D/2:], x[:D/2]), cos / sin of (pos + c) * theta^(-2i / D) in float32
// as transformers computes them. Returns 0, or -1 for bad arguments (D odd).
int toolchain_rope_heads(const float* x, int64_t C, int64_t n, int64_t D, int64_t pos, float theta, float* out) {
  if (C < 0 || n <= 0 || D <= 0 || D % 2 || D > 1024 || pos < 0) return -1;
  RopeTask task{x, C, n, D, pos, {}, out};
  for (int64_t i = 0; i < D / 2; ++i)
    task.inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
  parallel_for(rope_token, &task, C, C * n * D, kPoolRowWork);   // the tokens of a prefill chunk over the pool
  return 0;
}

// exp(x) per lane, Cephes' expf: x = n ln2 + f (n rounded to nearest, ln2 in two parts), exp(f) a degree-6
// polynomial, times 2^n from the exponent bits; x clamped to [-87.34, 88.38] (normal results). Within 2 ulp
// of the correctly rounded value; element-wise, so any vector width gives the same bits.
extern "C++" {   // (a template, within the extern "C" block)
template <typename F, typename I>
inline F exp_lanes(F x) {
  x = x > 88.3762626647949f ? F{} + 88.3762626647949f : x;
  x = x < -87.3365478515625f ? F{} - 87.3365478515625f : x;
  const F n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   // round to nearest (|n| < 2^22)
  F f = x - n * 0.693359375f;
  f = f - n * -2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  p = p * (f * f) + f + 1.0f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
}  // extern "C++"

#ifdef TOOLCHAIN_F32X16_HALVES
inline f32x16 exp16(f32x16 x) {   // each half by the same body
  typedef int32_t i32x8 __attribute__((vector_size(32)));
  return {exp_lanes<f32x8, i32x8>(x.lo), exp_lanes<f32x8, i32x8>(x.hi)};
}
#else
inline f32x16 exp16(f32x16 x) {
  typedef int32_t i32x16 __attribute__((vector_size(64)));
  return exp_lanes<f32x16, i32x16>(x);
}
#endif

// out [N] = silu(g) * u = g / (1 + exp(-g)) * u (SwiGLU), exp by exp16 (the tail in a zero-padded vector).
inline f32x16 swiglu16(f32x16 g, f32x16 u) { return g / (1.0f + exp16(-g)) * u; }

struct SwigluTask {
  const float *g, *u;
  int64_t N;
  float* out;
};
constexpr int64_t kSwigluBlock = 64 * L;   // elements per unit of work (a multiple of the 16 lanes)

// Elements [i kSwigluBlock, (i + 1) kSwigluBlock) of toolchain_swiglu (the pool's unit of work): whole vectors of
// 16, the tail (in the last block only) in a zero-padded one; element-wise, so the blocks do not change the bits.
static void swiglu_block(void* task, size_t i) {
  const SwigluTask& a = *static_cast<const SwigluTask*>(task);
  const int64_t k0 = static_cast<int64_t>(i) * kSwigluBlock;
  const int64_t N = std::min(a.N, k0 + kSwigluBlock) - k0;
  const float *g = a.g + k0, *u = a.u + k0;
  float* out = a.out + k0;
  int64_t k = 0;
  for (; k + L <= N; k += L) {
    f32x16 gv, uv;
    gv = load16(g + k);
    uv = load16(u + k);
    const f32x16 ov = swiglu16(gv, uv);
    store16(out + k, ov);
  }
  if (k < N) {
    float gt[L] = {}, ut[L] = {}, ot[L];
    std::memcpy(gt, g + k, static_cast<size_t>(N - k) * sizeof(float));
    std::memcpy(ut, u + k, static_cast<size_t>(N - k) * sizeof(float));
    f32x16 gv, uv;
    gv = load16(gt);
    uv = load16(ut);
    const f32x16 ov = swiglu16(gv, uv);
    store16(ot, ov);
    std::memcpy(out + k, ot, static_cast<size_t>(N - k) * sizeof(float));
  }
}

int toolchain_swiglu(const float* g, const float* u, int64_t N, float* out) {
  if (N < 0) return -1;
  SwigluTask task{g, u, N, out};
  parallel_for(swiglu_block, &task, (N + kSwigluBlock - 1) / kSwigluBlock, 16 * N);   // blocks over the pool
  return 0;
}
}  // extern "C"


// Causal attention of a whole training sequence, forward and backward (`--compute int8` programs' training
// methods; references `attention_train_reference` / `attention_train_backward_reference` in
// toolchain/mesp/ops/attention.py). q [H, T, D], k, v [Hk, T, D] (post-RoPE; query head h reads kv head h / (H / Hk)),
// c = `scale`:
//   S = c Q K^T (j <= i),  P = softmax over j <= i (m = max, e = exp(s - m) by exp16, P = e / sum e),  O = P V
//   backward: dP = dO V^T,  rows_i = dO_i . O_i,  dS = P (dP - rows),  dQ = c dS K,  dK = c dS^T Q,  dV = P^T dO
// Per query head (the pool's unit of work), with its operands copied to row-major panels padded with zeros to a
// multiple of 16 columns (Dp) and rows (Tp): the score-like products (S, dP) are 4 query rows x 16 keys per
// register with k / v transposed ([Dp, Tp]); P V, dS K, P^T dO and dS^T Q are 4 rows x 64 columns of D per pass,
// summed in increasing key (or query) order with fused multiply-adds. The same sums in the same order on every
// CPU and whichever thread runs a head: the bits depend on neither (one generic body; the compiler picks the vector
// width). A shared kv head's dK, dV are summed over its query heads in increasing h after the heads' tasks.
namespace {

constexpr int64_t kAttnRows = 4;    // query (or key) rows per register block
#if defined(__x86_64__) && !defined(__AVX512F__)
// 256-bit x86 (16 ymm registers): 4 rows x 4 vectors of 16 would be 32 registers of accumulators, spilled on every
// product; 4 x 1 is 8 (GCC 12, -march=x86-64-v3: attention_train 29.5 -> 16.8 ms, its backward 74 -> 37 ms per
// 0.5B layer; docs/kernels.md "The AVX2 training kernels"). Only the tiling changes: the same sums in the same order.
constexpr int64_t kAttnCols = 1;
#else
constexpr int64_t kAttnCols = 4;    // vectors of 16 per register block (64 keys, or 64 columns of D)
#endif

inline int64_t round16(int64_t n) { return (n + L - 1) / L * L; }

// rows [0, n) of a [n, D] matrix with row stride ld -> a zero-padded [np, Dp] panel; transposed: [Dp, np].
void attn_panel(const float* src, int64_t n, int64_t D, int64_t ld, int64_t np, int64_t Dp, float* dst,
                bool transposed) {
  std::fill(dst, dst + np * Dp, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) {
      if (transposed) dst[d * np + i] = src[i * ld + d];
      else dst[i * Dp + d] = src[i * ld + d];
    }
}

// Rows i0 .. i0 + 3 of out = scale * a bt, columns j0 .. j0 + W NB - 1 (W: V's lanes, 16 for f32x16): a [., Dp],
// bt [Dp, Tp], out [., Tp].
template <typename V, int NB>
inline void attn_scores_vec(const float* a, const float* bt, int64_t Tp, int64_t Dp, float scale, float* out,
                            int64_t i0, int64_t j0) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  V acc[kAttnRows][NB] = {};
  for (int64_t d = 0; d < Dp; ++d) {
    V b[NB];
    for (int c = 0; c < NB; ++c) std::memcpy(&b[c], bt + d * Tp + j0 + c * W, sizeof(V));
    for (int64_t r = 0; r < kAttnRows; ++r) {
      const float x = a[(i0 + r) * Dp + d];
      for (int c = 0; c < NB; ++c) acc[r][c] += x * b[c];
    }
  }
  for (int64_t r = 0; r < kAttnRows; ++r)
    for (int c = 0; c < NB; ++c) {
      const V v = acc[r][c] * scale;
      std::memcpy(out + (i0 + r) * Tp + j0 + c * W, &v, sizeof v);
    }
}

#ifdef TOOLCHAIN_F32X16_HALVES
// f32x16 as halves: GCC keeps an array of them in memory, so the attention blocks run on 8-lane vectors, N of them
// across (N = 2 NB) in passes of kAttnEights (2: 4 rows x 2 accumulators; 3 and 4 were slower, 1 too). Each
// output element is still the sum over d (or t) in increasing order by fused multiply-adds: the same bits.
constexpr int kAttnEights = 2;
template <int N, typename F>
inline void attn_by_eights(F&& f) {
  int c = 0;
  for (; c + kAttnEights <= N; c += kAttnEights) f(std::integral_constant<int, kAttnEights>{}, c * 8);
  if constexpr (N % kAttnEights != 0) f(std::integral_constant<int, N % kAttnEights>{}, c * 8);
}
#endif

// Rows i0 .. i0 + 3 of out = scale * a bt, columns j0 .. j0 + 16 NB - 1.
template <int NB>
inline void attn_scores_block(const float* a, const float* bt, int64_t Tp, int64_t Dp, float scale, float* out,
                              int64_t i0, int64_t j0) {
#ifdef TOOLCHAIN_F32X16_HALVES
  attn_by_eights<2 * NB>([&](auto nv, int64_t c) {
    attn_scores_vec<f32x8, decltype(nv)::value>(a, bt, Tp, Dp, scale, out, i0, j0 + c);
  });
#else
  attn_scores_vec<f32x16, NB>(a, bt, Tp, Dp, scale, out, i0, j0);
#endif
}

// out[i][j] = scale * sum_d a[i][d] bt[d][j] for the row blocks of 4 covering [0, T) and j < round16(i + 1) (the
// causal part of each row in whole vectors: the same for the 4 rows of a block, as i0 is a multiple of 4):
// a [Tp, Dp], bt [Dp, Tp], out [Tp, Tp].
void attn_scores(const float* a, const float* bt, int64_t T, int64_t Tp, int64_t Dp, float scale, float* out) {
  for (int64_t i0 = 0; i0 < T; i0 += kAttnRows) {
    const int64_t jend = round16(i0 + kAttnRows);
    int64_t j0 = 0;
    for (; j0 + kAttnCols * L <= jend; j0 += kAttnCols * L)
      attn_scores_block<kAttnCols>(a, bt, Tp, Dp, scale, out, i0, j0);
    for (; j0 < jend; j0 += L) attn_scores_block<1>(a, bt, Tp, Dp, scale, out, i0, j0);
  }
}

// Row i of the scores -> the probabilities P[i][j] for j <= i, 0 for i < j < round16(i + 1).
void attn_softmax_row(float* s, int64_t i) {
  const int64_t n = i + 1, nv = round16(n);
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  f32x16 sum = f32x16{};
  for (int64_t j = 0; j < nv; j += L) {
    f32x16 v;
    v = load16(s + j);
    f32x16 e = exp16(v - m);
    if (j + L > n)
      for (int64_t l = n - j; l < L; ++l) e[l] = 0.0f;
    sum += e;
    store16(s + j, e);
  }
  float lanes[L];
  store16(lanes, sum);
  const float denom = lane_sum(lanes);
  for (int64_t j = 0; j < nv; j += L) {
    f32x16 v;
    v = load16(s + j);
    v = v / denom;
    store16(s + j, v);
  }
}

// out[r][d0 ..] += sum over the rows t of `b` in [t0, t1) of p[t * sp + r * sr] b[t][d0 .. d0 + W NB - 1], r < 4,
// in increasing t (fused multiply-adds from 0): the P V-like products (sp = 1: rows of p; sr = Tp) and the
// P^T dO-like ones (sp = Tp, sr = 1: columns of p). W: V's lanes.
template <typename V, int NB>
inline void attn_weighted_vec(const float* p, int64_t sp, int64_t sr, int64_t t0, int64_t t1, const float* b,
                              int64_t Dp, int64_t d0, float* out, int64_t ldo) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  V acc[kAttnRows][NB] = {};
  for (int64_t t = t0; t < t1; ++t) {
    V v[NB];
    for (int c = 0; c < NB; ++c) std::memcpy(&v[c], b + t * Dp + d0 + c * W, sizeof(V));
    for (int64_t r = 0; r < kAttnRows; ++r) {
      const float x = p[t * sp + r * sr];
      for (int c = 0; c < NB; ++c) acc[r][c] += x * v[c];
    }
  }
  for (int64_t r = 0; r < kAttnRows; ++r)
    for (int c = 0; c < NB; ++c) std::memcpy(out + r * ldo + d0 + c * W, &acc[r][c], sizeof(V));
}

// The same for columns d0 .. d0 + 16 NB - 1.
template <int NB>
inline void attn_weighted_rows(const float* p, int64_t sp, int64_t sr, int64_t t0, int64_t t1, const float* b,
                               int64_t Dp, int64_t d0, float* out, int64_t ldo) {
#ifdef TOOLCHAIN_F32X16_HALVES
  attn_by_eights<2 * NB>([&](auto nv, int64_t c) {
    attn_weighted_vec<f32x8, decltype(nv)::value>(p, sp, sr, t0, t1, b, Dp, d0 + c, out, ldo);
  });
#else
  attn_weighted_vec<f32x16, NB>(p, sp, sr, t0, t1, b, Dp, d0, out, ldo);
#endif
}

template <typename F>
inline void attn_by_column_blocks(int64_t Dp, F&& f) {
  int64_t d0 = 0;
  for (; d0 + kAttnCols * L <= Dp; d0 += kAttnCols * L) f(std::integral_constant<int, kAttnCols>{}, d0);
  for (; d0 < Dp; d0 += L) f(std::integral_constant<int, 1>{}, d0);
}

// out[r][:] = sum_{j < round16(i0 + 4)} p[i0 + r][j] b[j][:] for r < 4 (p's entries past the causal part are 0),
// rows of b [Tp, Dp]; sums over j in increasing order. out: row stride ldo, Dp columns.
void attn_rows_by_rows(const float* p, int64_t Tp, int64_t i0, const float* b, int64_t Dp, float* out, int64_t ldo) {
  const int64_t jend = round16(i0 + kAttnRows);
  attn_by_column_blocks(Dp, [&](auto nb, int64_t d0) {
    attn_weighted_rows<decltype(nb)::value>(p + i0 * Tp, 1, Tp, 0, jend, b, Dp, d0, out, ldo);
  });
}

// out[r][:] = sum_{j0 <= i < T} p[i][j0 + r] b[i][:] for r < 4 (p[i][j] is 0 for i < j < round16(i + 1), written
// there: round16(i + 1) >= round16(j0 + 4) for i >= j0); sums over i in increasing order.
void attn_cols_by_rows(const float* p, int64_t T, int64_t Tp, int64_t j0, const float* b, int64_t Dp, float* out,
                       int64_t ldo) {
  attn_by_column_blocks(Dp, [&](auto nb, int64_t d0) {
    attn_weighted_rows<decltype(nb)::value>(p + j0, Tp, 1, j0, T, b, Dp, d0, out, ldo);
  });
}

struct AttnTrainTask {
  const float *q, *k, *v, *dout, *o;   // dout, o: [T, H D] (backward only)
  int64_t H, Hk, T, D;
  float scale;
  float* out;        // forward: o [T, H D]; backward: [H + 2 Hk, T, D] (dq, dk, dv)
  float* partial;    // backward: per query head its dK, dV [H, 2, T, D]
};

// The per-thread buffers of a head (kept across calls: reused, not reallocated, at one shape).
struct AttnScratch {
  std::vector<float> qp, kp, kt, vp, vt, dop, p, ds, acc;
  void resize(int64_t Tp, int64_t Dp, bool backward) {
    for (auto* b : {&qp, &kt, &vp}) b->resize(static_cast<size_t>(Tp * Dp));
    p.resize(static_cast<size_t>(Tp * Tp));
    acc.resize(static_cast<size_t>(kAttnRows * Dp));
    if (backward) {
      for (auto* b : {&kp, &vt, &dop}) b->resize(static_cast<size_t>(Tp * Dp));
      ds.resize(static_cast<size_t>(Tp * Tp));
    }
  }
};

// One per thread, shared by the forward and backward heads (about 0.9 MiB at T = 256, D = 64).
thread_local AttnScratch attn_scratch;

// Query head h: the panels and P (probabilities, row by row).
void attn_head_probs(const AttnTrainTask& a, int64_t h, AttnScratch& s, int64_t Tp, int64_t Dp) {
  const int64_t T = a.T, D = a.D, j = h / (a.H / a.Hk);
  attn_panel(a.q + h * T * D, T, D, D, Tp, Dp, s.qp.data(), false);
  attn_panel(a.k + j * T * D, T, D, D, Tp, Dp, s.kt.data(), true);
  attn_panel(a.v + j * T * D, T, D, D, Tp, Dp, s.vp.data(), false);
  attn_scores(s.qp.data(), s.kt.data(), T, Tp, Dp, a.scale, s.p.data());
  for (int64_t i = 0; i < T; ++i) attn_softmax_row(s.p.data() + i * Tp, i);
}

void attention_train_head(void* task, size_t head) {
  const AttnTrainTask& a = *static_cast<const AttnTrainTask*>(task);
  const int64_t h = static_cast<int64_t>(head), T = a.T, D = a.D, Tp = round16(T), Dp = round16(D);
  AttnScratch& s = attn_scratch;
  s.resize(Tp, Dp, false);
  attn_head_probs(a, h, s, Tp, Dp);
  for (int64_t i0 = 0; i0 < T; i0 += kAttnRows) {   // O = P V, rows i0 .. i0 + 3
    attn_rows_by_rows(s.p.data(), Tp, i0, s.vp.data(), Dp, s.acc.data(), Dp);
    for (int64_t r = 0; r < std::min(kAttnRows, T - i0); ++r)
      std::memcpy(a.out + (i0 + r) * a.H * D + h * D, s.acc.data() + r * Dp, static_cast<size_t>(D) * sizeof(float));
  }
}

void attention_train_backward_head(void* task, size_t head) {
  const AttnTrainTask& a = *static_cast<const AttnTrainTask*>(task);
  const int64_t h = static_cast<int64_t>(head), T = a.T, D = a.D, H = a.H, Tp = round16(T), Dp = round16(D);
  const int64_t j = h / (H / a.Hk);
  AttnScratch& s = attn_scratch;
  s.resize(Tp, Dp, true);
  attn_head_probs(a, h, s, Tp, Dp);
  attn_panel(a.k + j * T * D, T, D, D, Tp, Dp, s.kp.data(), false);
  attn_panel(a.v + j * T * D, T, D, D, Tp, Dp, s.vt.data(), true);
  attn_panel(a.dout + h * D, T, D, H * D, Tp, Dp, s.dop.data(), false);
  attn_scores(s.dop.data(), s.vt.data(), T, Tp, Dp, 1.0f, s.ds.data());           // dP = dO V^T
  for (int64_t i = 0; i < T; ++i) {                                              // dS = P (dP - rows_i)
    const float* doi = a.dout + i * H * D + h * D;
    const float* oi = a.o + i * H * D + h * D;
    const float rows = dot(doi, oi, D);
    float* dsi = s.ds.data() + i * Tp;
    const float* pi = s.p.data() + i * Tp;
    for (int64_t jj = 0; jj < round16(i + 1); ++jj) dsi[jj] = jj <= i ? pi[jj] * (dsi[jj] - rows) : 0.0f;
  }
  float* dq = a.out + h * T * D;
  float* dk = a.partial + (2 * h) * T * D;
  float* dv = a.partial + (2 * h + 1) * T * D;
  for (int64_t i0 = 0; i0 < T; i0 += kAttnRows) {                               // dQ = c dS K
    attn_rows_by_rows(s.ds.data(), Tp, i0, s.kp.data(), Dp, s.acc.data(), Dp);
    for (int64_t r = 0; r < std::min(kAttnRows, T - i0); ++r)
      for (int64_t d = 0; d < D; ++d) dq[(i0 + r) * D + d] = s.acc[static_cast<size_t>(r * Dp + d)] * a.scale;
  }
  for (int64_t j0 = 0; j0 < T; j0 += kAttnRows) {                               // dK = c dS^T Q, dV = P^T dO
    attn_cols_by_rows(s.ds.data(), T, Tp, j0, s.qp.data(), Dp, s.acc.data(), Dp);
    for (int64_t r = 0; r < std::min(kAttnRows, T - j0); ++r)
      for (int64_t d = 0; d < D; ++d) dk[(j0 + r) * D + d] = s.acc[static_cast<size_t>(r * Dp + d)] * a.scale;
    attn_cols_by_rows(s.p.data(), T, Tp, j0, s.dop.data(), Dp, s.acc.data(), Dp);
    for (int64_t r = 0; r < std::min(kAttnRows, T - j0); ++r)
      std::memcpy(dv + (j0 + r) * D, s.acc.data() + r * Dp, static_cast<size_t>(D) * sizeof(float));
  }
}

// kv head j's dK, dV: the partials of its query heads summed in increasing h.
void attention_train_kv_sum(void* task, size_t head) {
  const AttnTrainTask& a = *static_cast<const AttnTrainTask*>(task);
  const int64_t j = static_cast<int64_t>(head), G = a.H / a.Hk, n = a.T * a.D;
  float* dk = a.out + (a.H + j) * n;
  float* dv = a.out + (a.H + a.Hk + j) * n;
  for (int64_t g = 0; g < G; ++g) {
    const float* pk = a.partial + 2 * (j * G + g) * n;
    const float* pv = pk + n;
    for (int64_t e = 0; e < n; ++e) {
      dk[e] = g == 0 ? pk[e] : dk[e] + pk[e];
      dv[e] = g == 0 ? pv[e] : dv[e] + pv[e];
    }
  }
}

}  // namespace

extern "C" {

// o [T, H*D] = causal softmax attention of q [H, T, D] over k, v [Hk, T, D] (the block above). Returns 0, or -1
// for bad arguments.
int toolchain_attention_train(const float* q, const float* k, const float* v, int64_t H, int64_t Hk, int64_t T,
                              int64_t D, float scale, float* out) {
  if (H <= 0 || Hk <= 0 || H % Hk || T < 0 || D <= 0) return -1;
  AttnTrainTask task{q, k, v, nullptr, nullptr, H, Hk, T, D, scale, out, nullptr};
  parallel_for(attention_train_head, &task, H, H * T * T * D, kPoolRowWork);   // the query heads over the pool
  return 0;
}

// [H + 2 Hk, T, D] = dq, dk, dv of toolchain_attention_train for dout [T, H*D] (the gradient of its output), with
// o [T, H*D] its output. Returns 0, or -1 for bad arguments.
int toolchain_attention_train_backward(const float* dout, const float* q, const float* k, const float* v,
                                       const float* o, int64_t H, int64_t Hk, int64_t T, int64_t D, float scale,
                                       float* out) {
  if (H <= 0 || Hk <= 0 || H % Hk || T < 0 || D <= 0) return -1;
  // every element is written by the heads' tasks (on the pool): not zeroed here, on the calling thread; freed after
  // the call (kept, it would add 2 H T D floats to the step's peak outside the attention backward)
  std::unique_ptr<float[]> partial(new float[static_cast<size_t>(2 * H * T * D)]);
  AttnTrainTask task{q, k, v, dout, o, H, Hk, T, D, scale, out, partial.get()};
  parallel_for(attention_train_backward_head, &task, H, 3 * H * T * T * D, kPoolRowWork);
  parallel_for(attention_train_kv_sum, &task, Hk, 2 * H * T * D, kPoolRowWork);
  return 0;
}

}  // extern "C"

// SwiGLU of an MLP chunk recomputed in the training backward, with its gradients, in one pass (`--compute int8`
// programs; reference `swiglu_train_reference` in toolchain/mesp/ops/swiglu.py): for g, u, da [N],
//   e = exp16(-g), act = g / (1 + e) * u (toolchain_swiglu's value), sg = 1 / (1 + e),
//   du = da * (g * sg), dg = da * u * sg * (1 + g * (1 - sg))
// out [3, N] = act, dg, du. Element-wise: blocks of 1024 over the pool, the bits independent of both.
struct SwigluTrainTask {
  const float *g, *u, *da;
  int64_t N;
  float* out;
};

inline void swiglu_train16(const float* g, const float* u, const float* da, float* act, float* dg, float* du) {
  f32x16 gv, uv, dv;
  gv = load16(g);
  uv = load16(u);
  dv = load16(da);
  const f32x16 e = exp16(-gv);
  const f32x16 av = gv / (1.0f + e) * uv;
  const f32x16 sg = 1.0f / (1.0f + e);
  const f32x16 duv = dv * (gv * sg);
  const f32x16 dgv = dv * uv * sg * (1.0f + gv * (1.0f - sg));
  store16(act, av);
  store16(dg, dgv);
  store16(du, duv);
}

static void swiglu_train_block(void* task, size_t i) {
  const SwigluTrainTask& a = *static_cast<const SwigluTrainTask*>(task);
  const int64_t k0 = static_cast<int64_t>(i) * kSwigluBlock, N = a.N;
  const int64_t n = std::min(N, k0 + kSwigluBlock) - k0;
  float *act = a.out + k0, *dg = a.out + N + k0, *du = a.out + 2 * N + k0;
  int64_t k = 0;
  for (; k + L <= n; k += L) swiglu_train16(a.g + k0 + k, a.u + k0 + k, a.da + k0 + k, act + k, dg + k, du + k);
  if (k < n) {   // the tail in zero-padded vectors
    float gt[L] = {}, ut[L] = {}, dt[L] = {}, at[L], gg[L], uu[L];
    const size_t bytes = static_cast<size_t>(n - k) * sizeof(float);
    std::memcpy(gt, a.g + k0 + k, bytes);
    std::memcpy(ut, a.u + k0 + k, bytes);
    std::memcpy(dt, a.da + k0 + k, bytes);
    swiglu_train16(gt, ut, dt, at, gg, uu);
    std::memcpy(act + k, at, bytes);
    std::memcpy(dg + k, gg, bytes);
    std::memcpy(du + k, uu, bytes);
  }
}

extern "C" {
int toolchain_swiglu_train(const float* g, const float* u, const float* da, int64_t N, float* out) {
  if (N < 0) return -1;
  SwigluTrainTask task{g, u, da, N, out};
  parallel_for(swiglu_train_block, &task, (N + kSwigluBlock - 1) / kSwigluBlock, 16 * N, kPoolRowWork);
  return 0;
}
}  // extern "C"


// The LM head's online softmax over one vocabulary chunk (`--compute int8` head_loss; references in
// toolchain/mesp/ops/ce_online.py): for logits z [C, V] and the running row max m [C] and sum s [C],
//   online_softmax_stats: out [C, 3] = (m' = max(m, max_j z_j), s' = a s + sum_j exp16(z_j - m'), a = exp16(m - m'))
//                         (a = 0 where m is -inf: the first chunk), the sum in 16 lanes (j mod 16) + lane_sum's tree
//   exp_sub_rows:         out [C, V] = exp16(z - m[row])   (the same exp16 values the sum added)
// Rows over the pool; element-wise within a row, so the bits depend on neither the threads nor the vector width.
struct SoftmaxRowsTask {
  const float *z, *m, *s;
  int64_t C, V;
  float* out;
};

// exp16(z[k] - m) for k < V into out (when out is not null), and their sum (16 lanes, the tail zero-padded).
inline float exp_row(const float* z, int64_t V, float m, float* out) {
  f32x16 sum = f32x16{};
  int64_t k = 0;
  for (; k + L <= V; k += L) {
    f32x16 v;
    v = load16(z + k);
    const f32x16 e = exp16(v - m);
    sum += e;
    if (out != nullptr) store16(out + k, e);
  }
  if (k < V) {
    float t[L] = {}, et[L];
    std::memcpy(t, z + k, static_cast<size_t>(V - k) * sizeof(float));
    f32x16 v;
    v = load16(t);
    f32x16 e = exp16(v - m);
    for (int64_t l = V - k; l < L; ++l) e[l] = 0.0f;
    sum += e;
    store16(et, e);
    if (out != nullptr) std::memcpy(out + k, et, static_cast<size_t>(V - k) * sizeof(float));
  }
  float lanes[L];
  store16(lanes, sum);
  return lane_sum(lanes);
}

static void softmax_stats_row(void* task, size_t row) {
  const SoftmaxRowsTask& a = *static_cast<const SoftmaxRowsTask*>(task);
  const int64_t t = static_cast<int64_t>(row);
  const float* z = a.z + t * a.V;
  float mx = a.m[t];
  for (int64_t k = 0; k < a.V; ++k) mx = z[k] > mx ? z[k] : mx;
  float scale = 0.0f;
  if (a.m[t] != -INFINITY) {
    const f32x16 d = exp16(f32x16{} + (a.m[t] - mx));
    scale = d[0];
  }
  float* o = a.out + 3 * t;
  o[0] = mx;
  o[1] = scale * a.s[t] + exp_row(z, a.V, mx, nullptr);
  o[2] = scale;
}

static void exp_sub_row(void* task, size_t row) {
  const SoftmaxRowsTask& a = *static_cast<const SoftmaxRowsTask*>(task);
  const int64_t t = static_cast<int64_t>(row);
  exp_row(a.z + t * a.V, a.V, a.m[t], a.out + t * a.V);
}

extern "C" {
int toolchain_online_softmax_stats(const float* z, const float* m, const float* s, int64_t C, int64_t V, float* out) {
  if (C < 0 || V <= 0) return -1;
  SoftmaxRowsTask task{z, m, s, C, V, out};
  parallel_for(softmax_stats_row, &task, C, C * V, kPoolRowWork);
  return 0;
}

int toolchain_exp_sub_rows(const float* z, const float* m, int64_t C, int64_t V, float* out) {
  if (C < 0 || V <= 0) return -1;
  SoftmaxRowsTask task{z, m, nullptr, C, V, out};
  parallel_for(exp_sub_row, &task, C, C * V, kPoolRowWork);
  return 0;
}
}  // extern "C"

// A projection's LoRA backward (`--compute int8` training methods; references `lora_backward_reference`,
// `lora_rows_backward_reference` in toolchain/mesp/ops/lora_linear.py). For dy [T, o], x [T, i], a [r, i], b [o, r],
// the scale s and dx [T, i] (the frozen product's dX), toolchain::lora_backward's out, flat [(T + r) i + o r], is
//   out[0, T i)             dx + dh A          h = x A^T, dh = s (dy B) (each `dot`'s order, over i / o; dh then
//                                              times s); dh A: fused multiply-adds over j in increasing order from
//                                              0, then added to dx
//   out[T i, (T + r) i)     dA = dh^T x        [r, i]: fused multiply-adds over t in increasing order from 0
//   out[(T + r) i, ...)     dB = s (dy^T h)    [o, r]: the same over t, then times s
// and toolchain::lora_rows_backward (an MLP chunk's LoRA rows: dy [T, C], h [T, r], b [C, r]) out [C + T, r] =
// (s (dy^T h), s (dy b)), the same two sums. The rows of x over the pool for h, dh and dx; then dA's column blocks and
// dB's row blocks (each element sums its T terms in order whichever thread runs it: the bits depend neither on the
// thread count nor on the kernel path, one generic body).
struct LoraBackTask {
  const float *dy, *x, *a, *bt, *dx;   // bt: B^T [r, o], transposed once per call
  int64_t T, in, o, r;
  float s;
  float *h, *dh, *out;   // h, dh [T, r] scratch (lora_rows_backward: h is the input and dh its out's rows C..)
};
constexpr int64_t kLoraBackBlock = 64;

// out[q] = sum_m c[m cs] p[m ps + q] for q < nb <= kLoraBackBlock: fused multiply-adds in increasing m from 0 (16-lane
// vectors for a whole block, std::fma for a partial one: the same operations per element).
inline void lora_colsum(const float* c, int64_t cs, const float* p, int64_t ps, int64_t m, int64_t nb, float* out) {
  if (nb == kLoraBackBlock) {
    f32x16 a0 = f32x16{}, a1 = f32x16{}, a2 = f32x16{}, a3 = f32x16{};
    for (int64_t k = 0; k < m; ++k) {
      const float w = c[k * cs];
      const float* pk = p + k * ps;
      f32x16 v0, v1, v2, v3;
      v0 = load16(pk);
      v1 = load16(pk + 16);
      v2 = load16(pk + 32);
      v3 = load16(pk + 48);
      a0 = a0 + w * v0;
      a1 = a1 + w * v1;
      a2 = a2 + w * v2;
      a3 = a3 + w * v3;
    }
    store16(out, a0);
    store16(out + 16, a1);
    store16(out + 32, a2);
    store16(out + 48, a3);
    return;
  }
  float acc[kLoraBackBlock] = {};
  for (int64_t k = 0; k < m; ++k) {
    const float w = c[k * cs];
    const float* pk = p + k * ps;
    for (int64_t q = 0; q < nb; ++q) acc[q] = std::fma(w, pk[q], acc[q]);
  }
  for (int64_t q = 0; q < nb; ++q) out[q] = acc[q];
}

// dh[t] = s (dy[t] b): per output j, dot(dy[t], B^T[j]) (dot's order over o), then times s.
inline void lora_dh_row(const float* dyt, const float* bt, int64_t o, int64_t r, float s, float* dht) {
  for (int64_t j = 0; j < r; ++j) dht[j] = s * dot(dyt, bt + j * o, o);
}

// Rows [n0, n0 + nb) of s (dy^T h) into db [o, r]: per j the T terms of each element in increasing t, then times s.
inline void lora_db_block(const float* dy, const float* h, int64_t T, int64_t o, int64_t r, float s, int64_t n0,
                          int64_t nb, float* db) {
  float col[kLoraBackBlock];
  for (int64_t j = 0; j < r; ++j) {
    lora_colsum(h + j, r, dy + n0, o, T, nb, col);
    for (int64_t n = 0; n < nb; ++n) db[(n0 + n) * r + j] = s * col[n];
  }
}

static void lora_back_row(void* task, size_t row) {
  const LoraBackTask& k = *static_cast<const LoraBackTask*>(task);
  const int64_t t = static_cast<int64_t>(row), in = k.in, r = k.r;
  const float* xt = k.x + t * in;
  float *ht = k.h + t * r, *dht = k.dh + t * r;
  for (int64_t j = 0; j < r; ++j) ht[j] = dot(xt, k.a + j * in, in);
  lora_dh_row(k.dy + t * k.o, k.bt, k.o, r, k.s, dht);
  const float* dxt = k.dx + t * in;
  float* y = k.out + t * in;
  float col[kLoraBackBlock];
  for (int64_t k0 = 0; k0 < in; k0 += kLoraBackBlock) {   // dx + dh A, 64 columns at a time
    const int64_t nb = std::min(kLoraBackBlock, in - k0);
    lora_colsum(dht, 1, k.a + k0, in, r, nb, col);
    for (int64_t q = 0; q < nb; ++q) y[k0 + q] = dxt[k0 + q] + col[q];
  }
}

// Units [0, nbi): dA's column blocks; then dB's row blocks.
static void lora_back_grad(void* task, size_t unit) {
  const LoraBackTask& k = *static_cast<const LoraBackTask*>(task);
  const int64_t T = k.T, in = k.in, r = k.r, nbi = (in + kLoraBackBlock - 1) / kLoraBackBlock;
  const int64_t u = static_cast<int64_t>(unit);
  if (u >= nbi) {
    const int64_t n0 = (u - nbi) * kLoraBackBlock;
    lora_db_block(k.dy, k.h, T, k.o, r, k.s, n0, std::min(kLoraBackBlock, k.o - n0), k.out + (T + r) * in);
    return;
  }
  const int64_t k0 = u * kLoraBackBlock, nb = std::min(kLoraBackBlock, in - k0);
  float* da = k.out + T * in;
  for (int64_t j = 0; j < r; ++j) lora_colsum(k.dh + j, r, k.x + k0, in, T, nb, da + j * in + k0);
}

// Units: s (dy^T h)'s nbo row blocks, spread among the T rows t of s (dy b) (below).
static void lora_rows_unit(void* task, size_t unit) {
  const LoraBackTask& k = *static_cast<const LoraBackTask*>(task);
  // the nbo dB blocks (T kLoraBackBlock r each) at units 0, stride, 2 stride, ..., between the T dh rows (o r
  // each): parallel_for hands out runs of consecutive units, and the blocks all in the first run left that thread
  // with most of the work (1.49x at 2 threads for the MLP chunks' calls, 2026-12-07)
  const int64_t nbo = (k.o + kLoraBackBlock - 1) / kLoraBackBlock, u = static_cast<int64_t>(unit);
  const int64_t stride = (nbo + k.T) / nbo;
  if (u % stride == 0 && u / stride < nbo) {
    const int64_t n0 = u / stride * kLoraBackBlock;
    lora_db_block(k.dy, k.h, k.T, k.o, k.r, k.s, n0, std::min(kLoraBackBlock, k.o - n0), k.out);
    return;
  }
  const int64_t t = u - std::min(nbo, u / stride + 1);   // the dB blocks at or before u skipped
  lora_dh_row(k.dy + t * k.o, k.bt, k.o, k.r, k.s, k.out + (k.o + t) * k.r);
}

// B [o, r] -> B^T [r, o] (serial: o r elements, a few KB).
inline const float* lora_transpose_b(const float* b, int64_t o, int64_t r) {
  thread_local std::vector<float> bt;
  bt.resize(static_cast<size_t>(o * r));
  for (int64_t n = 0; n < o; ++n)
    for (int64_t j = 0; j < r; ++j) bt[static_cast<size_t>(j * o + n)] = b[n * r + j];
  return bt.data();
}

extern "C" {
int toolchain_lora_backward(const float* dy, const float* x, const float* a, const float* b, const float* dx,
                            int64_t T, int64_t in, int64_t o, int64_t r, float s, float* out) {
  if (T < 1 || in < 1 || o < 1 || r < 1) return -1;
  thread_local std::vector<float> h, dh;
  h.resize(static_cast<size_t>(T * r));
  dh.resize(static_cast<size_t>(T * r));
  LoraBackTask task{dy, x, a, lora_transpose_b(b, o, r), dx, T, in, o, r, s, h.data(), dh.data(), out};
  parallel_for(lora_back_row, &task, T, T * r * (2 * in + o), kPoolRowWork);   // h, dh, dx + dh A: rows
  const int64_t units = (in + kLoraBackBlock - 1) / kLoraBackBlock + (o + kLoraBackBlock - 1) / kLoraBackBlock;
  parallel_for(lora_back_grad, &task, units, T * r * (in + o), kPoolRowWork);   // dA columns, dB rows
  return 0;
}

int toolchain_lora_rows_backward(const float* dy, const float* h, const float* b, int64_t T, int64_t C, int64_t r,
                                 float s, float* out) {
  if (T < 1 || C < 1 || r < 1) return -1;
  LoraBackTask task{dy, nullptr, nullptr, lora_transpose_b(b, C, r), nullptr, T, 0, C, r, s, const_cast<float*>(h),
                    nullptr, out};
  parallel_for(lora_rows_unit, &task, (C + kLoraBackBlock - 1) / kLoraBackBlock + T, 2 * T * C * r, kPoolRowWork);
  return 0;
}
}  // extern "C"

// The attention half's element-wise rest (`--compute int8` training methods; references `rope_train_reference`,
// `rope_train_backward_reference` in toolchain/mesp/ops/rope.py, `rms_norm_backward_reference` in
// toolchain/mesp/ops/rmsnorm.py), rows over the pool instead of ExecuTorch's portable mul / add / mean / cat on the
// calling thread:
//   toolchain::rope_train           out [n, T, D]: x [T, n D] split into n heads and rotated by the step's tables
//                                   cos, sin [T, D] (h = D / 2):  out[i] = x[i] cos[i] + (-(x[i + h] sin[i])),
//                                   out[i + h] = x[i + h] cos[i + h] + x[i] sin[i + h]   (i < h; rope_forward)
//   toolchain::rope_train_backward  out [T, n D]: heads start .. start + n - 1 of dy [N, T, D] rotated back:
//                                   out[i] = dy[i] cos[i] + dy[i + h] sin[i + h],
//                                   out[i + h] = dy[i + h] cos[i + h] + (-(dy[i] sin[i]))   (rope_backward)
//   toolchain::rms_norm_backward    out [T, d] = residual + dx, dx = r (g - xhat mean_k(g_k xhat_k)) for
//                                   g = ((dy + dy2) + dy3) w, r = 1 / sqrt(mean_k x_k^2 + eps), xhat = x r
//                                   (dy2, dy3, residual optional; rmsnorm_backward)
// The token (row) t is the pool's unit of work; each output element is computed the same way whichever thread runs
// it (the row's two sums: 16 lanes k mod 16 in increasing k, lane_sum's tree, then the tail in order), so the bits
// depend neither on the thread count nor on the kernel path (one generic body). Every product that meets an add is
// an explicit std::fma (which product: as written; the residual add too: residual + r (...) is one fma), the rest
// unfused products: left to -ffp-contract=fast, GCC and clang, x86 and aarch64 fused different products of
// a b + c d and of the row's sums, so the bits differed by compiler (scripts/check_kernel_arm64.sh). Within float32
// rounding of the references, not their bits.
namespace {

struct RopeTrainTask {
  const float *x, *cos, *sin;
  int64_t T, n, D, N, start;   // backward: x is dy [N, T, D], heads start .. start + n - 1
  float* out;
};

static void rope_train_token(void* task, size_t token) {
  const RopeTrainTask& k = *static_cast<const RopeTrainTask*>(task);
  const int64_t t = static_cast<int64_t>(token), T = k.T, D = k.D, h = D / 2;
  const float *c = k.cos + t * D, *s = k.sin + t * D;
  for (int64_t j = 0; j < k.n; ++j) {
    const float* x = k.x + t * k.n * D + j * D;
    float* o = k.out + (j * T + t) * D;
    for (int64_t i = 0; i < h; ++i) {
      o[i] = std::fma(x[i], c[i], -(x[i + h] * s[i]));   // explicit: see above
      o[i + h] = std::fma(x[i + h], c[i + h], x[i] * s[i + h]);
    }
  }
}

static void rope_train_backward_token(void* task, size_t token) {
  const RopeTrainTask& k = *static_cast<const RopeTrainTask*>(task);
  const int64_t t = static_cast<int64_t>(token), T = k.T, D = k.D, h = D / 2;
  const float *c = k.cos + t * D, *s = k.sin + t * D;
  for (int64_t j = 0; j < k.n; ++j) {
    const float* dy = k.x + ((k.start + j) * T + t) * D;
    float* o = k.out + t * k.n * D + j * D;
    for (int64_t i = 0; i < h; ++i) {
      o[i] = std::fma(dy[i], c[i], dy[i + h] * s[i + h]);
      o[i + h] = std::fma(dy[i + h], c[i + h], -(dy[i] * s[i]));
    }
  }
}

struct RmsNormBackTask {
  const float *x, *w, *dy, *dy2, *dy3, *residual;
  int64_t d;
  float eps;
  float* out;
};

// g[k] of row t: ((dy + dy2) + dy3) w, the absent terms skipped.
inline float rms_back_g(const RmsNormBackTask& b, int64_t i, int64_t k) {
  float g = b.dy[i];
  if (b.dy2) g = g + b.dy2[i];
  if (b.dy3) g = g + b.dy3[i];
  return g * b.w[k];
}

static void rms_norm_backward_row(void* task, size_t row) {
  const RmsNormBackTask& b = *static_cast<const RmsNormBackTask*>(task);
  const int64_t t = static_cast<int64_t>(row), d = b.d, o = t * d;
  const float* xt = b.x + o;
  float lanes[L];
  f32x16 acc = f32x16{};
  float tail = 0.0f;
  int64_t k = 0;
  for (; k + L <= d; k += L) {
    f32x16 a;
    std::memcpy(&a, xt + k, sizeof a);
    acc = acc + a * a;
  }
  for (; k < d; ++k) tail = std::fma(xt[k], xt[k], tail);
  std::memcpy(lanes, &acc, sizeof lanes);
  const float r = 1.0f / std::sqrt((lane_sum(lanes) + tail) / static_cast<float>(d) + b.eps);
  float gx[L];                                       // sum_k g_k xhat_k: lanes k mod 16, then the tail
  for (int64_t l = 0; l < L; ++l) gx[l] = 0.0f;
  tail = 0.0f;
  for (k = 0; k + L <= d; k += L)
    for (int64_t l = 0; l < L; ++l) gx[l] = std::fma(rms_back_g(b, o + k + l, k + l), xt[k + l] * r, gx[l]);
  for (; k < d; ++k) tail = std::fma(rms_back_g(b, o + k, k), xt[k] * r, tail);
  const float mean = (lane_sum(gx) + tail) / static_cast<float>(d);
  float* y = b.out + o;
  for (k = 0; k < d; ++k) {
    const float inner = std::fma(-(xt[k] * r), mean, rms_back_g(b, o + k, k));   // g - xhat mean
    y[k] = b.residual ? std::fma(r, inner, b.residual[o + k]) : r * inner;
  }
}

}  // namespace

extern "C" {
// out [n, T, D] = the heads of x [T, n D] rotated (toolchain::rope_train). Returns 0, or -1 for bad arguments
// (D odd or < 2, n or T < 1).
int toolchain_rope_train(const float* x, const float* cos, const float* sin, int64_t T, int64_t n, int64_t D,
                         float* out) {
  if (T < 1 || n < 1 || D < 2 || D % 2) return -1;
  RopeTrainTask task{x, cos, sin, T, n, D, n, 0, out};
  parallel_for(rope_train_token, &task, T, T * n * D, kPoolRowWork);
  return 0;
}

// out [T, n D] = heads start .. start + n - 1 of dy [N, T, D] rotated back (toolchain::rope_train_backward).
// Returns 0, or -1 for bad arguments (as toolchain_rope_train, or the heads not within dy's N).
int toolchain_rope_train_backward(const float* dy, const float* cos, const float* sin, int64_t N, int64_t start,
                                  int64_t T, int64_t n, int64_t D, float* out) {
  if (T < 1 || n < 1 || D < 2 || D % 2 || start < 0 || start + n > N) return -1;
  RopeTrainTask task{dy, cos, sin, T, n, D, N, start, out};
  parallel_for(rope_train_backward_token, &task, T, T * n * D, kPoolRowWork);
  return 0;
}

// out [T, d] = residual + the RMSNorm backward of x [T, d] (weight w [d]) for the gradient (dy + dy2) + dy3
// (toolchain::rms_norm_backward; dy2, dy3, residual may be null: absent). Returns 0, or -1 for bad arguments.
int toolchain_rms_norm_backward(const float* x, const float* w, const float* dy, const float* dy2, const float* dy3,
                                const float* residual, int64_t T, int64_t d, float eps, float* out) {
  if (T < 1 || d < 1) return -1;
  RmsNormBackTask task{x, w, dy, dy2, dy3, residual, d, eps, out};
  parallel_for(rms_norm_backward_row, &task, T, 4 * T * d, kPoolRowWork);
  return 0;
}
}  // extern "C"

#ifndef TOOLCHAIN_NO_EXECUTORCH
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>

namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

// toolchain::int4_linear_a8.out(Tensor x, Tensor qweight, Tensor scales, int group, *, Tensor(a!) out)
Tensor& int4_linear_a8_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& qweight, const Tensor& scales,
                           int64_t group, Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && scales.scalar_type() == ScalarType::Float &&
                  qweight.scalar_type() == ScalarType::Byte && out.scalar_type() == ScalarType::Float,
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, x.dim() >= 1 && qweight.dim() == 2 && scales.dim() == 2, InvalidArgument, out);
  const int64_t in = x.size(x.dim() - 1);
  const int64_t o = qweight.size(0);
  ET_KERNEL_CHECK(ctx, qweight.size(1) * 2 == in && scales.size(0) == o, InvalidArgument, out);
  SizesType sizes[8];
  ET_KERNEL_CHECK(ctx, x.dim() <= 8, InvalidArgument, out);
  for (int64_t d = 0; d + 1 < x.dim(); ++d) sizes[d] = x.size(d);
  sizes[x.dim() - 1] = static_cast<SizesType>(o);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(x.dim())}) == Error::Ok,
                  InvalidArgument, out);
  const int64_t T = in ? x.numel() / in : 0;
  const int rc = toolchain_int4_linear_a8(x.const_data_ptr<float>(), T, in, qweight.const_data_ptr<uint8_t>(),
                                          scales.const_data_ptr<float>(), o, scales.size(1), group,
                                          out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}


// toolchain::int4_dyw_a8_acc.out(Tensor dy, Tensor qweight, Tensor scales, int group, int row0, Tensor? acc, *,
//                                 Tensor(a!) out): out = acc + dy W[row0 : row0 + o] (o = dy's last size; acc of out's
//                                 shape [..., i]; without acc dy W[row0 : row0 + o])
Tensor& int4_dyw_a8_acc_out(KernelRuntimeContext& ctx, const Tensor& dy, const Tensor& qweight, const Tensor& scales,
                            int64_t group, int64_t row0, const std::optional<Tensor>& acc, Tensor& out) {
  ET_KERNEL_CHECK(ctx, dy.scalar_type() == ScalarType::Float && scales.scalar_type() == ScalarType::Float &&
                  qweight.scalar_type() == ScalarType::Byte && out.scalar_type() == ScalarType::Float &&
                  (!acc.has_value() || acc->scalar_type() == ScalarType::Float), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, dy.dim() >= 1 && dy.dim() <= 8 && qweight.dim() == 2 && scales.dim() == 2 &&
                  (!acc.has_value() || acc->dim() == dy.dim()), InvalidArgument, out);
  const int64_t o = dy.size(dy.dim() - 1), in = 2 * qweight.size(1);
  ET_KERNEL_CHECK(ctx, row0 >= 0 && row0 + o <= qweight.size(0) && scales.size(0) == qweight.size(0) &&
                  (!acc.has_value() || acc->size(acc->dim() - 1) == in), InvalidArgument, out);
  SizesType sizes[8];
  for (int64_t d = 0; d + 1 < dy.dim(); ++d) {
    ET_KERNEL_CHECK(ctx, !acc.has_value() || acc->size(d) == dy.size(d), InvalidArgument, out);
    sizes[d] = dy.size(d);
  }
  sizes[dy.dim() - 1] = static_cast<SizesType>(in);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(dy.dim())}) == Error::Ok,
                  InvalidArgument, out);
  int64_t T = 1;
  for (int64_t d = 0; d + 1 < dy.dim(); ++d) T *= dy.size(d);
  const int rc = toolchain_int4_dyw_a8_acc(dy.const_data_ptr<float>(), T, o, qweight.const_data_ptr<uint8_t>(),
                                           scales.const_data_ptr<float>(), in, scales.size(1), group, row0,
                                           acc.has_value() ? acc->const_data_ptr<float>() : nullptr,
                                           out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::int4_dyw_a8.out(Tensor dy, Tensor qweight, Tensor scales, int group, *, Tensor(a!) out): the acc op's
// wrapper at row0 0 without acc, W exactly dy's o rows tall (toolchain_int4_dyw_a8 is the acc entry's dx there).
Tensor& int4_dyw_a8_out(KernelRuntimeContext& ctx, const Tensor& dy, const Tensor& qweight, const Tensor& scales,
                        int64_t group, Tensor& out) {
  ET_KERNEL_CHECK(ctx, dy.dim() >= 1 && qweight.dim() == 2 && qweight.size(0) == dy.size(dy.dim() - 1),
                  InvalidArgument, out);
  return int4_dyw_a8_acc_out(ctx, dy, qweight, scales, group, 0, std::nullopt, out);
}


// toolchain::attention_decode.out(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor pos,
//                                 float scale, *, Tensor(a!) out)
Tensor& attention_decode_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos, double scale, Tensor& out) {
  const Tensor* floats[] = {&q, &k, &v, &k_cache, &v_cache, &out};
  for (const Tensor* t : floats) ET_KERNEL_CHECK(ctx, t->scalar_type() == ScalarType::Float, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, pos.scalar_type() == ScalarType::Long && pos.numel() == 1, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3,
                  InvalidArgument, out);
  const int64_t H = q.size(0), C = q.size(1), D = q.size(2), Hk = k.size(0), S = k_cache.size(1);
  ET_KERNEL_CHECK(ctx, k.size(1) == C && k.size(2) == D && v.size(0) == Hk && v.size(1) == C && v.size(2) == D &&
                  k_cache.size(0) == Hk && k_cache.size(2) == D && v_cache.size(0) == Hk && v_cache.size(1) == S &&
                  v_cache.size(2) == D, InvalidArgument, out);
  const SizesType sizes[2] = {static_cast<SizesType>(C), static_cast<SizesType>(H * D)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_attention_decode(q.const_data_ptr<float>(), k.const_data_ptr<float>(), v.const_data_ptr<float>(),
                                            k_cache.const_data_ptr<float>(), v_cache.const_data_ptr<float>(), H, Hk, C, S,
                                            D, pos.const_data_ptr<int64_t>()[0], static_cast<float>(scale),
                                            out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}


// toolchain::rms_norm.out(Tensor x, Tensor w, float eps, *, Tensor(a!) out)
Tensor& rms_norm_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& w, double eps, Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && w.scalar_type() == ScalarType::Float &&
                  out.scalar_type() == ScalarType::Float, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(x.dim() - 1), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, x.sizes()) == Error::Ok, InvalidArgument, out);
  const int64_t d = w.size(0);
  const int rc = toolchain_rms_norm(x.const_data_ptr<float>(), x.numel() / d, d, w.const_data_ptr<float>(),
                                    static_cast<float>(eps), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

const float* optional_floats(const std::optional<Tensor>& t) {
  return t.has_value() ? t->const_data_ptr<float>() : nullptr;
}

bool optional_float_shape(const std::optional<Tensor>& t, int64_t d0, int64_t d1) {
  if (!t.has_value()) return true;
  if (t->scalar_type() != ScalarType::Float) return false;
  if (d1 < 0) return t->dim() == 1 && t->size(0) == d0;
  return t->dim() == 2 && t->size(0) == d0 && t->size(1) == d1;
}

// toolchain::lora_linear_a8.out(Tensor x, Tensor qweight, Tensor scales, int group, Tensor? bias,
//     Tensor? lora_a, Tensor? lora_b, float lora_scale, Tensor? residual, *, Tensor(a!) out)
Tensor& lora_linear_a8_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& qweight, const Tensor& scales,
                           int64_t group, const std::optional<Tensor>& bias, const std::optional<Tensor>& lora_a,
                           const std::optional<Tensor>& lora_b, double lora_scale,
                           const std::optional<Tensor>& residual, Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && scales.scalar_type() == ScalarType::Float &&
                  qweight.scalar_type() == ScalarType::Byte && out.scalar_type() == ScalarType::Float,
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, x.dim() == 2 && qweight.dim() == 2 && scales.dim() == 2, InvalidArgument, out);
  const int64_t T = x.size(0), in = x.size(1), o = qweight.size(0);
  const int64_t r = lora_a.has_value() ? lora_a->size(0) : 0;
  ET_KERNEL_CHECK(ctx, qweight.size(1) * 2 == in && scales.size(0) == o && lora_a.has_value() == lora_b.has_value(),
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, optional_float_shape(bias, o, -1) && optional_float_shape(lora_a, r, in) &&
                  optional_float_shape(lora_b, o, r) && optional_float_shape(residual, T, o), InvalidArgument, out);
  const SizesType sizes[2] = {static_cast<SizesType>(T), static_cast<SizesType>(o)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_lora_linear_a8(x.const_data_ptr<float>(), T, in, qweight.const_data_ptr<uint8_t>(),
                                          scales.const_data_ptr<float>(), o, scales.size(1), group,
                                          optional_floats(bias), optional_floats(lora_a), optional_floats(lora_b), r,
                                          static_cast<float>(lora_scale), optional_floats(residual),
                                          out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::lora_linear_a8_rows.out(Tensor x, Tensor qweight, Tensor scales, int group, int row0, int rows,
//     Tensor? lora_a, Tensor? lora_b, float lora_scale, *, Tensor(a!) out): [T, rows]
Tensor& lora_linear_a8_rows_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& qweight, const Tensor& scales,
                                int64_t group, int64_t row0, int64_t rows, const std::optional<Tensor>& lora_a,
                                const std::optional<Tensor>& lora_b, double lora_scale, Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && scales.scalar_type() == ScalarType::Float &&
                  qweight.scalar_type() == ScalarType::Byte && out.scalar_type() == ScalarType::Float,
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, x.dim() == 2 && qweight.dim() == 2 && scales.dim() == 2, InvalidArgument, out);
  const int64_t T = x.size(0), in = x.size(1), o = qweight.size(0);
  const int64_t r = lora_a.has_value() ? lora_a->size(0) : 0;
  ET_KERNEL_CHECK(ctx, qweight.size(1) * 2 == in && scales.size(0) == o && lora_a.has_value() == lora_b.has_value() &&
                  row0 >= 0 && rows >= 0 && row0 + rows <= o, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, optional_float_shape(lora_a, r, in) && optional_float_shape(lora_b, o, r), InvalidArgument, out);
  const SizesType sizes[2] = {static_cast<SizesType>(T), static_cast<SizesType>(rows)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_lora_linear_a8_rows(x.const_data_ptr<float>(), T, in, qweight.const_data_ptr<uint8_t>(),
                                               scales.const_data_ptr<float>(), o, scales.size(1), group, row0, rows,
                                               optional_floats(lora_a), optional_floats(lora_b), r,
                                               static_cast<float>(lora_scale), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::rope_heads.out(Tensor x, Tensor pos, int heads, float theta, *, Tensor(a!) out)
Tensor& rope_heads_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& pos, int64_t heads, double theta,
                       Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float &&
                  pos.scalar_type() == ScalarType::Long && pos.numel() == 1, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, x.dim() == 2 && heads > 0 && x.size(1) % heads == 0, InvalidArgument, out);
  const int64_t C = x.size(0), D = x.size(1) / heads;
  const SizesType sizes[3] = {static_cast<SizesType>(heads), static_cast<SizesType>(C), static_cast<SizesType>(D)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 3}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_rope_heads(x.const_data_ptr<float>(), C, heads, D, pos.const_data_ptr<int64_t>()[0],
                                      static_cast<float>(theta), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::swiglu.out(Tensor g, Tensor u, *, Tensor(a!) out)
Tensor& swiglu_out(KernelRuntimeContext& ctx, const Tensor& g, const Tensor& u, Tensor& out) {
  ET_KERNEL_CHECK(ctx, g.scalar_type() == ScalarType::Float && u.scalar_type() == ScalarType::Float &&
                  out.scalar_type() == ScalarType::Float && g.numel() == u.numel() && g.dim() == u.dim(),
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, g.sizes()) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_swiglu(g.const_data_ptr<float>(), u.const_data_ptr<float>(), g.numel(),
                                  out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// q [H, T, D], k and v [Hk, T, D] float (T = q's, H a multiple of Hk): the shapes toolchain::attention_train* take.
bool attention_train_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.scalar_type() == ScalarType::Float && k.scalar_type() == ScalarType::Float &&
         v.scalar_type() == ScalarType::Float && q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) > 0 &&
         q.size(0) % k.size(0) == 0 && k.size(1) == q.size(1) && k.size(2) == q.size(2) &&
         v.size(0) == k.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2);
}

// toolchain::attention_train.out(Tensor q, Tensor k, Tensor v, float scale, *, Tensor(a!) out)
Tensor& attention_train_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                            double scale, Tensor& out) {
  ET_KERNEL_CHECK(ctx, attention_train_shapes(q, k, v) && out.scalar_type() == ScalarType::Float, InvalidArgument,
                  out);
  const int64_t H = q.size(0), T = q.size(1), D = q.size(2), Hk = k.size(0);
  const SizesType sizes[2] = {static_cast<SizesType>(T), static_cast<SizesType>(H * D)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_attention_train(q.const_data_ptr<float>(), k.const_data_ptr<float>(),
                                           v.const_data_ptr<float>(), H, Hk, T, D, static_cast<float>(scale),
                                           out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::attention_train_backward.out(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, float scale, *,
//                                         Tensor(a!) out)
Tensor& attention_train_backward_out(KernelRuntimeContext& ctx, const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& o, double scale, Tensor& out) {
  ET_KERNEL_CHECK(ctx, attention_train_shapes(q, k, v) && out.scalar_type() == ScalarType::Float, InvalidArgument,
                  out);
  const int64_t H = q.size(0), T = q.size(1), D = q.size(2), Hk = k.size(0);
  ET_KERNEL_CHECK(ctx, dout.scalar_type() == ScalarType::Float && o.scalar_type() == ScalarType::Float &&
                  dout.dim() == 2 && o.dim() == 2 && dout.size(0) == T && dout.size(1) == H * D && o.size(0) == T &&
                  o.size(1) == H * D, InvalidArgument, out);
  const SizesType sizes[3] = {static_cast<SizesType>(H + 2 * Hk), static_cast<SizesType>(T),
                              static_cast<SizesType>(D)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 3}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_attention_train_backward(dout.const_data_ptr<float>(), q.const_data_ptr<float>(),
                                                    k.const_data_ptr<float>(), v.const_data_ptr<float>(),
                                                    o.const_data_ptr<float>(), H, Hk, T, D,
                                                    static_cast<float>(scale), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::swiglu_train.out(Tensor g, Tensor u, Tensor da, *, Tensor(a!) out)
Tensor& swiglu_train_out(KernelRuntimeContext& ctx, const Tensor& g, const Tensor& u, const Tensor& da, Tensor& out) {
  ET_KERNEL_CHECK(ctx, g.scalar_type() == ScalarType::Float && u.scalar_type() == ScalarType::Float &&
                  da.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float &&
                  g.numel() == u.numel() && g.numel() == da.numel() && g.dim() == u.dim() && g.dim() == da.dim() &&
                  g.dim() < 8, InvalidArgument, out);
  SizesType sizes[8];
  sizes[0] = 3;
  for (int64_t d = 0; d < g.dim(); ++d) sizes[d + 1] = g.size(d);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(g.dim() + 1)}) == Error::Ok,
                  InvalidArgument, out);
  const int rc = toolchain_swiglu_train(g.const_data_ptr<float>(), u.const_data_ptr<float>(),
                                        da.const_data_ptr<float>(), g.numel(), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// z [C, V], m (and s) [C, 1] float: toolchain::online_softmax_stats / exp_sub_rows's operands.
bool softmax_rows_shapes(const Tensor& z, const Tensor& m) {
  return z.scalar_type() == ScalarType::Float && m.scalar_type() == ScalarType::Float && z.dim() == 2 &&
         m.dim() == 2 && m.size(0) == z.size(0) && m.size(1) == 1 && z.size(1) > 0;
}

// toolchain::online_softmax_stats.out(Tensor z, Tensor m, Tensor s, *, Tensor(a!) out)
Tensor& online_softmax_stats_out(KernelRuntimeContext& ctx, const Tensor& z, const Tensor& m, const Tensor& s,
                                 Tensor& out) {
  ET_KERNEL_CHECK(ctx, softmax_rows_shapes(z, m) && softmax_rows_shapes(z, s) && out.scalar_type() == ScalarType::Float,
                  InvalidArgument, out);
  const SizesType sizes[2] = {static_cast<SizesType>(z.size(0)), 3};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_online_softmax_stats(z.const_data_ptr<float>(), m.const_data_ptr<float>(),
                                                s.const_data_ptr<float>(), z.size(0), z.size(1),
                                                out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::exp_sub_rows.out(Tensor z, Tensor m, *, Tensor(a!) out)
Tensor& exp_sub_rows_out(KernelRuntimeContext& ctx, const Tensor& z, const Tensor& m, Tensor& out) {
  ET_KERNEL_CHECK(ctx, softmax_rows_shapes(z, m) && out.scalar_type() == ScalarType::Float, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, z.sizes()) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_exp_sub_rows(z.const_data_ptr<float>(), m.const_data_ptr<float>(), z.size(0), z.size(1),
                                        out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::lora_backward.out(Tensor dy, Tensor x, Tensor a, Tensor b, float scale, Tensor dx, *, Tensor(a!) out)
Tensor& lora_backward_out(KernelRuntimeContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& a,
                          const Tensor& b, double scale, const Tensor& dx, Tensor& out) {
  ET_KERNEL_CHECK(ctx, dy.scalar_type() == ScalarType::Float && x.scalar_type() == ScalarType::Float &&
                  a.scalar_type() == ScalarType::Float && b.scalar_type() == ScalarType::Float &&
                  dx.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float && dy.dim() == 2 &&
                  x.dim() == 2 && a.dim() == 2 && b.dim() == 2 && dx.dim() == 2 && x.size(0) == dy.size(0) &&
                  a.size(1) == x.size(1) && b.size(0) == dy.size(1) && b.size(1) == a.size(0) &&
                  dx.size(0) == x.size(0) && dx.size(1) == x.size(1), InvalidArgument, out);
  const int64_t T = x.size(0), in = x.size(1), o = dy.size(1), r = a.size(0);
  const SizesType sizes[1] = {static_cast<SizesType>((T + r) * in + o * r)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 1}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_lora_backward(dy.const_data_ptr<float>(), x.const_data_ptr<float>(),
                                         a.const_data_ptr<float>(), b.const_data_ptr<float>(),
                                         dx.const_data_ptr<float>(), T, in, o, r, static_cast<float>(scale),
                                         out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::lora_rows_backward.out(Tensor dy, Tensor h, Tensor b, float scale, *, Tensor(a!) out)
Tensor& lora_rows_backward_out(KernelRuntimeContext& ctx, const Tensor& dy, const Tensor& h, const Tensor& b,
                               double scale, Tensor& out) {
  ET_KERNEL_CHECK(ctx, dy.scalar_type() == ScalarType::Float && h.scalar_type() == ScalarType::Float &&
                  b.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float && dy.dim() == 2 &&
                  h.dim() == 2 && b.dim() == 2 && h.size(0) == dy.size(0) && b.size(0) == dy.size(1) &&
                  b.size(1) == h.size(1), InvalidArgument, out);
  const int64_t T = dy.size(0), C = dy.size(1), r = h.size(1);
  const SizesType sizes[2] = {static_cast<SizesType>(C + T), static_cast<SizesType>(r)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_lora_rows_backward(dy.const_data_ptr<float>(), h.const_data_ptr<float>(),
                                              b.const_data_ptr<float>(), T, C, r, static_cast<float>(scale),
                                              out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}


// x [T, n D] (n = heads), cos and sin [T, D] float: toolchain::rope_train's operands.
bool rope_tables_shape(const Tensor& cos, const Tensor& sin, int64_t T, int64_t D) {
  return cos.scalar_type() == ScalarType::Float && sin.scalar_type() == ScalarType::Float && cos.dim() == 2 &&
         sin.dim() == 2 && cos.size(0) == T && cos.size(1) == D && sin.size(0) == T && sin.size(1) == D;
}

// toolchain::rope_train.out(Tensor x, Tensor cos, Tensor sin, int heads, *, Tensor(a!) out)
Tensor& rope_train_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin,
                       int64_t heads, Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float &&
                  x.dim() == 2 && heads > 0 && x.size(1) % heads == 0, InvalidArgument, out);
  const int64_t T = x.size(0), D = x.size(1) / heads;
  ET_KERNEL_CHECK(ctx, rope_tables_shape(cos, sin, T, D), InvalidArgument, out);
  const SizesType sizes[3] = {static_cast<SizesType>(heads), static_cast<SizesType>(T), static_cast<SizesType>(D)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 3}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_rope_train(x.const_data_ptr<float>(), cos.const_data_ptr<float>(),
                                      sin.const_data_ptr<float>(), T, heads, D, out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::rope_train_backward.out(Tensor dy, Tensor cos, Tensor sin, int start, int heads, *, Tensor(a!) out)
Tensor& rope_train_backward_out(KernelRuntimeContext& ctx, const Tensor& dy, const Tensor& cos, const Tensor& sin,
                                int64_t start, int64_t heads, Tensor& out) {
  ET_KERNEL_CHECK(ctx, dy.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float &&
                  dy.dim() == 3 && heads > 0 && start >= 0 && start + heads <= dy.size(0), InvalidArgument, out);
  const int64_t T = dy.size(1), D = dy.size(2);
  ET_KERNEL_CHECK(ctx, rope_tables_shape(cos, sin, T, D), InvalidArgument, out);
  const SizesType sizes[2] = {static_cast<SizesType>(T), static_cast<SizesType>(heads * D)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, 2}) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_rope_train_backward(dy.const_data_ptr<float>(), cos.const_data_ptr<float>(),
                                               sin.const_data_ptr<float>(), dy.size(0), start, T, heads, D,
                                               out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

// toolchain::rms_norm_backward.out(Tensor x, Tensor w, float eps, Tensor dy, Tensor? dy2, Tensor? dy3,
//                                  Tensor? residual, *, Tensor(a!) out)
Tensor& rms_norm_backward_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& w, double eps,
                              const Tensor& dy, const std::optional<Tensor>& dy2, const std::optional<Tensor>& dy3,
                              const std::optional<Tensor>& residual, Tensor& out) {
  ET_KERNEL_CHECK(ctx, x.scalar_type() == ScalarType::Float && w.scalar_type() == ScalarType::Float &&
                  dy.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float &&
                  x.dim() == 2 && dy.dim() == 2 && w.dim() == 1 && w.size(0) == x.size(1) &&
                  dy.size(0) == x.size(0) && dy.size(1) == x.size(1), InvalidArgument, out);
  const int64_t T = x.size(0), d = x.size(1);
  ET_KERNEL_CHECK(ctx, optional_float_shape(dy2, T, d) && optional_float_shape(dy3, T, d) &&
                  optional_float_shape(residual, T, d), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, x.sizes()) == Error::Ok, InvalidArgument, out);
  const int rc = toolchain_rms_norm_backward(x.const_data_ptr<float>(), w.const_data_ptr<float>(),
                                             dy.const_data_ptr<float>(), optional_floats(dy2), optional_floats(dy3),
                                             optional_floats(residual), T, d, static_cast<float>(eps),
                                             out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

}  // namespace

EXECUTORCH_LIBRARY(toolchain, "int4_linear_a8.out", int4_linear_a8_out);
EXECUTORCH_LIBRARY(toolchain, "attention_decode.out", attention_decode_out);
EXECUTORCH_LIBRARY(toolchain, "rms_norm.out", rms_norm_out);
EXECUTORCH_LIBRARY(toolchain, "lora_linear_a8.out", lora_linear_a8_out);
EXECUTORCH_LIBRARY(toolchain, "lora_linear_a8_rows.out", lora_linear_a8_rows_out);
EXECUTORCH_LIBRARY(toolchain, "rope_heads.out", rope_heads_out);
EXECUTORCH_LIBRARY(toolchain, "swiglu.out", swiglu_out);
EXECUTORCH_LIBRARY(toolchain, "int4_dyw_a8.out", int4_dyw_a8_out);
EXECUTORCH_LIBRARY(toolchain, "int4_dyw_a8_acc.out", int4_dyw_a8_acc_out);
EXECUTORCH_LIBRARY(toolchain, "attention_train.out", attention_train_out);
EXECUTORCH_LIBRARY(toolchain, "attention_train_backward.out", attention_train_backward_out);
EXECUTORCH_LIBRARY(toolchain, "swiglu_train.out", swiglu_train_out);
EXECUTORCH_LIBRARY(toolchain, "online_softmax_stats.out", online_softmax_stats_out);
EXECUTORCH_LIBRARY(toolchain, "exp_sub_rows.out", exp_sub_rows_out);
EXECUTORCH_LIBRARY(toolchain, "lora_backward.out", lora_backward_out);
EXECUTORCH_LIBRARY(toolchain, "lora_rows_backward.out", lora_rows_backward_out);
EXECUTORCH_LIBRARY(toolchain, "rope_train.out", rope_train_out);
EXECUTORCH_LIBRARY(toolchain, "rope_train_backward.out", rope_train_backward_out);
EXECUTORCH_LIBRARY(toolchain, "rms_norm_backward.out", rms_norm_backward_out);
#endif
