// toolchain::int4_linear: y = x W^T for group-wise int4 W, read in place (no float copy of W).
//
// The layout is the weights file's (toolchain/mesp/ops/quant.py): W [o, i] as q [o, i/2] bytes, byte j of
// a row holding column 2j in its high nibble and 2j + 1 in its low one, value n - 8 for nibble n, and a
// float scale per row and group of `group` columns, scales [o, ceil(i / group)] (the last group may be
// partial). Each weight is dequantized exactly as the reference does it, w = float(n - 8) * s (one
// float product), and multiplied into x with a fused multiply-add:
//   y[t, r] = sum_k x[t, k] * w[r, k]
// in a fixed order on every machine: four 16-lane accumulators per row of x (high / low nibbles of the
// even / odd 16-byte steps of a group), then ((a0 + a1) + (a2 + a3)), the leftover bytes of a group
// shorter than 16 bytes added lane j mod 16, and the 16 lanes summed as a fixed pairwise tree. Written
// with GCC / Clang vector extensions (AVX-512: one register per accumulator, AVX2 two, NEON four), and
// `acc + x * w` is one fused multiply-add wherever the target has FMA (x86-64 with FMA3, arm64): the
// x86-64 and arm64 builds give the same bits (scripts/check_kernel_arm64.sh checks it under qemu).
//
// Rows of x are taken TT at a time, so each weight is decoded once per TT rows (decode: T = 1; a prefill
// chunk: T = 32, 8 tiles of 4). x is split into even and odd columns once per call (T * i floats of
// scratch), which makes every inner loop contiguous.
//
// Built by toolchain/native/build.py (g++ -O3, against the executorch wheel's headers and libexecutorch)
// for the host, and by the apps' native builds (android/, ios/) for arm64. Registers the ExecuTorch
// kernel `toolchain::int4_linear.out` at load; `toolchain_int4_linear` is the same computation as a C
// function for the kernel tests.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace {

constexpr int64_t L = 16;   // accumulator lanes
constexpr int64_t TT = 4;   // rows of x per weight decode

// Lanes summed pairwise: ((a0 + a8) + (a4 + a12)) + ... (a fixed tree).
inline float lane_sum(const float* a) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// GCC / Clang vector extensions: 16 lanes (one AVX-512 register, two AVX2, four NEON).
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

// 16 bytes widened to 16 int32 lanes. Compilers scalarize __builtin_convertvector of u8 -> i32, so each
// target gets its widening instruction (vpmovzxbd; NEON's two vmovl steps).
inline i32x16 widen16(const uint8_t* p) {
  i32x16 v;
#if defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::memcpy(&v, &w, sizeof v);
#elif defined(__AVX2__)
  const __m256i w[2] = {_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
  std::memcpy(&v, w, sizeof v);
#elif defined(__ARM_NEON)
  const uint8x16_t b = vld1q_u8(p);
  const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_u8(vget_high_u8(b));
  const uint32x4_t w[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                           vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))};
  std::memcpy(&v, w, sizeof v);
#else
  int32_t w[16];
  for (int l = 0; l < 16; ++l) w[l] = p[l];
  std::memcpy(&v, w, sizeof v);
#endif
  return v;
}

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A group's dequantization: the 16 values a nibble can stand for, (k - 8) * s for k = 0..15 (each the
// same float product as the reference's), and 16 nibbles -> 16 weights. AVX-512 looks them up in one
// register (vpermps uses an index's low 4 bits, so the low nibble needs no mask); elsewhere the nibble is
// converted and multiplied.
struct GroupScale {
  f32x16 s;
#if defined(__AVX512F__)
  __m512 table;
#endif
  explicit GroupScale(float scale) : s(f32x16{} + scale) {
#if defined(__AVX512F__)
    const __m512 k = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    table = _mm512_mul_ps(k, _mm512_set1_ps(scale));
#endif
  }
};

inline void dequant16(const uint8_t* p, const GroupScale& g, f32x16& wh, f32x16& wl) {
#if defined(__AVX512F__)
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512 h = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), g.table);
  const __m512 l = _mm512_permutexvar_ps(b, g.table);
  std::memcpy(&wh, &h, sizeof wh);
  std::memcpy(&wl, &l, sizeof wl);
#else
  const i32x16 b = widen16(p);
  wh = __builtin_convertvector((b >> 4) - 8, f32x16) * g.s;   // w = float(n - 8) * s
  wl = __builtin_convertvector((b & 15) - 8, f32x16) * g.s;
#endif
}

// One output row r for NT (<= TT) rows of x: xe/xo [NT][half] even/odd columns, q [half] bytes of row r.
// Four accumulators per row of x (even / odd 16-byte step of a group x high / low nibbles): independent FMA
// chains. Groups whose byte count is a multiple of 2L (group 64, 128, ...) and are all whole take the
// first loop alone; others (smaller or partial groups) go step by step, in the same lanes.
template <int NT>
inline void row_dot(const float* const* xe_in, const float* const* xo_in, const uint8_t* __restrict q,
                    const float* __restrict s, int64_t half, int64_t group_bytes, int64_t ng, float* y,
                    int64_t ystride) {
  const float* __restrict xe[NT];
  const float* __restrict xo[NT];
  for (int t = 0; t < NT; ++t) {
    xe[t] = xe_in[t];
    xo[t] = xo_in[t];
  }
  f32x16 acc[NT][4];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = f32x16{};
  float tail[NT][L] = {};
  // One 16-byte step at byte j into accumulators 2u (high nibbles) and 2u + 1 (low nibbles).
  auto step = [&](int64_t j, int u, const GroupScale& sg) {
    f32x16 wh, wl;
    dequant16(q + j, sg, wh, wl);
    for (int t = 0; t < NT; ++t) {
      acc[t][2 * u] = acc[t][2 * u] + load16(xe[t] + j) * wh;
      acc[t][2 * u + 1] = acc[t][2 * u + 1] + load16(xo[t] + j) * wl;
    }
  };
  if (group_bytes % (2 * L) == 0 && ng * group_bytes == half) {
    for (int64_t g = 0, j = 0; g < ng; ++g) {
      const GroupScale sg(s[g]);
      for (const int64_t j1 = j + group_bytes; j < j1; j += 2 * L) {
        step(j, 0, sg);
        step(j + L, 1, sg);
      }
    }
  } else {
    for (int64_t g = 0; g < ng; ++g) {
      const GroupScale sg(s[g]);
      const int64_t j0 = g * group_bytes, j1 = std::min(half, j0 + group_bytes);
      int64_t j = j0;
      for (; j + 2 * L <= j1; j += 2 * L) {
        step(j, 0, sg);
        step(j + L, 1, sg);
      }
      if (j + L <= j1) {
        step(j, 0, sg);
        j += L;
      }
      for (; j < j1; ++j) {  // fewer than 2L columns left in the group: lane j mod L
        const int32_t b = q[j];
        const float wh = static_cast<float>((b >> 4) - 8) * s[g];
        const float wl = static_cast<float>((b & 15) - 8) * s[g];
        for (int t = 0; t < NT; ++t) tail[t][j % L] = tail[t][j % L] + xe[t][j] * wh + xo[t][j] * wl;
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    float lanes[L];
    const f32x16 a = (acc[t][0] + acc[t][1]) + (acc[t][2] + acc[t][3]);
    std::memcpy(lanes, &a, sizeof lanes);
    for (int64_t l = 0; l < L; ++l) lanes[l] += tail[t][l];
    y[t * ystride] = lane_sum(lanes);
  }
}

}  // namespace

extern "C" {

// y [T, o] = x [T, i] W^T; q [o, i/2], scales [o, ng] (ng = ceil(i / group)). Returns 0, or -1 for bad
// arguments (i odd, group odd or < 2, ng != ceil(i / group)).
int toolchain_int4_linear(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales, int64_t o,
                          int64_t ng, int64_t group, float* y) {
  if (in <= 0 || in % 2 || group < 2 || group % 2 || ng != (in + group - 1) / group || T < 0 || o < 0) return -1;
  const int64_t half = in / 2, gb = group / 2;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(2 * T * half));
  float* even = scratch.data();
  float* odd = even + T * half;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < half; ++j) {
      even[t * half + j] = x[t * in + 2 * j];
      odd[t * half + j] = x[t * in + 2 * j + 1];
    }
  for (int64_t t0 = 0; t0 < T; t0 += TT) {
    const int64_t nt = std::min(TT, T - t0);
    const float* xe[TT];
    const float* xo[TT];
    for (int64_t t = 0; t < nt; ++t) {
      xe[t] = even + (t0 + t) * half;
      xo[t] = odd + (t0 + t) * half;
    }
    float* yt = y + t0 * o;
    for (int64_t r = 0; r < o; ++r) {
      const uint8_t* qr = q + r * half;
      const float* sr = scales + r * ng;
      switch (nt) {
        case 4: row_dot<4>(xe, xo, qr, sr, half, gb, ng, yt + r, o); break;
        case 3: row_dot<3>(xe, xo, qr, sr, half, gb, ng, yt + r, o); break;
        case 2: row_dot<2>(xe, xo, qr, sr, half, gb, ng, yt + r, o); break;
        default: row_dot<1>(xe, xo, qr, sr, half, gb, ng, yt + r, o); break;
      }
    }
  }
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

// toolchain::int4_linear.out(Tensor x, Tensor qweight, Tensor scales, int group, *, Tensor(a!) out)
Tensor& int4_linear_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& qweight, const Tensor& scales,
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
  const int rc = toolchain_int4_linear(x.const_data_ptr<float>(), T, in, qweight.const_data_ptr<uint8_t>(),
                                       scales.const_data_ptr<float>(), o, scales.size(1), group,
                                       out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK(ctx, rc == 0, InvalidArgument, out);
  return out;
}

}  // namespace

EXECUTORCH_LIBRARY(toolchain, "int4_linear.out", int4_linear_out);
#endif
