// The arm64 paths of toolchain::int4_linear_a8 (kernels.cpp includes this file at file scope under
// `#if defined(__aarch64__)`, after its KernelPath enum): one library built at the apps' baseline (armv8-a) holds
// all three, each chosen at run time (kernels.cpp's KernelPathState, from missing() below):
//   neon     baseline AArch64 Advanced SIMD: int8 x nibble products by widening multiplies (smull / smlal2 into
//            16-bit lanes, 4 products per lane, then sadalp into 32-bit lanes)
//   dotprod  FEAT_DotProd (sdot, vdotq_s32: 16 products per instruction); every phone core since Cortex-A55 /
//            A76 and Apple A12
//   i8mm     FEAT_I8MM (smmla, vmmlaq_s32: a 2x8 by 8x2 int8 product, 32 products per instruction) for the
//            prefill tiles of 2 rows of x by 2 weight rows (T >= 2); decode (T = 1) and an odd last row of x
//            take the dotprod rows (ARMv8.6 cores: Snapdragon 8 Gen 1+, Apple A15+ / M2+)
// Each function of a path is compiled for its extension with a target attribute (TOOLCHAIN_ARM64_TARGET), so the
// rest of the library stays armv8-a and a CPU without the extension never executes its instructions.
//
// The same bits as the generic path (kernels.cpp's top comment): the nibbles are used unsigned (0..15, valid
// signed int8 for sdot / smmla too) with the generic path's correction (- 8 sum_k a[t, k] per row and group,
// QuantizedX::corr), so every per-group integer sum is the same exact int32; group g's float term
// float(isum) * (sw[r, g] * sa[t, g]) goes into lane g mod 16 by a fused multiply-add in increasing g (16 lanes =
// 4 registers of 4 per output; for i8mm 16 registers whose 4 lanes are the 4 outputs of a 2 x 2 tile), and the
// lanes are summed in lane_sum's tree.
// Unsigned nibbles rather than n - 8: splitting a byte into two unsigned nibbles is 2 instructions (ushr, and)
// per 16 bytes against 4 for signed ones (eor / shl / 2 sshr, or 2 subs more), in the loop that streams the
// weights, while the correction is one subtraction per 4 groups (the corr vector that QuantizedX holds anyway).
//
// Groups whose byte count (group / 2) is a multiple of 16 (groups of 32, 64, 96, 128, ... columns) take these
// paths; others the generic one. A row's partial last 16 bytes are read through a zero-padded copy (no read past
// the weights); x is zero-padded by QuantizedX, so the bytes past a partial last group add nothing.
//
// Layout: the common part (CPU checks, x quantization, loads), then the neon and dotprod rows, one code stamped
// out twice by this file including itself with TOOLCHAIN_ARM64_BODY set (the part after `#else` at the end),
// then the i8mm tiles and int4_rows, the dispatch kernels.cpp calls.

#ifndef TOOLCHAIN_ARM64_BODY
#ifndef TOOLCHAIN_KERNELS_ARM64_H_
#define TOOLCHAIN_KERNELS_ARM64_H_

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__linux__) || defined(__ANDROID__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

// __attribute__((target(...))) in each compiler's spelling: clang ("dotprod", "i8mm") and GCC. GCC 12's
// arm_neon.h declares vdotq_s32 / vmmlaq_s32 under target "arch=armv8.2-a+dotprod" / "arch=armv8.2-a+i8mm", and
// an intrinsic inlines only into a function whose target includes its own, so the GCC spelling names
// armv8.2-a (every core with FEAT_DotProd implements ARMv8.2 or later).
#if defined(__clang__)
#define TOOLCHAIN_ARM64_TARGET(gcc, clang) __attribute__((target(clang)))
#else
#define TOOLCHAIN_ARM64_TARGET(gcc, clang) __attribute__((target(gcc)))
#endif
#define TOOLCHAIN_ARM64_DOTPROD TOOLCHAIN_ARM64_TARGET("arch=armv8.2-a+dotprod", "dotprod")
#define TOOLCHAIN_ARM64_I8MM TOOLCHAIN_ARM64_TARGET("arch=armv8.2-a+dotprod+i8mm", "dotprod,i8mm")

// clang before 16 (Apple clang before 15, Xcode 15) declares vdotq_s32 / vmmlaq_s32 only when the whole file is
// compiled for the extension (arm_neon.h's #if __ARM_FEATURE_DOTPROD; checked: clang 14 and 15 fail, 16 and 19
// build): there, the library has the neon path only (dotprod / i8mm report unavailable, so forcing them is refused).
#if defined(__clang__) && ((defined(__apple_build_version__) && __clang_major__ < 15) || \
                           (!defined(__apple_build_version__) && __clang_major__ < 16))
#define TOOLCHAIN_ARM64_EXTENSIONS 0
#else
#define TOOLCHAIN_ARM64_EXTENSIONS 1
#endif

namespace {
namespace arm64 {

// Whether the CPU has FEAT_DotProd / FEAT_I8MM: Linux / Android from the kernel's hardware capabilities, Apple
// from sysctl (hw.optional.arm.FEAT_*; absent on older systems: no); elsewhere baseline NEON only.
inline bool apple_feature(const char* name) {
#if defined(__APPLE__)
  int value = 0;
  size_t size = sizeof value;
  return sysctlbyname(name, &value, &size, nullptr, 0) == 0 && value != 0;
#else
  (void)name;
  return false;
#endif
}

inline bool has_dotprod() {
#if defined(__linux__) || defined(__ANDROID__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return apple_feature("hw.optional.arm.FEAT_DotProd");
#endif
}

inline bool has_i8mm() {
#if defined(__linux__) || defined(__ANDROID__)
  return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#else
  return apple_feature("hw.optional.arm.FEAT_I8MM");
#endif
}

// nullptr when this CPU and build run path p, else what is missing (for the refusal's message).
inline const char* missing(KernelPath p) {
  constexpr const char* no_intrinsics = "a compiler with the dotprod / i8mm intrinsics (clang 16+, GCC 12+)";
  switch (p) {
    case KernelPath::neon: return nullptr;                         // Advanced SIMD: part of every AArch64 ABI
    case KernelPath::dotprod:
      if (!TOOLCHAIN_ARM64_EXTENSIONS) return no_intrinsics;
      return has_dotprod() ? nullptr : "FEAT_DotProd (sdot)";
    case KernelPath::i8mm:                                         // its decode and odd rows are dotprod's
      if (!TOOLCHAIN_ARM64_EXTENSIONS) return no_intrinsics;
      return !has_dotprod() ? "FEAT_DotProd (sdot)" : has_i8mm() ? nullptr : "FEAT_I8MM (smmla)";
    default: return "an x86-64 CPU";
  }
}

// QuantizedX's arrays (kernels.cpp): int8 even / odd columns per row of x (stride bytes, zero-padded), the
// activation scale and the correction 8 sum_k a per row and group (gstride entries, zero-padded to 16).
struct XView {
  const int8_t* even;
  const int8_t* odd;
  const float* sa;
  const int32_t* corr;
  int64_t stride, gstride;
};

// One group of columns k0 .. k1 - 1 of a row of x (k1 - k0 a multiple of 8), quantized as QuantizedX::build's
// scalar loop does: the same max (NaN flagged apart), the same IEEE division, round to nearest even (frintn),
// NaN to 0, the same clamp; the even / odd bytes to even[0..] / odd[0..] (the group's first byte), its scale to
// *sa and 8 times the sum of its values to *corr. Returns false (nothing written) for other widths.
inline bool quantize_group(const float* xt, int64_t k0, int64_t k1, int8_t* even, int8_t* odd, float* sa,
                           int32_t* corr) {
  if ((k1 - k0) % 8 != 0) return false;
  float32x4_t amax = vdupq_n_f32(0.0f);
  uint32x4_t ordered = vdupq_n_u32(~0u);
  for (int64_t k = k0; k < k1; k += 4) {
    const float32x4_t v = vabsq_f32(vld1q_f32(xt + k));
    ordered = vandq_u32(ordered, vceqq_f32(v, v));
    amax = vmaxq_f32(amax, v);
  }
  const float s = vminvq_u32(ordered) == 0 ? NAN : vmaxvq_f32(amax) / 127.0f;
  int32x4_t sum = vdupq_n_s32(0);
  const float32x4_t lim = vdupq_n_f32(127.0f), nlim = vdupq_n_f32(-127.0f), sv = vdupq_n_f32(s);
  for (int64_t k = k0; k < k1; k += 8) {
    const float32x4x2_t v = vld2q_f32(xt + k);                   // val[0]: columns k, k + 2, ...; val[1]: k + 1, ...
    int32x4_t a[2];
    for (int h = 0; h < 2; ++h) {
      if (s > 0.0f) {
        const float32x4_t q = vdivq_f32(v.val[h], sv);
        const float32x4_t r = vminq_f32(lim, vmaxq_f32(nlim, vrndnq_f32(q)));
        a[h] = vandq_s32(vcvtq_s32_f32(r), vreinterpretq_s32_u32(vceqq_f32(q, q)));   // NaN -> 0
      } else {
        a[h] = vdupq_n_s32(0);
      }
      sum = vaddq_s32(sum, a[h]);
    }
    const int8x8_t e = vmovn_s16(vcombine_s16(vmovn_s32(a[0]), vmovn_s32(a[0])));
    const int8x8_t o = vmovn_s16(vcombine_s16(vmovn_s32(a[1]), vmovn_s32(a[1])));
    vst1_lane_s32(reinterpret_cast<int32_t*>(even + (k - k0) / 2), vreinterpret_s32_s8(e), 0);
    vst1_lane_s32(reinterpret_cast<int32_t*>(odd + (k - k0) / 2), vreinterpret_s32_s8(o), 0);
  }
  *sa = s;
  *corr = 8 * vaddvq_s32(sum);
  return true;
}

// toolchain_int4_dyw_a8's rounding of one block of G consecutive n (G a multiple of 16) of a row: u = dy * s
// (float32 products, dy and s from the block's first n), quantized as quantize_group does, stored in kernels.cpp's
// halves layout (the first G / 2 values to even[0..], the others to odd[0..]); its scale to *sa and 8 times the
// sum of its values to *corr.
inline void fold_block(const float* __restrict dy, const float* __restrict s, int64_t G, int8_t* even, int8_t* odd,
                       float* sa, int32_t* corr) {
  float u[256];   // G <= 256 (kernels.cpp's arm64_fold_row)
  float32x4_t amax = vdupq_n_f32(0.0f);
  uint32x4_t ordered = vdupq_n_u32(~0u);
  for (int64_t m = 0; m < G; m += 4) {
    const float32x4_t v = vmulq_f32(vld1q_f32(dy + m), vld1q_f32(s + m));
    vst1q_f32(u + m, v);
    const float32x4_t av = vabsq_f32(v);
    ordered = vandq_u32(ordered, vceqq_f32(av, av));
    amax = vmaxq_f32(amax, av);
  }
  const float mx = vmaxvq_f32(amax);
  const float sc = vminvq_u32(ordered) == 0 || mx == INFINITY ? NAN : mx / 127.0f;   // an infinity too (kernels.cpp)
  int32x4_t sum = vdupq_n_s32(0);
  if (sc > 0.0f) {
    const float32x4_t lim = vdupq_n_f32(127.0f), nlim = vdupq_n_f32(-127.0f), sv = vdupq_n_f32(sc);
    for (int64_t m = 0; m < G; m += 8) {
      int32x4_t a[2];
      for (int h = 0; h < 2; ++h) {
        const float32x4_t q = vdivq_f32(vld1q_f32(u + m + 4 * h), sv);
        const float32x4_t r = vminq_f32(lim, vmaxq_f32(nlim, vrndnq_f32(q)));
        a[h] = vandq_s32(vcvtq_s32_f32(r), vreinterpretq_s32_u32(vceqq_f32(q, q)));   // NaN -> 0
        sum = vaddq_s32(sum, a[h]);
      }
      const int8x8_t bytes = vmovn_s16(vcombine_s16(vmovn_s32(a[0]), vmovn_s32(a[1])));
      vst1_s8(m < G / 2 ? even + m : odd + (m - G / 2), bytes);
    }
  } else {
    std::memset(even, 0, static_cast<size_t>(G / 2));
    std::memset(odd, 0, static_cast<size_t>(G / 2));
  }
  *sa = sc;
  *corr = 8 * vaddvq_s32(sum);
}

// lane_sum's tree on 16 lanes held as a0 (lanes 0..3), a1 (4..7), a2 (8..11), a3 (12..15): (l, l + 8), then
// (l, l + 4), then (0 + 2) + (1 + 3).
inline float lane_sum4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
  const float32x4_t s4 = vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
  const float32x2_t t = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));   // [s0 + s2, s1 + s3]
  return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

// The last n < 16 bytes of a weight row, zero-padded (no read past the row); out of line (once per row at most).
__attribute__((noinline)) inline uint8x16_t load_tail(const uint8_t* p, int64_t n) {
  alignas(16) uint8_t b[16] = {};
  std::memcpy(b, p, static_cast<size_t>(n));
  return vld1q_u8(b);
}

// 4 scales p[0..3], or the n < 4 left in the row and zeros (no read past the row).
inline float32x4_t load_scales(const float* p, int64_t n) {
  if (n >= 4) return vld1q_f32(p);
  float32x4_t v = vld1q_lane_f32(p, vdupq_n_f32(0.0f), 0);
  if (n > 1) v = vld1q_lane_f32(p + 1, v, 1);
  if (n > 2) v = vld1q_lane_f32(p + 2, v, 2);
  return v;
}

}  // namespace arm64
}  // namespace

// The rows of the neon and dotprod paths: the same code, once per path (this file includes itself with
// TOOLCHAIN_ARM64_BODY set: the part after #else below), each copy's functions compiled for its path's target.
// TOOLCHAIN_ARM64_DECODE_NR: weight rows per pass for one row of x (decode), chosen by the instructions executed
// per call (scripts/arm64_kernel_instructions.sh): 2 for neon (its widening products need more registers), 3 for
// dotprod.
#define TOOLCHAIN_ARM64_BODY 1
#define TOOLCHAIN_ARM64_NS neon
#define TOOLCHAIN_ARM64_FN
#define TOOLCHAIN_ARM64_SDOT 0
#define TOOLCHAIN_ARM64_DECODE_NR 2
#include "kernels_arm64.h"
#undef TOOLCHAIN_ARM64_NS
#undef TOOLCHAIN_ARM64_FN
#undef TOOLCHAIN_ARM64_SDOT
#undef TOOLCHAIN_ARM64_DECODE_NR
#if TOOLCHAIN_ARM64_EXTENSIONS
#define TOOLCHAIN_ARM64_NS dotprod
#define TOOLCHAIN_ARM64_FN TOOLCHAIN_ARM64_DOTPROD
#define TOOLCHAIN_ARM64_SDOT 1
#define TOOLCHAIN_ARM64_DECODE_NR 3
#include "kernels_arm64.h"
#undef TOOLCHAIN_ARM64_NS
#undef TOOLCHAIN_ARM64_FN
#undef TOOLCHAIN_ARM64_SDOT
#undef TOOLCHAIN_ARM64_DECODE_NR
#endif
#undef TOOLCHAIN_ARM64_BODY

#if TOOLCHAIN_ARM64_EXTENSIONS
namespace {
namespace arm64 {
namespace i8mm {

// The 2 x 2 integer sums of one group for x pair (xe, xo: the pair layout) and weight rows qr, qr1: the n bytes at
// j0. GB > 0: n == GB (unrolled, read in place); GB = 0: any n (a partial last 16 bytes through load_tail).
template <int GB>
TOOLCHAIN_ARM64_I8MM inline int32x4_t pair_group_sum(const uint8_t* qr, const uint8_t* qr1, int64_t j0, int64_t n,
                                                     const int8_t* xe, const int8_t* xo) {
  const uint8x16_t nib = vdupq_n_u8(0x0F);
  int32x4_t s = vdupq_n_s32(0);
  const int64_t len = GB > 0 ? GB : n;
#pragma GCC unroll 4
  for (int64_t j = 0; j < len; j += 16) {
    uint64x2_t w0, w1;
    if (GB > 0 || n - j >= 16) {
      w0 = vreinterpretq_u64_u8(vld1q_u8(qr + j0 + j));
      w1 = vreinterpretq_u64_u8(vld1q_u8(qr1 + j0 + j));
    } else {
      w0 = vreinterpretq_u64_u8(load_tail(qr + j0 + j, n - j));
      w1 = vreinterpretq_u64_u8(load_tail(qr1 + j0 + j, n - j));
    }
    const uint8x16_t z0 = vreinterpretq_u8_u64(vzip1q_u64(w0, w1));   // bytes 0..7 of row r, then of row r1
    const uint8x16_t z1 = vreinterpretq_u8_u64(vzip2q_u64(w0, w1));   // bytes 8..15
    const int8_t* e = xe + 2 * (j0 + j);
    const int8_t* d = xo + 2 * (j0 + j);
    s = vmmlaq_s32(s, vld1q_s8(e), vreinterpretq_s8_u8(vshrq_n_u8(z0, 4)));
    s = vmmlaq_s32(s, vld1q_s8(e + 16), vreinterpretq_s8_u8(vshrq_n_u8(z1, 4)));
    s = vmmlaq_s32(s, vld1q_s8(d), vreinterpretq_s8_u8(vandq_u8(z0, nib)));
    s = vmmlaq_s32(s, vld1q_s8(d + 16), vreinterpretq_s8_u8(vandq_u8(z1, nib)));
  }
  return s;
}

// Group g's float term for the 2 x 2 outputs into acc: float(isum - corr) * ([sw_r, sw_r1, sw_r, sw_r1] * sa).
TOOLCHAIN_ARM64_I8MM inline float32x4_t pair_fma(float32x4_t acc, int32x4_t s, const int32_t* pcorr, const float* psa,
                                                 const float* sr, const float* sr1, int64_t g) {
  const int32x4_t isum = vsubq_s32(s, vld1q_s32(pcorr + 4 * g));
  const float32x2_t sw2 = vset_lane_f32(sr1[g], vdup_n_f32(sr[g]), 1);        // [sw_r, sw_r1]
  const float32x4_t c = vmulq_f32(vcombine_f32(sw2, sw2), vld1q_f32(psa + 4 * g));
  return vfmaq_f32(acc, vcvtq_f32_s32(isum), c);
}

// Groups g0 .. ng - 1 that rows_pairs' main loop leaves (any width, or the partial last group) into acc[g mod 16]
// (in memory): out of line, once per tile at most.
TOOLCHAIN_ARM64_I8MM __attribute__((noinline)) void pair_tail(const uint8_t* qr, const uint8_t* qr1, const int8_t* xe,
                                                             const int8_t* xo, const int32_t* pcorr, const float* psa,
                                                             const float* sr, const float* sr1, int64_t g0,
                                                             int64_t gb, int64_t half, int64_t ng, float32x4_t* acc) {
  for (int64_t g = g0; g < ng; ++g) {
    const int32x4_t s = pair_group_sum<0>(qr, qr1, g * gb, std::min(gb, half - g * gb), xe, xo);
    acc[g % 16] = pair_fma(acc[g % 16], s, pcorr, psa, sr, sr1, g);
  }
}

// All T >= 2 rows of x in pairs (2p, 2p + 1) against pairs of weight rows (r, r + 1; the last one twice when o
// is odd): per group one smmla sum per 8 bytes of both nibble halves gives the 2 x 2 exact integer sums
// [(2p, r), (2p, r + 1), (2p + 1, r), (2p + 1, r + 1)] in the 4 lanes of one register; their float terms go
// into accumulator register g mod 16 (lane = output) by a fused multiply-add in increasing g, and the 16
// registers are added in lane_sum's tree lane by lane: the same bits as the generic path. An odd last row of x
// takes the dotprod rows.
//
// x's pairs are laid out once per call (per chunk of weight rows when kernels.cpp splits them over threads) as
// smmla reads them: for each 16 bytes at j of the two rows, their bytes j .. j + 7 (row 2p, then row 2p + 1),
// then bytes j + 8 .. j + 15; the weight rows are paired the same way in registers (zip1 / zip2 of 64-bit halves)
// as they stream.
//
// Where it pays (no arm64 timing here; instructions executed under qemu, scripts/arm64_kernel_instructions.sh,
// docs/kernels.md): per 16 weight bytes of 2 rows, 2 loads + 2 zips + 4 (ushr / and) + 4 loads of x + 4 smmla
// = 16 instructions for 128 products, against dotprod's tiles of 3 rows of x: 1 load + 2 + 3 x (2 loads + 2
// sdot) = 15 for 96; measured per 32 products at group 64: 6.7 vs 10.2 at T = 2, 6.4 vs 9.4 at T = 32 (GCC),
// and half the multiply instructions. Decode (T = 1) has no second row of x for smmla: dotprod rows. The main
// loop (accumulators in registers, no calls) takes the whole groups; pair_tail the partial last one.
template <int GB>
TOOLCHAIN_ARM64_I8MM void rows_pairs(const XView& x, int64_t T, const uint8_t* __restrict q,
                                     const float* __restrict scales, int64_t half, int64_t gb, int64_t ng, int64_t o,
                                     float* __restrict y, int64_t ystride) {
  const int64_t P = T / 2, span = (half + 15) / 16 * 16;          // pairs of rows; bytes read per row of x
  thread_local std::vector<int8_t> pe, po;
  thread_local std::vector<int32_t> pc;
  thread_local std::vector<float> ps;
  pe.resize(static_cast<size_t>(P * 2 * span));
  po.resize(static_cast<size_t>(P * 2 * span));
  pc.resize(static_cast<size_t>(P * ng * 4));
  ps.resize(static_cast<size_t>(P * ng * 4));
  for (int64_t p = 0; p < P; ++p) {
    const int64_t t = 2 * p;
    for (int h = 0; h < 2; ++h) {
      const int8_t* a = (h ? x.odd : x.even) + t * x.stride;
      const int8_t* b = a + x.stride;
      int8_t* dst = (h ? po : pe).data() + p * 2 * span;
      for (int64_t j = 0; j < span; j += 16) {
        const int64x2_t u = vreinterpretq_s64_s8(vld1q_s8(a + j)), v = vreinterpretq_s64_s8(vld1q_s8(b + j));
        vst1q_s8(dst + 2 * j, vreinterpretq_s8_s64(vzip1q_s64(u, v)));
        vst1q_s8(dst + 2 * j + 16, vreinterpretq_s8_s64(vzip2q_s64(u, v)));
      }
    }
    for (int64_t g = 0; g < ng; ++g) {
      const int32_t c0 = x.corr[t * x.gstride + g], c1 = x.corr[(t + 1) * x.gstride + g];
      const float s0 = x.sa[t * x.gstride + g], s1 = x.sa[(t + 1) * x.gstride + g];
      int32_t* c = pc.data() + (p * ng + g) * 4;
      float* s = ps.data() + (p * ng + g) * 4;
      c[0] = c[1] = c0;
      c[2] = c[3] = c1;
      s[0] = s[1] = s0;
      s[2] = s[3] = s1;
    }
  }
  const int64_t main = GB > 0 ? half / GB : 0;                   // the main loop's groups: wholly inside a row
  for (int64_t r = 0; r < o; r += 2) {
    const int64_t r1 = r + 1 < o ? r + 1 : r;
    const uint8_t* qr = q + r * half;
    const uint8_t* qr1 = q + r1 * half;
    const float* sr = scales + r * ng;
    const float* sr1 = scales + r1 * ng;
    for (int64_t p = 0; p < P; ++p) {
      const int8_t* xe = pe.data() + p * 2 * span;
      const int8_t* xo = po.data() + p * 2 * span;
      const int32_t* pcorr = pc.data() + p * ng * 4;
      const float* psa = ps.data() + p * ng * 4;
      float32x4_t acc[16];
      for (int l = 0; l < 16; ++l) acc[l] = vdupq_n_f32(0.0f);
      for (int64_t g0 = 0; g0 < main; g0 += 16) {
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l) {
          const int64_t g = g0 + l;
          if (g >= main) break;
          acc[l] = pair_fma(acc[l], pair_group_sum<GB>(qr, qr1, g * gb, GB, xe, xo), pcorr, psa, sr, sr1, g);
        }
      }
      if (main < ng) {
        float32x4_t held[16];
        for (int l = 0; l < 16; ++l) held[l] = acc[l];
        pair_tail(qr, qr1, xe, xo, pcorr, psa, sr, sr1, main, gb, half, ng, held);
        for (int l = 0; l < 16; ++l) acc[l] = held[l];
      }
      float32x4_t s8[8], s4[4];
      for (int l = 0; l < 8; ++l) s8[l] = vaddq_f32(acc[l], acc[l + 8]);
      for (int l = 0; l < 4; ++l) s4[l] = vaddq_f32(s8[l], s8[l + 4]);
      const float32x4_t out = vaddq_f32(vaddq_f32(s4[0], s4[2]), vaddq_f32(s4[1], s4[3]));
      float* y0 = y + 2 * p * ystride;
      float* y1 = y0 + ystride;
      y0[r] = vgetq_lane_f32(out, 0);
      y1[r] = vgetq_lane_f32(out, 2);
      if (r1 != r) {
        y0[r1] = vgetq_lane_f32(out, 1);
        y1[r1] = vgetq_lane_f32(out, 3);
      }
    }
  }
  if (T % 2) dotprod::all_rows(x, T - 1, 1, q, scales, half, gb, ng, o, y + (T - 1) * ystride, ystride);
}

}  // namespace i8mm
}  // namespace arm64
}  // namespace
#endif  // TOOLCHAIN_ARM64_EXTENSIONS

namespace {
namespace arm64 {

// y [T, o] (rows of x ystride apart: o weight rows of a larger call's, kernels.cpp's linear_rows) by the arm64 path
// `path` when it is one of them and the groups are whole 16-byte vectors (gb % 16 == 0); false (nothing done)
// otherwise: the generic path then runs.
inline bool int4_rows(KernelPath path, const XView& x, int64_t T, const uint8_t* q, const float* scales, int64_t half,
                      int64_t gb, int64_t ng, int64_t o, float* y, int64_t ystride) {
  if (gb % 16 != 0) return false;
  switch (path) {
#if TOOLCHAIN_ARM64_EXTENSIONS
    case KernelPath::i8mm:
      if (T >= 2) {
        switch (gb) {
          case 16: i8mm::rows_pairs<16>(x, T, q, scales, half, gb, ng, o, y, ystride); break;
          case 32: i8mm::rows_pairs<32>(x, T, q, scales, half, gb, ng, o, y, ystride); break;
          case 64: i8mm::rows_pairs<64>(x, T, q, scales, half, gb, ng, o, y, ystride); break;
          default: i8mm::rows_pairs<0>(x, T, q, scales, half, gb, ng, o, y, ystride); break;
        }
        return true;
      }
      dotprod::all_rows(x, 0, T, q, scales, half, gb, ng, o, y, ystride);
      return true;
    case KernelPath::dotprod: dotprod::all_rows(x, 0, T, q, scales, half, gb, ng, o, y, ystride); return true;
#endif
    case KernelPath::neon: neon::all_rows(x, 0, T, q, scales, half, gb, ng, o, y, ystride); return true;
    default: return false;
  }
}

}  // namespace arm64
}  // namespace

#endif  // TOOLCHAIN_KERNELS_ARM64_H_

#else  // TOOLCHAIN_ARM64_BODY: the rows of one path (namespace TOOLCHAIN_ARM64_NS, target TOOLCHAIN_ARM64_FN)

namespace {
namespace arm64 {
namespace TOOLCHAIN_ARM64_NS {

// acc + the products of 16 weight bytes' high nibbles with e and low nibbles with d (16 int8 values of x's even /
// odd columns), in 4 int32 lanes (exact: |a| <= 127, nibbles 0..15).
TOOLCHAIN_ARM64_FN inline int32x4_t dot2(int32x4_t acc, uint8x16_t hi, uint8x16_t lo, int8x16_t e, int8x16_t d) {
#if TOOLCHAIN_ARM64_SDOT
  acc = vdotq_s32(acc, vreinterpretq_s8_u8(hi), e);
  return vdotq_s32(acc, vreinterpretq_s8_u8(lo), d);
#else
  const int8x16_t h = vreinterpretq_s8_u8(hi), l = vreinterpretq_s8_u8(lo);
  int16x8_t p = vmull_s8(vget_low_s8(h), vget_low_s8(e));   // 4 products per 16-bit lane: |sum| <= 7620
  p = vmlal_high_s8(p, h, e);
  p = vmlal_s8(p, vget_low_s8(l), vget_low_s8(d));
  p = vmlal_high_s8(p, l, d);
  return vpadalq_s16(acc, p);
#endif
}

// A tile: NT rows of x (xe / xo: their int8 columns, corr: their corrections) by NR weight rows (qr).
template <int NT, int NR>
struct Tile {
  const int8_t* xe[NT];
  const int8_t* xo[NT];
  const int32_t* corr[NT];
  const uint8_t* qr[NR];
};

// s[t][w] = 4 int32 lanes whose sum is a group's integer sum (before the correction) for row t of x and weight
// row w of the tile, from the n bytes at j0 of the weight rows (n <= 0: a group past ng, zeros). GB > 0: n == GB
// or n <= 0 (whole 16-byte vectors, unrolled, read in place); GB = 0: any n, a partial last 16 bytes through
// load_tail. Each 16 bytes of x are loaded once for the NR weight rows, each 16 weight bytes once for NT rows.
template <int NT, int NR, int GB>
TOOLCHAIN_ARM64_FN inline void group_sums(const Tile<NT, NR>& tile, int64_t j0, int64_t n, int32x4_t (*s)[NR]) {
  const uint8x16_t nib = vdupq_n_u8(0x0F);
  for (int t = 0; t < NT; ++t)
    for (int w = 0; w < NR; ++w) s[t][w] = vdupq_n_s32(0);
  const int64_t len = GB > 0 ? GB : n;
  if (GB > 0 && n <= 0) return;
#pragma GCC unroll 4
  for (int64_t j = 0; j < len; j += 16) {
    uint8x16_t hi[NR], lo[NR];
    for (int w = 0; w < NR; ++w) {
      const uint8_t* p = tile.qr[w] + j0 + j;
      const uint8x16_t b = GB > 0 || n - j >= 16 ? vld1q_u8(p) : load_tail(p, n - j);
      hi[w] = vshrq_n_u8(b, 4);
      lo[w] = vandq_u8(b, nib);
    }
    for (int t = 0; t < NT; ++t) {
      const int8x16_t e = vld1q_s8(tile.xe[t] + j0 + j), d = vld1q_s8(tile.xo[t] + j0 + j);
      for (int w = 0; w < NR; ++w) s[t][w] = dot2(s[t][w], hi[w], lo[w], e, d);
    }
  }
}

// isum[t][w] = the integer sums of groups g .. g + 3 (lane k: group g + k; 3 addp fold the 4 groups' lanes),
// minus their corrections. GB > 0: each of the 4 groups lies wholly inside the rows or past their last group.
template <int NT, int NR, int GB>
TOOLCHAIN_ARM64_FN inline void quad_sums(const Tile<NT, NR>& tile, int64_t g, int64_t gb, int64_t half,
                                         int32x4_t (*isum)[NR]) {
  int32x4_t pair[2][NT][NR];
  for (int h = 0; h < 2; ++h) {
    int32x4_t s0[NT][NR], s1[NT][NR];
    const int64_t ga = g + 2 * h, gc = ga + 1;
    group_sums<NT, NR, GB>(tile, ga * gb, std::min(gb, half - ga * gb), s0);
    group_sums<NT, NR, GB>(tile, gc * gb, std::min(gb, half - gc * gb), s1);
    for (int t = 0; t < NT; ++t)
      for (int w = 0; w < NR; ++w) pair[h][t][w] = vpaddq_s32(s0[t][w], s1[t][w]);
  }
  for (int t = 0; t < NT; ++t) {
    const int32x4_t c = vld1q_s32(tile.corr[t] + g);
    for (int w = 0; w < NR; ++w) isum[t][w] = vsubq_s32(vpaddq_s32(pair[0][t][w], pair[1][t][w]), c);
  }
}

// The fused multiply-add of quad g's sums into acc[t][w][k]: float(isum) * (sw * sa) (sw: the rows' scales of the
// quad, zero past ng).
template <int NT, int NR>
TOOLCHAIN_ARM64_FN inline void quad_fma(float32x4_t (*acc)[NR], const int32x4_t (*isum)[NR], const float32x4_t* sw,
                                        const float* const* sa, int64_t g) {
  for (int t = 0; t < NT; ++t) {
    const float32x4_t a = vld1q_f32(sa[t] + g);
    for (int w = 0; w < NR; ++w) acc[t][w] = vfmaq_f32(acc[t][w], vcvtq_f32_s32(isum[t][w]), vmulq_f32(sw[w], a));
  }
}

// The quads g0, g0 + 4, ... < ng that rows' main loop leaves (any group width, a partial group, or fewer than 4
// scales left), into acc[t][w][(g / 4) mod 4] (in memory): out of line, once per row at most.
template <int NT, int NR>
TOOLCHAIN_ARM64_FN __attribute__((noinline)) void tail_quads(const Tile<NT, NR>& tile, const float* const* sr,
                                                             const float* const* sa, int64_t g0, int64_t gb,
                                                             int64_t half, int64_t ng, float32x4_t (*acc)[NR][4]) {
  for (int64_t g = g0; g < ng; g += 4) {
    int32x4_t isum[NT][NR];
    quad_sums<NT, NR, 0>(tile, g, gb, half, isum);
    float32x4_t sw[NR];
    for (int w = 0; w < NR; ++w) sw[w] = load_scales(sr[w] + g, ng - g);
    float32x4_t a[NT][NR];
    const int k = static_cast<int>((g / 4) % 4);
    for (int t = 0; t < NT; ++t)
      for (int w = 0; w < NR; ++w) a[t][w] = acc[t][w][k];
    quad_fma<NT, NR>(a, isum, sw, sa, g);
    for (int t = 0; t < NT; ++t)
      for (int w = 0; w < NR; ++w) acc[t][w][k] = a[t][w];
  }
}

// Output rows r0 .. r1 - 1 ((r1 - r0) % NR == 0) for rows t0 .. t0 + NT - 1 of x, NR weight rows at a time,
// groups of GB bytes (16, 32, 64; 0: any multiple of 16). Per quad of groups g .. g + 3: the 4 integer sums in
// one register, times sw * sa, into accumulator register (g mod 16) / 4 of (t, w): group g in lane g mod 16, by
// a fused multiply-add in increasing g; then lane_sum's tree. The main loop (accumulators in registers, no
// calls) takes the quads whose groups are all whole (GB > 0) and have 4 scales; tail_quads the rest.
template <int NT, int NR, int GB>
TOOLCHAIN_ARM64_FN void rows(const XView& x, int64_t t0, const uint8_t* __restrict q, const float* __restrict scales,
                             int64_t half, int64_t gb, int64_t ng, int64_t r0, int64_t r1, float* y, int64_t ystride) {
  Tile<NT, NR> tile;
  const float* sa[NT];
  for (int t = 0; t < NT; ++t) {
    tile.xe[t] = x.even + (t0 + t) * x.stride;
    tile.xo[t] = x.odd + (t0 + t) * x.stride;
    tile.corr[t] = x.corr + (t0 + t) * x.gstride;
    sa[t] = x.sa + (t0 + t) * x.gstride;
  }
  // the main loop's quads g .. g + 3: g < main, each group of them whole or past ng (all quads when GB divides the
  // row, else those before the partial last group's)
  const int64_t main = GB > 0 ? (half % GB == 0 ? ng : half / GB / 4 * 4) : 0;
  for (int64_t r = r0; r < r1; r += NR) {
    const float* sr[NR];
    for (int w = 0; w < NR; ++w) {
      tile.qr[w] = q + (r + w) * half;
      sr[w] = scales + (r + w) * ng;
    }
    float32x4_t acc[NT][NR][4];
    for (int t = 0; t < NT; ++t)
      for (int w = 0; w < NR; ++w)
        for (int k = 0; k < 4; ++k) acc[t][w][k] = vdupq_n_f32(0.0f);
    for (int64_t g0 = 0; g0 < main; g0 += 16) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int64_t g = g0 + 4 * k;
        if (g >= main) break;
        int32x4_t isum[NT][NR];
        quad_sums<NT, NR, GB>(tile, g, gb, half, isum);
        float32x4_t sw[NR], a[NT][NR];
        for (int w = 0; w < NR; ++w) sw[w] = load_scales(sr[w] + g, ng - g);
        for (int t = 0; t < NT; ++t)
          for (int w = 0; w < NR; ++w) a[t][w] = acc[t][w][k];
        quad_fma<NT, NR>(a, isum, sw, sa, g);
        for (int t = 0; t < NT; ++t)
          for (int w = 0; w < NR; ++w) acc[t][w][k] = a[t][w];
      }
    }
    if (main < ng) {
      float32x4_t held[NT][NR][4];
      for (int t = 0; t < NT; ++t)
        for (int w = 0; w < NR; ++w)
          for (int k = 0; k < 4; ++k) held[t][w][k] = acc[t][w][k];
      tail_quads<NT, NR>(tile, sr, sa, main, gb, half, ng, held);
      for (int t = 0; t < NT; ++t)
        for (int w = 0; w < NR; ++w)
          for (int k = 0; k < 4; ++k) acc[t][w][k] = held[t][w][k];
    }
    for (int t = 0; t < NT; ++t)
      for (int w = 0; w < NR; ++w)
        y[t * ystride + r + w] = lane_sum4(acc[t][w][0], acc[t][w][1], acc[t][w][2], acc[t][w][3]);
  }
}

// All o output rows for rows t0 .. t0 + NT - 1 of x: NR weight rows at a time, the o % NR last ones singly.
template <int NT, int NR>
TOOLCHAIN_ARM64_FN inline void rows_any(const XView& x, int64_t t0, const uint8_t* q, const float* scales,
                                        int64_t half, int64_t gb, int64_t ng, int64_t o, float* y, int64_t ystride) {
  const int64_t om = o / NR * NR;
  switch (gb) {
    case 16:
      rows<NT, NR, 16>(x, t0, q, scales, half, gb, ng, 0, om, y, ystride);
      return rows<NT, 1, 16>(x, t0, q, scales, half, gb, ng, om, o, y, ystride);
    case 32:
      rows<NT, NR, 32>(x, t0, q, scales, half, gb, ng, 0, om, y, ystride);
      return rows<NT, 1, 32>(x, t0, q, scales, half, gb, ng, om, o, y, ystride);
    case 64:
      rows<NT, NR, 64>(x, t0, q, scales, half, gb, ng, 0, om, y, ystride);
      return rows<NT, 1, 64>(x, t0, q, scales, half, gb, ng, om, o, y, ystride);
    default:
      rows<NT, NR, 0>(x, t0, q, scales, half, gb, ng, 0, om, y, ystride);
      return rows<NT, 1, 0>(x, t0, q, scales, half, gb, ng, om, o, y, ystride);
  }
}

// Rows t0 .. t0 + T - 1 of x into y[0 ..] (o outputs per row of x, rows ystride apart): tiles of 3 rows of x by 1
// weight row (the last tile 1 or 2 rows of x); a single row of x (decode) by DECODE_NR weight rows.
TOOLCHAIN_ARM64_FN inline void all_rows(const XView& x, int64_t t0, int64_t T, const uint8_t* q, const float* scales,
                                        int64_t half, int64_t gb, int64_t ng, int64_t o, float* y, int64_t ystride) {
  for (int64_t t = 0; t < T; t += 3) {
    float* yt = y + t * ystride;
    switch (std::min<int64_t>(3, T - t)) {
      case 3: rows_any<3, 1>(x, t0 + t, q, scales, half, gb, ng, o, yt, ystride); break;
      case 2: rows_any<2, 1>(x, t0 + t, q, scales, half, gb, ng, o, yt, ystride); break;
      default: rows_any<1, TOOLCHAIN_ARM64_DECODE_NR>(x, t0 + t, q, scales, half, gb, ng, o, yt, ystride); break;
    }
  }
}

}  // namespace TOOLCHAIN_ARM64_NS
}  // namespace arm64
}  // namespace

#endif  // TOOLCHAIN_ARM64_BODY
