// The arm64 paths of toolchain::int4_linear_a8 (kernels.cpp includes this file under `#if defined(__aarch64__)`,
// after its KernelPath enum): one library built at the apps' baseline (armv8-a) holds all three, each chosen at
// run time (kernels.cpp's kernel_path_choice, from cpu_has below):
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
// 4 registers of 4, or for i8mm one register of 4 outputs per lane), and the lanes are summed in lane_sum's tree.
// Unsigned nibbles rather than n - 8: splitting a byte into two unsigned nibbles is 2 instructions (ushr, and)
// per 16 bytes against 4 for signed ones (eor / shl / 2 sshr, or 2 subs more), in the loop that streams the
// weights, while the correction is one subtraction per 4 groups (the corr vector that QuantizedX holds anyway).
//
// Groups whose byte count (group / 2) is a multiple of 16 (groups of 32, 64, 96, 128, ... columns) take these
// paths; others the generic one. A row's partial last 16 bytes are read through a zero-padded copy (no read past
// the weights); x is zero-padded by QuantizedX, so the bytes past a partial last group add nothing.

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

inline bool cpu_has(KernelPath p) {
  switch (p) {
    case KernelPath::neon: return true;                            // Advanced SIMD: part of every AArch64 ABI
    case KernelPath::dotprod: return has_dotprod();
    case KernelPath::i8mm: return has_dotprod() && has_i8mm();     // its odd rows and decode take dotprod's rows
    default: return false;
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

// lane_sum's tree on 16 lanes held as a0 (lanes 0..3), a1 (4..7), a2 (8..11), a3 (12..15): (l, l + 8), then
// (l, l + 4), then (0 + 2) + (1 + 3).
inline float lane_sum4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
  const float32x4_t s4 = vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
  const float32x2_t t = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));   // [s0 + s2, s1 + s3]
  return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

// The 16 bytes of a weight row at j, or its last n < 16 bytes zero-padded (no read past the row).
inline uint8x16_t load_weights(const uint8_t* p, int64_t n) {
  if (n >= 16) return vld1q_u8(p);
  alignas(16) uint8_t b[16] = {};
  std::memcpy(b, p, static_cast<size_t>(n));
  return vld1q_u8(b);
}

// 4 consecutive scales sr[g .. g + 3], zeros past ng (no read past the row).
inline float32x4_t load_scales4(const float* sr, int64_t g, int64_t ng) {
  if (g + 4 <= ng) return vld1q_f32(sr + g);
  alignas(16) float b[4] = {};
  for (int64_t k = g; k < ng; ++k) b[k - g] = sr[k];
  return vld1q_f32(b);
}

}  // namespace arm64
}  // namespace

// The rows of the neon and dotprod paths: the same code, once per path (this file includes itself with
// TOOLCHAIN_ARM64_BODY set: the part after #else below), each copy's functions compiled for its path's target.
#define TOOLCHAIN_ARM64_BODY 1
#define TOOLCHAIN_ARM64_NS neon
#define TOOLCHAIN_ARM64_FN
#define TOOLCHAIN_ARM64_SDOT 0
#include "kernels_arm64.h"
#undef TOOLCHAIN_ARM64_NS
#undef TOOLCHAIN_ARM64_FN
#undef TOOLCHAIN_ARM64_SDOT
#define TOOLCHAIN_ARM64_NS dotprod
#define TOOLCHAIN_ARM64_FN TOOLCHAIN_ARM64_DOTPROD
#define TOOLCHAIN_ARM64_SDOT 1
#include "kernels_arm64.h"
#undef TOOLCHAIN_ARM64_NS
#undef TOOLCHAIN_ARM64_FN
#undef TOOLCHAIN_ARM64_SDOT
#undef TOOLCHAIN_ARM64_BODY

namespace {
namespace arm64 {
namespace i8mm {

// All T >= 2 rows of x in pairs (2p, 2p + 1) against pairs of weight rows (r, r + 1; the last one twice when o
// is odd): per group one smmla sum per 8 bytes of both nibble halves gives the 2 x 2 exact integer sums
// [(2p, r), (2p, r + 1), (2p + 1, r), (2p + 1, r + 1)] in the 4 lanes of one register; their float terms go
// into accumulator register g mod 16 (lane = output) by a fused multiply-add in increasing g, and the 16
// registers are added in lane_sum's tree lane by lane: the same bits as the generic path. An odd last row of x
// takes the dotprod rows.
//
// x's pairs are laid out once per call as smmla reads them: for each 16 bytes at j of the two rows, their
// bytes j .. j + 7 (row 2p, then row 2p + 1), then bytes j + 8 .. j + 15; the weight rows are paired the same
// way in registers (zip1 / zip2 of 64-bit halves) as they stream.
//
// Where it pays (no arm64 timing here: instruction counts of the inner loops, per 16 weight bytes = 32 weights):
// dotprod's tiles of 3 rows of x take 3 (load, ushr, and) + 3 x (2 loads of x + 2 sdot) = 15 instructions for
// 96 products (5.0 per 32); this 2 x 2 tile takes 2 x (load) + 2 zips + 4 (ushr / and) + 4 loads of x + 4 smmla
// = 16 for 128 products (4.0 per 32), and half the multiply instructions (smmla: 32 products, sdot: 16).
// Adding the per-group float work (about 10 instructions per group for 4 outputs here, 9 for 4 outputs there),
// per group of 32 columns: 26 vs 21.75 / 96 x 128 = 29 (0.90x), of 64: 42 vs 49 (0.86x), of 128: 74 vs 89
// (0.83x). Decode (T = 1) has no second row of x for smmla: dotprod rows.
TOOLCHAIN_ARM64_I8MM void rows_pairs(const XView& x, int64_t T, const uint8_t* __restrict q,
                                     const float* __restrict scales, int64_t half, int64_t gb, int64_t ng, int64_t o,
                                     float* __restrict y) {
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
  const uint8x16_t nib = vdupq_n_u8(0x0F);
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
      for (int64_t g0 = 0; g0 < ng; g0 += 16) {
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l) {
          const int64_t g = g0 + l;
          if (g >= ng) break;
          const int64_t j0 = g * gb, n = std::min(gb, half - j0);
          int32x4_t s = vdupq_n_s32(0);
          for (int64_t j = 0; j < n; j += 16) {
            const uint64x2_t w0 = vreinterpretq_u64_u8(load_weights(qr + j0 + j, n - j));
            const uint64x2_t w1 = vreinterpretq_u64_u8(load_weights(qr1 + j0 + j, n - j));
            const uint8x16_t z0 = vreinterpretq_u8_u64(vzip1q_u64(w0, w1));   // bytes 0..7 of r, then of r1
            const uint8x16_t z1 = vreinterpretq_u8_u64(vzip2q_u64(w0, w1));   // bytes 8..15
            const int8_t* e = xe + 2 * (j0 + j);
            const int8_t* d = xo + 2 * (j0 + j);
            s = vmmlaq_s32(s, vld1q_s8(e), vreinterpretq_s8_u8(vshrq_n_u8(z0, 4)));
            s = vmmlaq_s32(s, vld1q_s8(e + 16), vreinterpretq_s8_u8(vshrq_n_u8(z1, 4)));
            s = vmmlaq_s32(s, vld1q_s8(d), vreinterpretq_s8_u8(vandq_u8(z0, nib)));
            s = vmmlaq_s32(s, vld1q_s8(d + 16), vreinterpretq_s8_u8(vandq_u8(z1, nib)));
          }
          const int32x4_t isum = vsubq_s32(s, vld1q_s32(pcorr + 4 * g));
          const float32x2_t sw2 = vset_lane_f32(sr1[g], vdup_n_f32(sr[g]), 1);      // [sw_r, sw_r1]
          const float32x4_t c = vmulq_f32(vcombine_f32(sw2, sw2), vld1q_f32(psa + 4 * g));
          acc[l] = vfmaq_f32(acc[l], vcvtq_f32_s32(isum), c);
        }
      }
      float32x4_t s8[8], s4[4];
      for (int l = 0; l < 8; ++l) s8[l] = vaddq_f32(acc[l], acc[l + 8]);
      for (int l = 0; l < 4; ++l) s4[l] = vaddq_f32(s8[l], s8[l + 4]);
      const float32x4_t out = vaddq_f32(vaddq_f32(s4[0], s4[2]), vaddq_f32(s4[1], s4[3]));
      float* y0 = y + 2 * p * o;
      float* y1 = y0 + o;
      y0[r] = vgetq_lane_f32(out, 0);
      y1[r] = vgetq_lane_f32(out, 2);
      if (r1 != r) {
        y0[r1] = vgetq_lane_f32(out, 1);
        y1[r1] = vgetq_lane_f32(out, 3);
      }
    }
  }
  if (T % 2) dotprod::all_rows(x, T - 1, 1, q, scales, half, gb, ng, o, y + (T - 1) * o);
}

}  // namespace i8mm

// y [T, o] by the arm64 path `path` when it is one of them and the groups are whole 16-byte vectors (gb % 16 ==
// 0); false (nothing done) otherwise: the generic path then runs.
inline bool int4_rows(KernelPath path, const XView& x, int64_t T, const uint8_t* q, const float* scales, int64_t half,
                      int64_t gb, int64_t ng, int64_t o, float* y) {
  if (gb % 16 != 0) return false;
  switch (path) {
    case KernelPath::i8mm:
      if (T >= 2) {
        i8mm::rows_pairs(x, T, q, scales, half, gb, ng, o, y);
        return true;
      }
      dotprod::all_rows(x, 0, T, q, scales, half, gb, ng, o, y);
      return true;
    case KernelPath::dotprod: dotprod::all_rows(x, 0, T, q, scales, half, gb, ng, o, y); return true;
    case KernelPath::neon: neon::all_rows(x, 0, T, q, scales, half, gb, ng, o, y); return true;
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

// acc + the products of 16 weight bytes' high nibbles with xe[0..15] and low nibbles with xo[0..15], in 4 int32
// lanes (exact: |a| <= 127, nibbles 0..15).
TOOLCHAIN_ARM64_FN inline int32x4_t dot2(int32x4_t acc, uint8x16_t hi, uint8x16_t lo, const int8_t* xe,
                                         const int8_t* xo) {
#if TOOLCHAIN_ARM64_SDOT
  acc = vdotq_s32(acc, vreinterpretq_s8_u8(hi), vld1q_s8(xe));
  return vdotq_s32(acc, vreinterpretq_s8_u8(lo), vld1q_s8(xo));
#else
  const int8x16_t h = vreinterpretq_s8_u8(hi), l = vreinterpretq_s8_u8(lo), e = vld1q_s8(xe), d = vld1q_s8(xo);
  int16x8_t p = vmull_s8(vget_low_s8(h), vget_low_s8(e));   // 4 products per 16-bit lane: |sum| <= 7620
  p = vmlal_high_s8(p, h, e);
  p = vmlal_s8(p, vget_low_s8(l), vget_low_s8(d));
  p = vmlal_high_s8(p, l, d);
  return vpadalq_s16(acc, p);
#endif
}

// s[t] = 4 int32 lanes whose sum is group g's integer sum (before the correction) for row t of the tile: the n
// bytes of the weight row at j0 (n <= 0: a group past ng, zeros).
template <int NT>
TOOLCHAIN_ARM64_FN inline void group_sums(const uint8_t* qr, int64_t j0, int64_t n, const int8_t* const* xe,
                                          const int8_t* const* xo, int32x4_t* s) {
  for (int t = 0; t < NT; ++t) s[t] = vdupq_n_s32(0);
  const uint8x16_t nib = vdupq_n_u8(0x0F);
  for (int64_t j = 0; j < n; j += 16) {
    const uint8x16_t w = load_weights(qr + j0 + j, n - j);
    const uint8x16_t hi = vshrq_n_u8(w, 4), lo = vandq_u8(w, nib);
    for (int t = 0; t < NT; ++t) s[t] = dot2(s[t], hi, lo, xe[t] + j0 + j, xo[t] + j0 + j);
  }
}

// All o output rows for rows t0 .. t0 + NT - 1 of x (a tile: each weight byte loaded and split once for NT rows).
// Per quad of groups g .. g + 3: 4 group sums per row folded by 3 addp into one register (group g + k in lane k),
// minus the corrections, times sw * sa, into accumulator register (g mod 16) / 4: lane g mod 16.
template <int NT>
TOOLCHAIN_ARM64_FN void rows(const XView& x, int64_t t0, const uint8_t* __restrict q, const float* __restrict scales,
                             int64_t half, int64_t gb, int64_t ng, int64_t o, float* y, int64_t ystride) {
  const int8_t* xe[NT];
  const int8_t* xo[NT];
  const int32_t* corr[NT];
  const float* sa[NT];
  for (int t = 0; t < NT; ++t) {
    xe[t] = x.even + (t0 + t) * x.stride;
    xo[t] = x.odd + (t0 + t) * x.stride;
    corr[t] = x.corr + (t0 + t) * x.gstride;
    sa[t] = x.sa + (t0 + t) * x.gstride;
  }
  for (int64_t r = 0; r < o; ++r) {
    const uint8_t* qr = q + r * half;
    const float* sr = scales + r * ng;
    float32x4_t acc[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int k = 0; k < 4; ++k) acc[t][k] = vdupq_n_f32(0.0f);
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int64_t g = g0 + 4 * k;
        if (g >= ng) break;
        int32x4_t pair[2][NT];
        for (int h = 0; h < 2; ++h) {
          int32x4_t s0[NT], s1[NT];
          const int64_t ga = g + 2 * h, gb1 = ga + 1;
          group_sums<NT>(qr, ga * gb, std::min(gb, half - ga * gb), xe, xo, s0);
          group_sums<NT>(qr, gb1 * gb, gb1 < ng ? std::min(gb, half - gb1 * gb) : 0, xe, xo, s1);
          for (int t = 0; t < NT; ++t) pair[h][t] = vpaddq_s32(s0[t], s1[t]);
        }
        const float32x4_t sw = load_scales4(sr, g, ng);
        for (int t = 0; t < NT; ++t) {
          const int32x4_t isum = vsubq_s32(vpaddq_s32(pair[0][t], pair[1][t]), vld1q_s32(corr[t] + g));
          const float32x4_t c = vmulq_f32(sw, vld1q_f32(sa[t] + g));
          acc[t][k] = vfmaq_f32(acc[t][k], vcvtq_f32_s32(isum), c);
        }
      }
    }
    for (int t = 0; t < NT; ++t) y[t * ystride + r] = lane_sum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  }
}

// Rows t0 .. t0 + T - 1 of x into y[0 ..] (rows of o), in tiles of 3 rows (the last one 1 or 2).
TOOLCHAIN_ARM64_FN inline void all_rows(const XView& x, int64_t t0, int64_t T, const uint8_t* q, const float* scales,
                                        int64_t half, int64_t gb, int64_t ng, int64_t o, float* y) {
  for (int64_t t = 0; t < T; t += 3) {
    float* yt = y + t * o;
    switch (std::min<int64_t>(3, T - t)) {
      case 3: rows<3>(x, t0 + t, q, scales, half, gb, ng, o, yt, o); break;
      case 2: rows<2>(x, t0 + t, q, scales, half, gb, ng, o, yt, o); break;
      default: rows<1>(x, t0 + t, q, scales, half, gb, ng, o, yt, o); break;
    }
  }
}

}  // namespace TOOLCHAIN_ARM64_NS
}  // namespace arm64
}  // namespace

#endif  // TOOLCHAIN_ARM64_BODY
