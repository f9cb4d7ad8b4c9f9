// The x86 paths of toolchain_int4_linear_a8 (included by kernels.cpp inside its anonymous namespace, after
// QuantizedX, lane_sum and row_generic; x86-64 only): the CPU check behind the run-time dispatch and three
// paths, each compiled for its own instruction set with a target region (#pragma GCC target / clang attribute),
// so one library holds all of them whatever -march the rest of kernels.cpp is built with:
//   x86_avx512  (avx512_vnni)  512-bit vpdpbusd: decode rows, prefill tiles, the broadcast prefill kernel, group16
//   x86_avx2    (avx2)         256-bit vpmaddubsw + vpmaddwd (nibble 0..15 unsigned times int8 x: a pair sum
//                              is at most 2 * 15 * 127 = 3810, so up to 8 of them add in int16 without saturating)
//   x86_avx_vnni (avx_vnni)    the same kernels with 256-bit vpdpbusd (AVX-VNNI, VEX-encoded)
// (toolchain_int4_dyw_a8's panel differs more: int8 x int8 has no unsigned operand, so avx2 multiplies int16 pairs by
// vpmaddwd, avx_vnni the flipped bytes by vpdpbusd; dyw_panel below.)
// Every path computes the exact integer group sums and adds the float terms in the generic path's order (group g
// into lane g mod 16 by a fused multiply-add, groups in increasing order, then lane_sum's tree; in 256 bits the
// 16 lanes are two registers, lanes 0..7 and 8..15): the same bits as row_generic.
//
// What the paths share is one template each, instantiated per path: fold_blocks (toolchain_int4_dyw_a8's rounding)
// over a Lanes16 vector-traits struct (16 lanes: one 512-bit register, or two 256-bit ones), and the 256-bit row
// kernels (rows, rows_broadcast) over a PairDot struct, the one step where avx2 and avx_vnni differ (vpmaddubsw +
// vpmaddwd against vpdpbusd). A template takes its instruction set from the target region it is defined in (GCC and
// clang alike), so the templates are written once at the end of this file, which includes itself once per path
// (TOOLCHAIN_X86_PASS 1 avx512_vnni, 2 avx2, 3 avx_vnni) inside that path's region and namespace.

#ifndef TOOLCHAIN_X86_PASS
#ifndef TOOLCHAIN_KERNELS_X86_H
#define TOOLCHAIN_KERNELS_X86_H

#include <cpuid.h>
#include <immintrin.h>

#define TOOLCHAIN_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define TOOLCHAIN_TARGET_PUSH(t) TOOLCHAIN_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define TOOLCHAIN_TARGET_POP _Pragma("clang attribute pop")
#else
#define TOOLCHAIN_TARGET_PUSH(t) _Pragma("GCC push_options") TOOLCHAIN_PRAGMA(GCC target(t))
#define TOOLCHAIN_TARGET_POP _Pragma("GCC pop_options")
#endif

// The 256-bit paths take the broadcast kernel from this many rows of x on (the row tiles below it).
constexpr int64_t YMM_BROADCAST_T = 4;

// What this CPU and OS lack for an x86 path: nullptr when the path runs here, else the missing feature (for the
// error a forced path gives). cpuid leaf 1 (FMA, OSXSAVE), leaf 7 sub-leaf 0 (AVX2, AVX-512 F/DQ/BW/VL/VNNI),
// leaf 7 sub-leaf 1 EAX bit 4 (AVX-VNNI); the OS must save the registers (XCR0: SSE + AVX state, bits 1-2; for
// AVX-512 also the opmask and upper ZMM state, bits 5-7).
struct X86Cpu {
  bool fma = false, avx = false, ymm_os = false, zmm_os = false, avx2 = false, avx_vnni = false;
  bool avx512f = false, avx512dq = false, avx512bw = false, avx512vl = false, avx512vnni = false;
  X86Cpu() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    fma = c & (1u << 12);
    avx = c & (1u << 28);
    if (c & (1u << 27)) {                                         // OSXSAVE: xgetbv is available
      unsigned lo, hi;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      ymm_os = (lo & 0x6u) == 0x6u;
      zmm_os = (lo & 0xE6u) == 0xE6u;
    }
    if (__get_cpuid_max(0, nullptr) < 7) return;
    unsigned max_sub;
    __cpuid_count(7, 0, max_sub, b, c, d);
    avx2 = b & (1u << 5);
    avx512f = b & (1u << 16);
    avx512dq = b & (1u << 17);
    avx512bw = b & (1u << 30);
    avx512vl = b & (1u << 31);
    avx512vnni = c & (1u << 11);
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      avx_vnni = a & (1u << 4);
    }
  }
  const char* missing_avx2() const {
    if (!avx || !avx2) return "AVX2";
    if (!fma) return "FMA";
    if (!ymm_os) return "OS support of the AVX registers (XCR0)";
    return nullptr;
  }
  const char* missing_avx_vnni() const {
    if (const char* m = missing_avx2()) return m;
    return avx_vnni ? nullptr : "AVX-VNNI (cpuid leaf 7 sub-leaf 1 EAX bit 4)";
  }
  const char* missing_avx512_vnni() const {
    if (const char* m = missing_avx2()) return m;
    if (!avx512f) return "AVX512F";
    if (!avx512bw) return "AVX512BW";
    if (!avx512vl) return "AVX512VL";
    if (!avx512dq) return "AVX512DQ";
    if (!avx512vnni) return "AVX512-VNNI";
    if (!zmm_os) return "OS support of the AVX-512 registers (XCR0)";
    return nullptr;
  }
};

inline const X86Cpu& x86_cpu() {
  static const X86Cpu cpu;
  return cpu;
}

// ---------------------------------------------------------------------------------------------------------------
// avx512_vnni
TOOLCHAIN_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")
namespace x86_avx512 {

// One group of columns of row t: see group16 in the 256-bit paths below (the same values as QuantizedX::build's
// scalar loop).
void group16(QuantizedX& x, const float* xt, int64_t k0, int64_t k1, int64_t t, int64_t g) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t k = k0; k < k1; k += 16) {
    const __m512 v = _mm512_and_ps(_mm512_loadu_ps(xt + k), absmask);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, v);
  }
  const float s = nan ? NAN : _mm512_reduce_max_ps(amax) / 127.0f;
  const __m512i split = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t k = k0; k < k1; k += 16) {
    __m512i a = _mm512_setzero_si512();
    if (s > 0.0f) {
      const __m512 q = _mm512_div_ps(_mm512_loadu_ps(xt + k), _mm512_set1_ps(s));
      __m512 r = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(_mm512_set1_ps(-127.0f), r));
      a = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), r);
    }
    sum = _mm512_add_epi32(sum, a);
    alignas(16) int8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(split, a)));
    std::memcpy(&x.even[static_cast<size_t>(t * x.stride + k / 2)], bytes, 8);
    std::memcpy(&x.odd[static_cast<size_t>(t * x.stride + k / 2)], bytes + 8, 8);
  }
  x.sa[static_cast<size_t>(t * x.gstride + g)] = s;
  x.corr[static_cast<size_t>(t * x.gstride + g)] = 8 * _mm512_reduce_add_epi32(sum);
}

// [a0 + a1, a2 + a3, ..., a14 + a15, b0 + b1, ..., b14 + b15]
inline __m512i hadd_pairs(__m512i a, __m512i b, __m512i even, __m512i odd) {
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

// lane_sum's tree on a register: (l, l + 8), then (l, l + 4), then (0 + 2) + (1 + 3).
inline float lane_sum(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 t = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));            // [s0 + s2, s1 + s3, ...]
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The rows t0 .. t0 + NT - 1 of a QuantizedX a tile multiplies: their int8 columns (as laid out for
// rows_vnni, or `transposed` for rows_vnni_tiles), corrections and activation scales.
template <int NT>
struct TileRows {
  const int8_t* xe[NT];
  const int8_t* xo[NT];
  const int32_t* corr[NT];
  const float* sa[NT];
  TileRows(const QuantizedX& a, int64_t t0, bool transposed) {
    for (int t = 0; t < NT; ++t) {
      xe[t] = (transposed ? a.teven : a.even).data() + (t0 + t) * a.stride;
      xo[t] = (transposed ? a.todd : a.odd).data() + (t0 + t) * a.stride;
      corr[t] = a.corr.data() + (t0 + t) * a.gstride;
      sa[t] = a.sa.data() + (t0 + t) * a.gstride;
    }
  }
};

// The byte masks of a row's 64-byte chunks 0 .. n - 1 (all ones, the row's last bytes, then none): the
// same for every row of a matrix, so computed once per call.
inline const std::vector<__mmask64>& chunk_masks(int64_t half, int64_t n) {
  thread_local std::vector<__mmask64> masks;
  masks.resize(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    const int64_t b = std::min<int64_t>(64, std::max<int64_t>(0, half - c * 64));
    masks[static_cast<size_t>(c)] = b == 64 ? ~__mmask64{0} : ((__mmask64{1} << b) - 1);
  }
  return masks;
}

// All o output rows for rows t0 .. t0 + NT - 1 of x, groups of GB = 16, 32 or 64 bytes (32 / 64 / 128
// columns). A block is 16 groups (16 GB bytes): NV = GB / 16 vectors of 16 sub-group sums (16 bytes = 4
// lanes each, from 4 chunks of 64 bytes), folded pairwise into the 16 group sums. The chunk masks (the
// row's last bytes) are the same for every row, so they are computed once.
template <int NT, int GB>
void rows_vnni(const QuantizedX& a, int64_t t0, const uint8_t* __restrict q, const float* __restrict scales,
               int64_t half, int64_t ng, int64_t o, float* y, int64_t ystride) {
  constexpr int NV = GB / 16;
  constexpr int64_t BLOCK = L * GB;                               // bytes per block of 16 groups
  const std::vector<__mmask64>& masks = chunk_masks(half, (ng + L - 1) / L * NV * 4);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const TileRows<NT> x(a, t0, false);
  for (int64_t r = 0; r < o; ++r) {
    const uint8_t* qr = q + r * half;
    const float* sr = scales + r * ng;
    if (r + 2 < o) {                                              // the row after next, into L2
      for (int64_t b = 0; b < half; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qr + 2 * half + b), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(sr + 2 * ng), _MM_HINT_T1);
    }
    __m512 accf[NT];
    for (int t = 0; t < NT; ++t) accf[t] = _mm512_setzero_ps();
    const __mmask64* mk = masks.data();
    for (int64_t g0 = 0, j0 = 0; g0 < ng; g0 += L, j0 += BLOCK, mk += NV * 4) {
      __m512i v[NT][NV];
      for (int u = 0; u < NV; ++u) {
        if (j0 + u * 256 >= half) {                               // past the row's end (a short last block)
          for (int t = 0; t < NT; ++t) v[t][u] = _mm512_setzero_si512();
          continue;
        }
        __m512i acc[NT][4];
        for (int c = 0; c < 4; ++c) {
          const int64_t j = j0 + u * 256 + c * 64;
          const __m512i w = _mm512_maskz_loadu_epi8(mk[u * 4 + c], qr + j);
          const __m512i lo = _mm512_and_si512(w, nib), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
          for (int t = 0; t < NT; ++t)
            acc[t][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(x.xe[t] + j)),
                                            lo, _mm512_loadu_si512(x.xo[t] + j));
        }
        for (int t = 0; t < NT; ++t)
          v[t][u] = hadd_pairs(hadd_pairs(acc[t][0], acc[t][1], even, odd), hadd_pairs(acc[t][2], acc[t][3], even, odd),
                               even, odd);
      }
      const int64_t left = ng - g0;
      const __mmask16 gm = left >= L ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      const __m512 sw = _mm512_maskz_loadu_ps(gm, sr + g0);
      for (int t = 0; t < NT; ++t) {
        for (int w = NV; w > 1; w /= 2)
          for (int k = 0; k < w / 2; ++k) v[t][k] = hadd_pairs(v[t][2 * k], v[t][2 * k + 1], even, odd);
        const __m512i isum = _mm512_sub_epi32(v[t][0], _mm512_loadu_si512(x.corr[t] + g0));
        const __m512 c = _mm512_mul_ps(sw, _mm512_loadu_ps(x.sa[t] + g0));
        accf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), c, accf[t]);
      }
    }
    for (int t = 0; t < NT; ++t) y[t * ystride + r] = lane_sum(accf[t]);
  }
}

// rows_vnni for one row of x (decode) whose groups fit one block (ng <= 16, GB = 16 or 32 bytes: in <= 512
// or 1024 columns, every decode projection of Qwen2.5-0.5B but down_proj): x's int8 columns, corrections and
// activation scales are loaded into registers once, not once per weight row, so each weight row costs its
// own loads only. The same operations as rows_vnni on such a row: the same bits.
template <int GB>
void row_vnni_block_in_registers(const QuantizedX& a, const uint8_t* __restrict q, const float* __restrict scales,
                                 int64_t half, int64_t ng, int64_t o, float* y) {
  constexpr int NV = GB / 16, NC = NV * 4;
  const std::vector<__mmask64>& masks = chunk_masks(half, NC);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512i xe[NC], xo[NC];
  __mmask64 mk[NC];
  for (int c = 0; c < NC; ++c) {
    xe[c] = _mm512_loadu_si512(a.even.data() + c * 64);
    xo[c] = _mm512_loadu_si512(a.odd.data() + c * 64);
    mk[c] = masks[static_cast<size_t>(c)];
  }
  const __m512i corr = _mm512_loadu_si512(a.corr.data());
  const __m512 sa = _mm512_loadu_ps(a.sa.data());
  const __mmask16 gm = ng >= L ? __mmask16(0xFFFF) : __mmask16((1u << ng) - 1);
  for (int64_t r = 0; r < o; ++r) {
    const uint8_t* qr = q + r * half;
    const float* sr = scales + r * ng;
    if (r + 2 < o) {                                              // the row after next, into L2
      for (int64_t b = 0; b < half; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qr + 2 * half + b), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(sr + 2 * ng), _MM_HINT_T1);
    }
    __m512i v[NV];
    for (int u = 0; u < NV; ++u) {
      if (u * 256 >= half) {
        v[u] = _mm512_setzero_si512();
        continue;
      }
      __m512i acc[4];
      for (int c = 0; c < 4; ++c) {
        const int k = u * 4 + c;
        const __m512i w = _mm512_maskz_loadu_epi8(mk[k], qr + k * 64);
        const __m512i lo = _mm512_and_si512(w, nib), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
        acc[c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, xe[k]), lo, xo[k]);
      }
      v[u] = hadd_pairs(hadd_pairs(acc[0], acc[1], even, odd), hadd_pairs(acc[2], acc[3], even, odd), even, odd);
    }
    for (int w = NV; w > 1; w /= 2)
      for (int k = 0; k < w / 2; ++k) v[k] = hadd_pairs(v[2 * k], v[2 * k + 1], even, odd);
    const __m512i isum = _mm512_sub_epi32(v[0], corr);
    const __m512 c = _mm512_mul_ps(_mm512_maskz_loadu_ps(gm, sr), sa);
    y[r] = lane_sum(_mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), c, _mm512_setzero_ps()));
  }
}

// A block's D = GB / 4 weight registers (register c: bytes 64c .. 64c + 63, i.e. dword k of group y at lane
// (y * D + k) mod 16 of register (y * D + k) / 16) transposed so that register k holds dword k of every
// group, group y at lane y: log2(D) stages, each swapping one bit of the register index with the same bit of
// the lane index (two-register permutes), the last one also putting the groups in order.
template <int GB>
struct BlockTranspose {
  static constexpr int D = GB / 4, LOG = D == 4 ? 2 : D == 8 ? 3 : 4;
  __m512i lo_idx[LOG], hi_idx[LOG];
  BlockTranspose() {
    for (int st = 0; st < LOG; ++st) {
      alignas(64) int32_t i0[16], i1[16];
      for (int y = 0; y < 16; ++y) {
        const int x = st == LOG - 1 ? (((y >> (4 - LOG)) & (D - 1)) | ((y & (16 / D - 1)) << LOG)) : y;
        const int bit = (x >> st) & 1;
        i0[y] = (x & ~(1 << st)) + 16 * bit;
        i1[y] = (x | (1 << st)) + 16 * bit;
      }
      lo_idx[st] = _mm512_load_si512(i0);
      hi_idx[st] = _mm512_load_si512(i1);
    }
  }
  void apply(__m512i* w) const {
    for (int st = 0; st < LOG; ++st)
      for (int r = 0; r < D; ++r)
        if (!(r & (1 << st))) {
          const __m512i a = w[r], b = w[r | (1 << st)];
          w[r] = _mm512_permutex2var_epi32(a, lo_idx[st], b);
          w[r | (1 << st)] = _mm512_permutex2var_epi32(a, hi_idx[st], b);
        }
  }
};

// rows_vnni for tiles of NT >= 2 rows of x (prefill): each block's weights are loaded and transposed once per
// tile (BlockTranspose), so every row's vpdpbusd products land directly in the lane of their group: no
// per-row folding. The same integer sums and the same float order as rows_vnni: the same bits.
template <int NT, int GB>
void rows_vnni_tiles(const QuantizedX& a, int64_t t0, const uint8_t* __restrict q, const float* __restrict scales,
                     int64_t half, int64_t ng, int64_t o, float* y, int64_t ystride) {
  constexpr int D = GB / 4;
  constexpr int64_t BLOCK = L * GB;
  static const BlockTranspose<GB> tr;
  const std::vector<__mmask64>& masks = chunk_masks(half, (ng + L - 1) / L * D);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const TileRows<NT> x(a, t0, true);
  for (int64_t r = 0; r < o; ++r) {
    const uint8_t* qr = q + r * half;
    const float* sr = scales + r * ng;
    __m512 accf[NT];
    for (int t = 0; t < NT; ++t) accf[t] = _mm512_setzero_ps();
    const __mmask64* mk = masks.data();
    for (int64_t g0 = 0, j0 = 0; g0 < ng; g0 += L, j0 += BLOCK, mk += D) {
      __m512i w[D], hi[D], lo[D];
      for (int c = 0; c < D; ++c) w[c] = _mm512_maskz_loadu_epi8(mk[c], qr + j0 + c * 64);
      tr.apply(w);
      for (int k = 0; k < D; ++k) {
        lo[k] = _mm512_and_si512(w[k], nib);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(w[k], 4), nib);
      }
      const int64_t left = ng - g0;
      const __mmask16 gm = left >= L ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      const __m512 sw = _mm512_maskz_loadu_ps(gm, sr + g0);
      for (int t = 0; t < NT; ++t) {
        __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
        for (int k = 0; k < D; ++k) {
          ah = _mm512_dpbusd_epi32(ah, hi[k], _mm512_loadu_si512(x.xe[t] + j0 + k * 64));
          al = _mm512_dpbusd_epi32(al, lo[k], _mm512_loadu_si512(x.xo[t] + j0 + k * 64));
        }
        const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(ah, al), _mm512_loadu_si512(x.corr[t] + g0));
        const __m512 c = _mm512_mul_ps(sw, _mm512_loadu_ps(x.sa[t] + g0));
        accf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), c, accf[t]);
      }
    }
    for (int t = 0; t < NT; ++t) y[t * ystride + r] = lane_sum(accf[t]);
  }
}

// All T >= 2 rows of x (prefill) against 16 weight rows at a time, rows in lanes: per block of 16 output rows
// and group g, the group's bytes of the 16 rows are gathered into registers (dword k of row r at lane r of
// register k, split into high and low nibbles) once, and every row t of x multiplies them there with its own
// dwords broadcast (vpdpbusd with a 4-byte operand: no 64-byte load of x per instruction, no per-row folding).
// Per row t and group g the integer sum is the same exact sum as rows_vnni's; it goes into accumulator
// g mod 16 of (t, the 16 rows) with the same multiply-add (float(isum) times sw[r, g] sa[t, g], groups in
// increasing order), and the 16 accumulators are added in lane_sum's tree: the same bits as rows_vnni.
template <int GB>
void rows_vnni_broadcast(const QuantizedX& a, int64_t T, const uint8_t* __restrict q, const float* __restrict scales,
                         int64_t half, int64_t ng, int64_t o, float* __restrict y, int64_t ldy) {
  constexpr int D = GB / 4;                                      // dwords of a group's bytes
  constexpr int DC = D < 8 ? D : 8;                              // dwords per pass (2 DC weight registers)
  thread_local std::vector<float> acc_buffer;                    // [T][16 accumulators][16 rows]
  thread_local std::vector<int32_t> isum_buffer;                 // [T][16 rows] (GB = 64: a group's first pass)
  acc_buffer.resize(static_cast<size_t>(T * L * L));
  isum_buffer.resize(static_cast<size_t>(T * L));
  float* __restrict acc = acc_buffer.data();                     // (thread_local reached once: no TLS call in the loops)
  int32_t* __restrict isums = isum_buffer.data();
  const int8_t* __restrict even = a.even.data();
  const int8_t* __restrict odd = a.odd.data();
  const int32_t* __restrict corr = a.corr.data();
  const float* __restrict sa = a.sa.data();
  const int64_t stride = a.stride, gstride = a.gstride;
  alignas(64) uint8_t rowbytes[L * GB];                          // the 16 rows' bytes of one group, zero-padded
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i lane_rows = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t r0 = 0; r0 < o; r0 += L) {
    const int64_t nr = std::min<int64_t>(L, o - r0);
    const __mmask16 rm = nr >= L ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
    std::fill(acc, acc + T * L * L, 0.0f);
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t j0 = g * GB, nbytes = std::min<int64_t>(GB, half - j0);
      // whole groups of 16 rows are gathered from the weights in place; a short block or group via a zero-padded copy
      const bool direct = nr == L && nbytes == GB;
      if (!direct) {
        std::memset(rowbytes, 0, sizeof rowbytes);
        for (int64_t r = 0; r < nr; ++r) std::memcpy(rowbytes + r * GB, q + (r0 + r) * half + j0, static_cast<size_t>(nbytes));
      }
      const uint8_t* base = direct ? q + r0 * half + j0 : rowbytes;
      const __m512i row_offsets = _mm512_mullo_epi32(lane_rows, _mm512_set1_epi32(static_cast<int>(direct ? half : GB)));
      const __m512 sw = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rm,
                                                 _mm512_mullo_epi32(lane_rows, _mm512_set1_epi32(static_cast<int>(ng))),
                                                 scales + r0 * ng + g, 4);
      for (int k0 = 0; k0 < D; k0 += DC) {
        __m512i hi[DC], lo[DC];
        for (int k = 0; k < DC; ++k) {
          const __m512i w = _mm512_i32gather_epi32(_mm512_add_epi32(row_offsets, _mm512_set1_epi32(4 * (k0 + k))), base, 1);
          hi[k] = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
          lo[k] = _mm512_and_si512(w, nib);
        }
        for (int64_t t = 0; t < T; ++t) {
          const int8_t* xe = even + t * stride + j0 + 4 * k0;
          const int8_t* xo = odd + t * stride + j0 + 4 * k0;
          __m512i s4[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
          for (int k = 0; k < DC; ++k) {                           // four chains: the integer sum is exact in any order
            int32_t de, dd;
            std::memcpy(&de, xe + 4 * k, 4);
            std::memcpy(&dd, xo + 4 * k, 4);
            s4[2 * (k & 1)] = _mm512_dpbusd_epi32(s4[2 * (k & 1)], hi[k], _mm512_set1_epi32(de));
            s4[2 * (k & 1) + 1] = _mm512_dpbusd_epi32(s4[2 * (k & 1) + 1], lo[k], _mm512_set1_epi32(dd));
          }
          __m512i sum = _mm512_add_epi32(_mm512_add_epi32(s4[0], s4[2]), _mm512_add_epi32(s4[1], s4[3]));
          if constexpr (DC < D) {      // GB = 64: the group's integer sum in two passes of 8 dwords, exact in int32
            int32_t* held = isums + t * L;
            if (k0 > 0) sum = _mm512_add_epi32(_mm512_loadu_si512(held), sum);
            if (k0 + DC < D) {
              _mm512_storeu_si512(held, sum);
              continue;
            }
          }
          const __m512i isum = _mm512_sub_epi32(sum, _mm512_set1_epi32(corr[t * gstride + g]));
          const __m512 c = _mm512_mul_ps(sw, _mm512_set1_ps(sa[t * gstride + g]));
          float* dst = acc + (t * L + g % L) * L;
          _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), c, _mm512_loadu_ps(dst)));
        }
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* v = acc + t * L * L;
      __m512 s8[8], s4[4];
      for (int l = 0; l < 8; ++l) s8[l] = _mm512_add_ps(_mm512_loadu_ps(v + l * L), _mm512_loadu_ps(v + (l + 8) * L));
      for (int l = 0; l < 4; ++l) s4[l] = _mm512_add_ps(s8[l], s8[l + 4]);
      const __m512 out = _mm512_add_ps(_mm512_add_ps(s4[0], s4[2]), _mm512_add_ps(s4[1], s4[3]));
      _mm512_mask_storeu_ps(y + t * ldy + r0, rm, out);
    }
  }
}
// All o output rows for rows t0 .. t0 + NT - 1 of x (groups of 16, 32 or 64 bytes).
template <int NT>
void rows(const QuantizedX& a, int64_t t0, const uint8_t* q, const float* s, int64_t half, int64_t gb, int64_t ng,
          int64_t o, float* y, int64_t ystride) {
  if (NT > 1) {
    switch (gb) {
      case 16: return rows_vnni_tiles<NT, 16>(a, t0, q, s, half, ng, o, y, ystride);
      case 32: return rows_vnni_tiles<NT, 32>(a, t0, q, s, half, ng, o, y, ystride);
      default: return rows_vnni_tiles<NT, 64>(a, t0, q, s, half, ng, o, y, ystride);
    }
  }
  if (t0 == 0 && ng <= L) {
    if (gb == 16) return row_vnni_block_in_registers<16>(a, q, s, half, ng, o, y);
    if (gb == 32) return row_vnni_block_in_registers<32>(a, q, s, half, ng, o, y);
  }
  switch (gb) {
    case 16: return rows_vnni<NT, 16>(a, t0, q, s, half, ng, o, y, ystride);
    case 32: return rows_vnni<NT, 32>(a, t0, q, s, half, ng, o, y, ystride);
    default: return rows_vnni<NT, 64>(a, t0, q, s, half, ng, o, y, ystride);
  }
}

// Whether linear() takes the broadcast kernel (rows in lanes) for T rows of x and groups of gb bytes.
inline bool broadcast(int64_t T, int64_t gb) { return (T >= 10 && (gb == 16 || gb == 32)) || (T > 1 && gb == 64); }

// What linear() needs of a besides the quantized x: the tiles' transposed copy (before the rows are split
// over threads: linear() only reads a).
void prepare(QuantizedX& a, int64_t T, int64_t gb) {
  if ((gb == 16 || gb == 32 || gb == 64) && T > 1 && !broadcast(T, gb)) a.transposed(T, gb);
}

// The AVX-512 VNNI path of toolchain_int4_linear_a8 after x is quantized (a, prepare()d): the o rows of y (row
// stride ldy; any block of weight rows, its scales and outputs). False for groups it has no kernel for (other
// than 32, 64 or 128 columns), which the generic rows then take.
bool linear(const QuantizedX& a, int64_t T, const uint8_t* q, const float* scales, int64_t half, int64_t gb,
            int64_t ng, int64_t o, float* y, int64_t ldy) {
  if (gb != 16 && gb != 32 && gb != 64) return false;
  if (broadcast(T, gb)) {   // where it beats the tiles (docs/benchmarks.md)
    switch (gb) {
      case 16: rows_vnni_broadcast<16>(a, T, q, scales, half, ng, o, y, ldy); return true;
      case 32: rows_vnni_broadcast<32>(a, T, q, scales, half, ng, o, y, ldy); return true;
      default: rows_vnni_broadcast<64>(a, T, q, scales, half, ng, o, y, ldy); return true;
    }
  }
  for (int64_t t0 = 0; t0 < T; t0 += TT) {
    float* yt = y + t0 * ldy;
    switch (std::min(TT, T - t0)) {
      case 4: rows<4>(a, t0, q, scales, half, gb, ng, o, yt, ldy); break;
      case 3: rows<3>(a, t0, q, scales, half, gb, ng, o, yt, ldy); break;
      case 2: rows<2>(a, t0, q, scales, half, gb, ng, o, yt, ldy); break;
      default: rows<1>(a, t0, q, scales, half, gb, ng, o, yt, ldy); break;
    }
  }
  return true;
}

// toolchain_int4_dyw_a8's product for one panel of 16 columns k of dx (kernels.cpp: dyw_panel_generic has the
// definition and the layout): the panel's int8 W^T bytes, packed flipped (w + 128: vpdpbusd's unsigned operand),
// are loaded into registers once per block of G n (in passes of up to 16 dwords: G = 128 takes two, the first
// pass's sums held in int32), and every row t of dy multiplies them with its 4-byte dwords broadcast (no per-row
// folding, lanes = the panel's 16 columns). Per (t, block) the exact sum of (w + 128) a minus 128 sum a (16 corr)
// is float(isum) times (sa[t, b] swt[b, lane]) added to lane's accumulator by a fused multiply-add, blocks in
// increasing order: the generic path's integer sums, products and order, so its bits.
template <int G>
void dyw_panel(const int8_t* __restrict ab, const float* __restrict sa, const int32_t* __restrict corr, int64_t T,
               int64_t nb, const uint8_t* __restrict wp, const float* __restrict swp, const float* add, float* dx,
               int64_t ldx, int64_t nk) {
  constexpr int D = G / 4;                                       // dwords per block (and bytes of a block's row / 4)
  constexpr int DC = D < 16 ? D : 16;                            // dwords per pass
  thread_local std::vector<float> acc_buffer;
  thread_local std::vector<int32_t> held_buffer;
  acc_buffer.assign(static_cast<size_t>(T * L), 0.0f);
  held_buffer.resize(static_cast<size_t>(T * L));
  float* __restrict acc = acc_buffer.data();
  int32_t* __restrict held = held_buffer.data();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 sw = _mm512_loadu_ps(swp + b * L);
    for (int d0 = 0; d0 < D; d0 += DC) {
      __m512i w[DC];
      for (int d = 0; d < DC; ++d) w[d] = _mm512_loadu_si512(wp + (b * D + d0 + d) * 64);
      for (int64_t t = 0; t < T; ++t) {
        const int8_t* x = ab + (b * T + t) * G;                   // the rows of block b, in order
        __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int d = 0; d < DC; ++d) {                            // four chains: the integer sum is exact in any order
          int32_t v;
          std::memcpy(&v, x + 4 * (d0 + d), 4);
          s[d & 3] = _mm512_dpbusd_epi32(s[d & 3], w[d], _mm512_set1_epi32(v));
        }
        __m512i sum = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
        if constexpr (DC < D) {        // G = 128: the block's integer sum in two passes, exact in int32
          if (d0 > 0) sum = _mm512_add_epi32(_mm512_loadu_si512(held + t * L), sum);
          if (d0 + DC < D) {
            _mm512_storeu_si512(held + t * L, sum);
            continue;
          }
        }
        const __m512i isum = _mm512_sub_epi32(sum, _mm512_set1_epi32(16 * corr[b * T + t]));
        const __m512 c = _mm512_mul_ps(_mm512_set1_ps(sa[b * T + t]), sw);
        float* dst = acc + t * L;
        _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), c, _mm512_loadu_ps(dst)));
      }
    }
  }
  const __mmask16 km = nk >= L ? __mmask16(0xFFFF) : __mmask16((1u << nk) - 1);
  if (add == nullptr) {
    for (int64_t t = 0; t < T; ++t) _mm512_mask_storeu_ps(dx + t * ldx, km, _mm512_loadu_ps(acc + t * L));
  } else {   // toolchain_int4_dyw_a8_acc: dx = add + the chain (add the first operand: one rounding)
    for (int64_t t = 0; t < T; ++t)
      _mm512_mask_storeu_ps(dx + t * ldx, km, _mm512_add_ps(_mm512_maskz_loadu_ps(km, add + t * ldx),
                                                            _mm512_loadu_ps(acc + t * L)));
  }
}

// The AVX-512 VNNI panel product for groups of 32, 64 or 128 (false: the generic one).
bool dyw_panel_of(int64_t group, const int8_t* ab, const float* sa, const int32_t* corr, int64_t T, int64_t nb,
                  const uint8_t* wp, const float* swp, const float* add, float* dx, int64_t ldx, int64_t nk) {
  switch (group) {
    case 32: dyw_panel<32>(ab, sa, corr, T, nb, wp, swp, add, dx, ldx, nk); return true;
    case 64: dyw_panel<64>(ab, sa, corr, T, nb, wp, swp, add, dx, ldx, nk); return true;
    case 128: dyw_panel<128>(ab, sa, corr, T, nb, wp, swp, add, dx, ldx, nk); return true;
    default: return false;
  }
}

}  // namespace x86_avx512
TOOLCHAIN_TARGET_POP

// ---------------------------------------------------------------------------------------------------------------
// toolchain_int4_dyw_a8's packing of W^T in int8 (kernels.cpp: dyw_pack_scalar has the layout) for a block of G n
// wholly inside [0, o) and a panel of 16 columns k0 .. k0 + 15 inside one k-group (G a multiple of 16): per n,
// W's 8 bytes of the panel split into 16 nibbles (in column order) and looked up in the row's table of 16 int8
// values (pshufb), then 4 consecutive n interleaved into the 16 lanes' dwords. The scalar loop's bytes.
TOOLCHAIN_TARGET_PUSH("ssse3")
namespace x86_ssse3 {
void dyw_pack_block(const uint8_t* __restrict q, int64_t half, int64_t k0, int64_t n0, int64_t G,
                    const int8_t* __restrict lut, uint8_t flip, uint8_t* __restrict dst) {
  const __m128i m4 = _mm_set1_epi8(0x0F), fl = _mm_set1_epi8(static_cast<char>(flip));
  for (int64_t m = 0; m < G; m += 4) {   // 4 consecutive n: one dword of the 16 lanes (the halves' dwords in order)
    __m128i v[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + m + i;
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + n * half + k0 / 2));
      const __m128i idx = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m4), _mm_and_si128(x, m4));
      v[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lut + n * 16)), idx);
    }
    const __m128i a = _mm_unpacklo_epi8(v[0], v[1]), b = _mm_unpackhi_epi8(v[0], v[1]);
    const __m128i c = _mm_unpacklo_epi8(v[2], v[3]), d = _mm_unpackhi_epi8(v[2], v[3]);
    __m128i* out = reinterpret_cast<__m128i*>(dst + (m / 4) * 64);
    _mm_storeu_si128(out, _mm_xor_si128(_mm_unpacklo_epi16(a, c), fl));       // lanes 0..3
    _mm_storeu_si128(out + 1, _mm_xor_si128(_mm_unpackhi_epi16(a, c), fl));   // lanes 4..7
    _mm_storeu_si128(out + 2, _mm_xor_si128(_mm_unpacklo_epi16(b, d), fl));   // lanes 8..11
    _mm_storeu_si128(out + 3, _mm_xor_si128(_mm_unpackhi_epi16(b, d), fl));   // lanes 12..15
  }
}
}  // namespace x86_ssse3
TOOLCHAIN_TARGET_POP


// ---------------------------------------------------------------------------------------------------------------
// The templates every x86 path instantiates (below), each compiled in its path's target region: pass 1 avx512_vnni
// (fold_blocks over 512-bit Lanes16), pass 2 avx2 and pass 3 avx_vnni (fold_blocks over 256-bit Lanes16, the
// 256-bit row kernels over their PairDot).
#define TOOLCHAIN_X86_PASS 1
#include "kernels_x86.h"
#undef TOOLCHAIN_X86_PASS
#define TOOLCHAIN_X86_PASS 2
#include "kernels_x86.h"
#undef TOOLCHAIN_X86_PASS
#define TOOLCHAIN_X86_PASS 3
#include "kernels_x86.h"
#undef TOOLCHAIN_X86_PASS

#endif  // TOOLCHAIN_KERNELS_X86_H
#else   // TOOLCHAIN_X86_PASS: the templates, instantiated for one path

#if TOOLCHAIN_X86_PASS == 1
TOOLCHAIN_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")
namespace x86_avx512 {
// 16 float32 (F) or int32 (I) lanes in one 512-bit register: the vector operations fold_blocks needs.
struct Lanes16 {
  using F = __m512;
  using I = __m512i;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F splat(float v) { return _mm512_set1_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F abs(F a) { return _mm512_and_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF))); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static bool any_nan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0; }
  static float max_lane(F a) { return _mm512_reduce_max_ps(a); }
  static I to_int(F r) { return _mm512_cvtps_epi32(r); }
  static I to_int_or_zero(F q, F r) { return _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), r); }
  static I izero() { return _mm512_setzero_si512(); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static int32_t sum(I a) { return _mm512_reduce_add_epi32(a); }
  static void store_bytes(int8_t* dst, I a) {   // the 16 lanes (each in [-127, 127]) as 16 bytes
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(a));
  }
};
#elif TOOLCHAIN_X86_PASS == 2
TOOLCHAIN_TARGET_PUSH("avx2,fma")
namespace x86_avx2 {
// acc + the products of 4-byte groups: unsigned nibbles hi, lo (0..15) times int8 xe, xo. Kept as int16 pair sums
// (at most 3810 per vpmaddubsw lane: up to 4 calls, 8 products of 2, stay below 32767); dwords() adds the pairs.
struct PairDot {
  static __m256i pair(__m256i acc, __m256i hi, __m256i xe, __m256i lo, __m256i xo) {
    return _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(hi, xe), _mm256_maddubs_epi16(lo, xo)));
  }
  static __m256i dwords(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
  // two such sums of at most 4 pair() calls in all (8 vpmaddubsw lanes: at most 30480), still in int16
  static __m256i add(__m256i a, __m256i b) { return _mm256_add_epi16(a, b); }
};
#else
TOOLCHAIN_TARGET_PUSH("avx2,fma,avxvnni")
namespace x86_avx_vnni {
// acc + the products of 4-byte groups, as int32 dwords (vpdpbusd: unsigned bytes times signed bytes).
struct PairDot {
  static __m256i pair(__m256i acc, __m256i hi, __m256i xe, __m256i lo, __m256i xo) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, hi, xe), lo, xo);
  }
  static __m256i dwords(__m256i acc) { return acc; }
  static __m256i add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
};
#endif

#if TOOLCHAIN_X86_PASS >= 2
// 16 float32 (F) or int32 (I) lanes in two 256-bit registers (lanes 0..7, 8..15): x86_avx512's Lanes16 in 256 bits.
struct Lanes16 {
  struct F {
    __m256 lo, hi;
  };
  struct I {
    __m256i lo, hi;
  };
  static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F splat(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F div(F a, F b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
  static F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static F max(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static F min(F a, F b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
  static F abs(F a) {
    const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
  }
  static F round(F a) {
    return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
            _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
  }
  static bool any_nan(F a) {
    return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q), _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q))) != 0;
  }
  static float max_lane(F a) {
    const __m256 m8 = _mm256_max_ps(a.lo, a.hi);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static I to_int(F r) { return {_mm256_cvtps_epi32(r.lo), _mm256_cvtps_epi32(r.hi)}; }
  static I to_int_or_zero(F q, F r) {
    return {_mm256_and_si256(_mm256_cvtps_epi32(r.lo), _mm256_castps_si256(_mm256_cmp_ps(q.lo, q.lo, _CMP_ORD_Q))),
            _mm256_and_si256(_mm256_cvtps_epi32(r.hi), _mm256_castps_si256(_mm256_cmp_ps(q.hi, q.hi, _CMP_ORD_Q)))};
  }
  static I izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static I add(I a, I b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
  static int32_t sum(I a) {
    const __m256i s8 = _mm256_add_epi32(a.lo, a.hi);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1)));
  }
  static void store_bytes(int8_t* dst, I a) {   // the 16 lanes (each in [-127, 127]) as 16 bytes, in order
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), 0xD8);   // 16 int16, in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
  }
};

// lane_sum's tree on 16 lanes held as lanes 0..7 (lo) and 8..15 (hi): (l, l + 8), (l, l + 4), (0 + 2) + (1 + 3).
inline float lane_sum(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 t = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// One group of columns k0 .. k1 - 1 (a multiple of 16) of row t, 16 at a time: the scalar loop's values (the same
// max, the same IEEE division and round-to-nearest-even, NaN to 0, the same clamp), stored as its even / odd bytes.
void group16(QuantizedX& x, const float* xt, int64_t k0, int64_t k1, int64_t t, int64_t g) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 amax = _mm256_setzero_ps(), nanv = _mm256_setzero_ps();
  for (int64_t k = k0; k < k1; k += 8) {
    const __m256 v = _mm256_and_ps(_mm256_loadu_ps(xt + k), absmask);
    nanv = _mm256_or_ps(nanv, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    amax = _mm256_max_ps(amax, v);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float s = _mm256_movemask_ps(nanv) ? NAN : _mm_cvtss_f32(m) / 127.0f;
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256i sum = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; k += 16) {
    __m256i a[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    if (s > 0.0f) {
      for (int h = 0; h < 2; ++h) {
        const __m256 q = _mm256_div_ps(_mm256_loadu_ps(xt + k + 8 * h), _mm256_set1_ps(s));
        __m256 r = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), r));
        a[h] = _mm256_and_si256(_mm256_cvtps_epi32(r), _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_ORD_Q)));
      }
    }
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(a[0], a[1]));
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a[0], a[1]), 0xD8);   // 16 int16, in order
    const __m128i bytes = _mm_shuffle_epi8(_mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)),
                                           split);                                    // 8 even, then 8 odd
    _mm_storel_epi64(reinterpret_cast<__m128i*>(&x.even[static_cast<size_t>(t * x.stride + k / 2)]), bytes);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(&x.odd[static_cast<size_t>(t * x.stride + k / 2)]),
                     _mm_unpackhi_epi64(bytes, bytes));
  }
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
  x.sa[static_cast<size_t>(t * x.gstride + g)] = s;
  x.corr[static_cast<size_t>(t * x.gstride + g)] = 8 * _mm_cvtsi128_si32(s4);
}

// 32 bytes of a weight row from byte j: zeros past the row's end (half bytes).
inline __m256i row_chunk(const uint8_t* qr, int64_t j, int64_t half) {
  if (j + 32 <= half) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr + j));
  alignas(32) uint8_t tmp[32] = {};
  if (j < half) std::memcpy(tmp, qr + j, static_cast<size_t>(half - j));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
}

// 8 group sums in order from 8 vectors of 8 dword partial sums (v[i]: group i).
inline __m256i hsum8(const __m256i* v) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));  // g0..3 | g0..3
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));  // g4..7 | g4..7
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// 8 group sums in order from 4 vectors holding two groups each (v[i]: group 2i in the low 4 dwords, 2i + 1 in the
// high ones).
inline __m256i hsum8_pairs(const __m256i* v) {
  const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));  // g0 2 4 6 | 1 3 5 7
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The first n of 8 float lanes (the rest 0), for partial loads and stores.
inline __m256i lane_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// All o output rows for rows t0 .. t0 + NT - 1 of x (decode: NT = 1; prefill tiles: 2..4), groups of GB = 16, 32
// or 64 bytes. Per weight row and block of 16 groups, in two halves of 8 groups: the half's 32-byte chunks are
// split into nibbles once and multiplied by every row of x (Dot::pair), the dwords of each group folded into its
// sum (hsum8 / hsum8_pairs), the nibble correction subtracted, and float(isum) * (sw * sa) added to lanes g mod 16
// by fma: row_generic's integer sums and float order.
template <class Dot, int NT, int GB>
void rows(const QuantizedX& a, int64_t t0, const uint8_t* __restrict q, const float* __restrict scales, int64_t half,
          int64_t ng, int64_t o, float* y, int64_t ystride) {
  constexpr int NG = GB == 16 ? 4 : 8;                           // dword vectors per half block (hsum8_pairs / hsum8)
  constexpr int CPG = GB == 64 ? 2 : 1;                          // chunks per vector
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const int8_t* xe[NT];
  const int8_t* xo[NT];
  const int32_t* corr[NT];
  const float* sa[NT];
  for (int t = 0; t < NT; ++t) {
    xe[t] = a.even.data() + (t0 + t) * a.stride;
    xo[t] = a.odd.data() + (t0 + t) * a.stride;
    corr[t] = a.corr.data() + (t0 + t) * a.gstride;
    sa[t] = a.sa.data() + (t0 + t) * a.gstride;
  }
  for (int64_t r = 0; r < o; ++r) {
    const uint8_t* qr = q + r * half;
    const float* sr = scales + r * ng;
    if (r + 2 < o) {                                              // the row after next, into L2
      for (int64_t b = 0; b < half; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qr + 2 * half + b), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(sr + 2 * ng), _MM_HINT_T1);
    }
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < ng; g0 += 8) {                     // half blocks of 8 groups
      const int64_t j0 = g0 * GB;
      __m256i v[NT][NG];
      for (int i = 0; i < NG; ++i) {
        __m256i s[NT];
        for (int t = 0; t < NT; ++t) s[t] = _mm256_setzero_si256();
        for (int c = 0; c < CPG; ++c) {
          const int64_t j = j0 + (i * CPG + c) * 32;
          const __m256i w = row_chunk(qr, j, half);
          const __m256i lo = _mm256_and_si256(w, nib), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
          for (int t = 0; t < NT; ++t)
            s[t] = Dot::pair(s[t], hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xe[t] + j)), lo,
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xo[t] + j)));
        }
        for (int t = 0; t < NT; ++t) v[t][i] = Dot::dwords(s[t]);
      }
      const int64_t left = ng - g0;
      const __m256 sw = left >= 8 ? _mm256_loadu_ps(sr + g0) : _mm256_maskload_ps(sr + g0, lane_mask(left));
      const int h = static_cast<int>((g0 / 8) & 1);              // lanes 0..7 or 8..15 of the 16
      for (int t = 0; t < NT; ++t) {
        const __m256i sums = GB == 16 ? hsum8_pairs(v[t]) : hsum8(v[t]);
        const __m256i isum = _mm256_sub_epi32(sums, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr[t] + g0)));
        const __m256 c = _mm256_mul_ps(sw, _mm256_loadu_ps(sa[t] + g0));
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), c, acc[t][h]);
      }
    }
    for (int t = 0; t < NT; ++t) y[t * ystride + r] = lane_sum(acc[t][0], acc[t][1]);
  }
}

// All T >= 2 rows of x (prefill) against 8 weight rows at a time, rows in lanes (x86_avx512's rows_vnni_broadcast
// in 256 bits): per block of 16 output rows, group g and 8 rows, the group's dwords of the 8 rows are gathered
// into registers (4 dwords per pass, split into nibbles) once, and every row t of x multiplies them with its own
// dwords broadcast. The group's exact integer sum per (t, row) goes into accumulator g mod 16 of (t, row) with
// the same fma (float(isum) times sw[r, g] sa[t, g], groups in increasing order), and the 16 accumulators are
// added in lane_sum's tree: row_generic's bits.
template <class Dot, int GB>
void rows_broadcast(const QuantizedX& a, int64_t T, const uint8_t* __restrict q, const float* __restrict scales,
                    int64_t half, int64_t ng, int64_t o, float* __restrict y, int64_t ldy) {
  constexpr int D = GB / 4;                                      // dwords of a group's bytes
  constexpr int DC = 4;                                          // dwords per pass (8 vpmaddubsw into int16 at most)
  thread_local std::vector<float> acc_buffer;                    // [16 accumulators][T][16 rows]
  thread_local std::vector<int32_t> isum_buffer;                 // [T][8 rows] (GB > 16: a group's earlier passes)
  thread_local std::vector<int8_t> xg_buffer;                    // [ng][T][2 GB]: x's bytes group-major
  thread_local std::vector<int32_t> cg_buffer;                   // [ng][T]: corr
  thread_local std::vector<float> sg_buffer;                     // [ng][T]: sa
  acc_buffer.resize(static_cast<size_t>(T * L * L));
  isum_buffer.resize(static_cast<size_t>(T * 8));
  xg_buffer.resize(static_cast<size_t>(ng * T * 2 * GB));
  cg_buffer.resize(static_cast<size_t>(ng * T));
  sg_buffer.resize(static_cast<size_t>(ng * T));
  float* __restrict acc = acc_buffer.data();
  int32_t* __restrict isums = isum_buffer.data();
  int8_t* __restrict xg = xg_buffer.data();
  int32_t* __restrict corr = cg_buffer.data();
  float* __restrict sa = sg_buffer.data();
  // x's rows are a.stride bytes apart (whole blocks of 1 KiB: 1024 or 3072 bytes at 0.5B), so the loop over t below,
  // reading a few bytes of each row, would hit 4 of L1's 64 sets; group-major, a group's bytes of every row are
  // consecutive (row t's even then odd bytes), read in order, and the accumulators likewise ([16][T][16]).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < ng; ++g) {   // the padded rows hold whole groups (zeros past the row's end)
      std::memcpy(xg + (g * T + t) * 2 * GB, a.even.data() + t * a.stride + g * GB, GB);
      std::memcpy(xg + (g * T + t) * 2 * GB + GB, a.odd.data() + t * a.stride + g * GB, GB);
      corr[g * T + t] = a.corr[static_cast<size_t>(t * a.gstride + g)];
      sa[g * T + t] = a.sa[static_cast<size_t>(t * a.gstride + g)];
    }
  alignas(32) uint8_t rowbytes[L * GB];                          // the 16 rows' bytes of one group, zero-padded
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t r0 = 0; r0 < o; r0 += L) {
    const int64_t nr = std::min<int64_t>(L, o - r0);
    std::fill(acc, acc + T * L * L, 0.0f);
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t j0 = g * GB, nbytes = std::min<int64_t>(GB, half - j0);
      const bool direct = nr == L && nbytes == GB;               // else a zero-padded copy of the short block or group
      if (!direct) {
        std::memset(rowbytes, 0, sizeof rowbytes);
        for (int64_t r = 0; r < nr; ++r) std::memcpy(rowbytes + r * GB, q + (r0 + r) * half + j0, static_cast<size_t>(nbytes));
      }
      const uint8_t* base = direct ? q + r0 * half + j0 : rowbytes;
      const int rs = static_cast<int>(direct ? half : GB);
      for (int h = 0; h < 2 && 8 * h < nr; ++h) {                 // rows r0 + 8h .. r0 + 8h + 7
        const __m256i offsets = _mm256_mullo_epi32(_mm256_add_epi32(lanes, _mm256_set1_epi32(8 * h)), _mm256_set1_epi32(rs));
        const __m256i rm = lane_mask(nr - 8 * h);
        const __m256 sw = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), scales + (r0 + 8 * h) * ng + g,
                                                   _mm256_mullo_epi32(lanes, _mm256_set1_epi32(static_cast<int>(ng))),
                                                   _mm256_castsi256_ps(rm), 4);
        for (int k0 = 0; k0 < D; k0 += DC) {
          __m256i hi[DC], lo[DC];
          for (int k = 0; k < DC; ++k) {
            const __m256i w = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base),
                                                     _mm256_add_epi32(offsets, _mm256_set1_epi32(4 * (k0 + k))), 1);
            hi[k] = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
            lo[k] = _mm256_and_si256(w, nib);
          }
          for (int64_t t = 0; t < T; ++t) {
            const int8_t* xe = xg + (g * T + t) * 2 * GB + 4 * k0;
            const int8_t* xo = xe + GB;
            __m256i s2[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};   // two chains (exact in any order)
            for (int k = 0; k < DC; ++k) {
              int32_t de, dd;
              std::memcpy(&de, xe + 4 * k, 4);
              std::memcpy(&dd, xo + 4 * k, 4);
              s2[k & 1] = Dot::pair(s2[k & 1], hi[k], _mm256_set1_epi32(de), lo[k], _mm256_set1_epi32(dd));
            }
            __m256i sum = Dot::dwords(Dot::add(s2[0], s2[1]));   // the DC dwords' sums: one widening
            if constexpr (DC < D) {                               // the group's integer sum over D / DC passes
              int32_t* held = isums + t * 8;
              if (k0 > 0) sum = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(held)), sum);
              if (k0 + DC < D) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(held), sum);
                continue;
              }
            }
            const __m256i isum = _mm256_sub_epi32(sum, _mm256_set1_epi32(corr[g * T + t]));
            const __m256 c = _mm256_mul_ps(sw, _mm256_set1_ps(sa[g * T + t]));
            float* dst = acc + ((g % L) * T + t) * L + 8 * h;
            _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), c, _mm256_loadu_ps(dst)));
          }
        }
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int h = 0; h < 2 && 8 * h < nr; ++h) {
        const float* v = acc + t * L + 8 * h;                     // accumulator l at v + l T L
        __m256 s8[8], s4[4];
        for (int l = 0; l < 8; ++l) s8[l] = _mm256_add_ps(_mm256_loadu_ps(v + l * T * L), _mm256_loadu_ps(v + (l + 8) * T * L));
        for (int l = 0; l < 4; ++l) s4[l] = _mm256_add_ps(s8[l], s8[l + 4]);
        const __m256 out = _mm256_add_ps(_mm256_add_ps(s4[0], s4[2]), _mm256_add_ps(s4[1], s4[3]));
        _mm256_maskstore_ps(y + t * ldy + r0 + 8 * h, lane_mask(nr - 8 * h), out);
      }
    }
  }
}

// This path's toolchain_int4_linear_a8 after x is quantized (a): the o rows of y (row stride ldy; any block of
// weight rows, its scales and outputs). False for groups it has no kernel for (other than 32, 64 or 128 columns),
// which the generic rows then take.
bool linear(const QuantizedX& a, int64_t T, const uint8_t* q, const float* scales, int64_t half, int64_t gb,
            int64_t ng, int64_t o, float* y, int64_t ldy) {
  if (gb != 16 && gb != 32 && gb != 64) return false;
  if (T >= YMM_BROADCAST_T) {
    switch (gb) {
      case 16: rows_broadcast<PairDot, 16>(a, T, q, scales, half, ng, o, y, ldy); return true;
      case 32: rows_broadcast<PairDot, 32>(a, T, q, scales, half, ng, o, y, ldy); return true;
      default: rows_broadcast<PairDot, 64>(a, T, q, scales, half, ng, o, y, ldy); return true;
    }
  }
  for (int64_t t0 = 0; t0 < T; t0 += TT) {
    float* yt = y + t0 * ldy;
    const int64_t nt = std::min(TT, T - t0);
#define TOOLCHAIN_YMM_ROWS(NT)                                                              \
    switch (gb) {                                                                           \
      case 16: rows<PairDot, NT, 16>(a, t0, q, scales, half, ng, o, yt, ldy); break;             \
      case 32: rows<PairDot, NT, 32>(a, t0, q, scales, half, ng, o, yt, ldy); break;             \
      default: rows<PairDot, NT, 64>(a, t0, q, scales, half, ng, o, yt, ldy); break;             \
    }
    if (nt == 4) { TOOLCHAIN_YMM_ROWS(4) }
    else if (nt == 3) { TOOLCHAIN_YMM_ROWS(3) }
    else if (nt == 2) { TOOLCHAIN_YMM_ROWS(2) }
    else { TOOLCHAIN_YMM_ROWS(1) }
#undef TOOLCHAIN_YMM_ROWS
  }
  return true;
}
#endif  // TOOLCHAIN_X86_PASS >= 2

// toolchain_int4_dyw_a8's rounding of row t: u = dy * s (the scale column of a k-group) quantized per block of G
// consecutive n, the blocks wholly inside [0, o) (the rest: kernels.cpp's fold_blocks_scalar), computed in registers
// without storing u, in the block's halves layout (the first G / 2 values are the block's `even` bytes, the others
// its `odd` ones: kernels.cpp's dyw_block), 16 lanes at a time (the path's Lanes16: one 512-bit or two 256-bit
// registers). The same values as the scalar loop: the same float32 products, max, IEEE division,
// round-to-nearest-even, NaN to 0 and clamp. Returns the blocks done.
template <int G>
int64_t fold_blocks(QuantizedX& x, const float* __restrict dy, const float* __restrict s, int64_t o, int64_t t) {
  using V = Lanes16;
  constexpr int U = G / 16;                                      // units of 16 lanes per block
  const int64_t nb = o / G;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t n0 = b * G;
    typename V::F v[U];
    typename V::F amax = V::splat(0.0f), z = V::splat(0.0f);     // z: NaN iff some u is not finite (u * 0)
    for (int j = 0; j < U; ++j) {
      v[j] = V::mul(V::load(dy + n0 + 16 * j), V::load(s + n0 + 16 * j));
      amax = V::max(amax, V::abs(v[j]));
      z = V::fma(v[j], V::splat(0.0f), z);
    }
    // a NaN or an infinity: sa = NaN (kernels.cpp: fold_blocks_scalar)
    const float sa = V::any_nan(z) ? NAN : V::max_lane(amax) / 127.0f;
    typename V::I sum = V::izero();
    int8_t* even = &x.even[static_cast<size_t>(t * x.stride + n0 / 2)];
    int8_t* odd = &x.odd[static_cast<size_t>(t * x.stride + n0 / 2)];
    if (sa >= 0x1p-126f) {   // sa normal: |u / sa| < 127 + 2^-17, so round(u / sa) is in [-127, 127] (no clamp)
      const typename V::F sv = V::splat(sa);   // and u is finite (no NaN to zero)
      for (int j = 0; j < U; ++j) {
        const typename V::I a = V::to_int(V::round(V::div(v[j], sv)));
        sum = V::add(sum, a);
        V::store_bytes(j < U / 2 ? even + 16 * j : odd + 16 * (j - U / 2), a);   // the block's halves
      }
    } else if (sa > 0.0f) {   // subnormal: the scalar loop's clamp
      const typename V::F sv = V::splat(sa);
      for (int j = 0; j < U; ++j) {
        const typename V::F q = V::div(v[j], sv);
        const typename V::F r = V::min(V::splat(127.0f), V::max(V::splat(-127.0f), V::round(q)));
        const typename V::I a = V::to_int_or_zero(q, r);
        sum = V::add(sum, a);
        V::store_bytes(j < U / 2 ? even + 16 * j : odd + 16 * (j - U / 2), a);
      }
    } else {
      std::memset(even, 0, G / 2);
      std::memset(odd, 0, G / 2);
    }
    x.sa[static_cast<size_t>(t * x.gstride + b)] = sa;
    x.corr[static_cast<size_t>(t * x.gstride + b)] = 8 * V::sum(sum);
  }
  return nb;
}

int64_t fold_row(QuantizedX& x, const float* dy, const float* s, int64_t o, int64_t group, int64_t t) {
  switch (group) {
    case 32: return fold_blocks<32>(x, dy, s, o, t);
    case 64: return fold_blocks<64>(x, dy, s, o, t);
    case 128: return fold_blocks<128>(x, dy, s, o, t);
    default: return 0;
  }
}


#if TOOLCHAIN_X86_PASS >= 2
#if TOOLCHAIN_X86_PASS == 3
// toolchain_int4_dyw_a8's product for one panel of 16 columns k of dx (avx_vnni): the AVX-512 dyw_panel in 256 bits
// (lanes 0..7 and 8..15 in two registers). Per row t and block, the block's dwords of the panel (1 KiB for G = 64:
// L1) are multiplied by t's dwords broadcast by vpdpbusd, the bytes packed flipped (w + 128, its unsigned operand;
// minus 128 sum a = 16 corr). The generic path's bits.
template <int G>
void dyw_panel(const int8_t* __restrict ab, const float* __restrict sa, const int32_t* __restrict corr, int64_t T,
               int64_t nb, const uint8_t* __restrict wp, const float* __restrict swp, const float* add, float* dx,
               int64_t ldx, int64_t nk) {
  constexpr int D = G / 4;
  thread_local std::vector<float> acc_buffer;
  acc_buffer.assign(static_cast<size_t>(T * L), 0.0f);
  float* __restrict acc = acc_buffer.data();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256 sw0 = _mm256_loadu_ps(swp + b * L), sw1 = _mm256_loadu_ps(swp + b * L + 8);
    const uint8_t* wb = wp + b * D * 64;
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* x = ab + (b * T + t) * G;                     // the rows of block b, in order
      __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int d = 0; d < D; ++d) {
        int32_t v;
        std::memcpy(&v, x + 4 * d, 4);
        const __m256i av = _mm256_set1_epi32(v);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + d * 64));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + d * 64 + 32));
        s[d & 1] = _mm256_dpbusd_avx_epi32(s[d & 1], w0, av);
        s[2 + (d & 1)] = _mm256_dpbusd_avx_epi32(s[2 + (d & 1)], w1, av);
      }
      __m256i lo = _mm256_add_epi32(s[0], s[1]), hi = _mm256_add_epi32(s[2], s[3]);
      const __m256i c16 = _mm256_set1_epi32(16 * corr[b * T + t]);
      lo = _mm256_sub_epi32(lo, c16);
      hi = _mm256_sub_epi32(hi, c16);
      const __m256 sv = _mm256_set1_ps(sa[b * T + t]);
      float* dst = acc + t * L;
      _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(sv, sw0), _mm256_loadu_ps(dst)));
      _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(sv, sw1), _mm256_loadu_ps(dst + 8)));
    }
  }
  for (int64_t t = 0; t < T; ++t)   // toolchain_int4_dyw_a8_acc: dx = add + the chain (one rounding)
    for (int64_t r = 0; r < nk; ++r) dx[t * ldx + r] = add == nullptr ? acc[t * L + r] : add[t * ldx + r] + acc[t * L + r];
}

#else
// toolchain_int4_dyw_a8's product for one panel of 16 columns k of dx (avx2). int8 x int8 has no unsigned operand
// for vpmaddubsw (its sign trick, |a| times sign(a) w, took abs + 2 sign + 2 vpmaddubsw + 2 vpmaddwd per 64
// products: 36 GMAC/s), so the products are int16 ones: per block, the panel's packed bytes (signed, flip 0) are
// widened once to int16 pairs (w16: per pair p of the block's reduction index, 16 lanes of 2 int16, the lanes in
// the register order below), and per NR rows of dy at a time each row's block bytes are widened to int16
// and its pairs broadcast: vpmaddwd (two exact products of at most 127 * 127 added in int32) + vpaddd per 16
// products, each weight load shared by the NR rows. The integer sums are exact, so isum is the generic one; then
// float(isum) times (sa[t, b] swt[b, lane]) into the lane's accumulator by one fused multiply-add per block, blocks
// in increasing order: the generic path's bits (the lanes only sit in another register order until the store:
// position i of a register holds lane perm[i] = (0, 1, 4, 5, 2, 3, 6, 7)[i] of its 8, what cvtepi8_epi16,
// shuffle_epi32 and unpack*_epi64 leave; the permutation is its own inverse, so one permute restores the order).
template <int G, int NR>
inline void dyw_rows_i16(const int8_t* __restrict ab, const float* __restrict sa, int64_t T, int64_t b, int64_t t,
                         const int16_t* __restrict w16, __m256 sw0, __m256 sw1, float* __restrict acc) {
  constexpr int P = G / 2;                                       // int16 pairs per block row
  alignas(32) int16_t a16[NR][G];
  for (int r = 0; r < NR; ++r) {
    const int8_t* x = ab + (b * T + t + r) * G;                  // the rows of block b, in order
    for (int u = 0; u < G / 16; ++u)
      _mm256_store_si256(reinterpret_cast<__m256i*>(a16[r] + 16 * u),
                         _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16 * u))));
  }
  __m256i s0[NR], s1[NR];
  for (int r = 0; r < NR; ++r) s0[r] = s1[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int p = 0; p < P; ++p) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w16 + 32 * p));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w16 + 32 * p + 16));
    for (int r = 0; r < NR; ++r) {
      int32_t v;
      std::memcpy(&v, a16[r] + 2 * p, 4);
      const __m256i av = _mm256_set1_epi32(v);
      s0[r] = _mm256_add_epi32(_mm256_madd_epi16(w0, av), s0[r]);
      s1[r] = _mm256_add_epi32(_mm256_madd_epi16(w1, av), s1[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const __m256 sv = _mm256_set1_ps(sa[b * T + t + r]);
    float* dst = acc + (t + r) * L;
    _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[r]), _mm256_mul_ps(sv, sw0), _mm256_loadu_ps(dst)));
    _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[r]), _mm256_mul_ps(sv, sw1), _mm256_loadu_ps(dst + 8)));
  }
}

template <int G>
void dyw_panel(const int8_t* __restrict ab, const float* __restrict sa, const int32_t* __restrict corr, int64_t T,
               int64_t nb, const uint8_t* __restrict wp, const float* __restrict swp, const float* add, float* dx,
               int64_t ldx, int64_t nk) {
  (void)corr;                                                    // signed products: no correction
  constexpr int D = G / 4, NR = 4;                               // dwords per block; rows of dy per pass
  thread_local std::vector<float> acc_buffer;
  acc_buffer.assign(static_cast<size_t>(T * L), 0.0f);
  float* __restrict acc = acc_buffer.data();
  alignas(32) int16_t w16[G * L];                                // the block's panel: G / 2 pairs x 16 lanes x 2
  const __m256i perm = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = wp + b * D * 64;
    for (int d = 0; d < D; ++d)                                  // dword d = pairs 2d, 2d + 1 of every lane
      for (int h = 0; h < 2; ++h) {                              // lanes 8h .. 8h + 7: bytes 32h .. 32h + 31
        const uint8_t* src = wb + d * 64 + 32 * h;
        // [l0 p0, l0 p1, l1 p0, l1 p1 | l2 p0, l2 p1, l3 p0, l3 p1] -> [l0 p0, l1 p0, l0 p1, l1 p1 | l2 p0, ...]
        const __m256i x = _mm256_shuffle_epi32(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))),
                                               _MM_SHUFFLE(3, 1, 2, 0));
        const __m256i y = _mm256_shuffle_epi32(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))),
                                               _MM_SHUFFLE(3, 1, 2, 0));
        // pair 2d of lanes (0, 1, 4, 5 | 2, 3, 6, 7) + 8h, then pair 2d + 1 of the same lanes
        _mm256_store_si256(reinterpret_cast<__m256i*>(w16 + 32 * (2 * d) + 16 * h), _mm256_unpacklo_epi64(x, y));
        _mm256_store_si256(reinterpret_cast<__m256i*>(w16 + 32 * (2 * d + 1) + 16 * h), _mm256_unpackhi_epi64(x, y));
      }
    const __m256 sw0 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(swp + b * L), perm);
    const __m256 sw1 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(swp + b * L + 8), perm);
    int64_t t = 0;
    for (; t + NR <= T; t += NR) dyw_rows_i16<G, NR>(ab, sa, T, b, t, w16, sw0, sw1, acc);
    for (; t < T; ++t) dyw_rows_i16<G, 1>(ab, sa, T, b, t, w16, sw0, sw1, acc);
  }
  alignas(32) float out[L];
  for (int64_t t = 0; t < T; ++t) {
    _mm256_store_ps(out, _mm256_permutevar8x32_ps(_mm256_loadu_ps(acc + t * L), perm));
    _mm256_store_ps(out + 8, _mm256_permutevar8x32_ps(_mm256_loadu_ps(acc + t * L + 8), perm));
    for (int64_t r = 0; r < nk; ++r)   // toolchain_int4_dyw_a8_acc: dx = add + the chain (one rounding)
      dx[t * ldx + r] = add == nullptr ? out[r] : add[t * ldx + r] + out[r];
  }
}
#endif  // TOOLCHAIN_X86_PASS == 3 / 2

bool dyw_panel_of(int64_t group, const int8_t* ab, const float* sa, const int32_t* corr, int64_t T, int64_t nb,
                  const uint8_t* wp, const float* swp, const float* add, float* dx, int64_t ldx, int64_t nk) {
  switch (group) {
    case 32: dyw_panel<32>(ab, sa, corr, T, nb, wp, swp, add, dx, ldx, nk); return true;
    case 64: dyw_panel<64>(ab, sa, corr, T, nb, wp, swp, add, dx, ldx, nk); return true;
    case 128: dyw_panel<128>(ab, sa, corr, T, nb, wp, swp, add, dx, ldx, nk); return true;
    default: return false;
  }
}
#endif  // TOOLCHAIN_X86_PASS >= 2

}  // namespace x86_avx512 / x86_avx2 / x86_avx_vnni
TOOLCHAIN_TARGET_POP
#endif  // TOOLCHAIN_X86_PASS
