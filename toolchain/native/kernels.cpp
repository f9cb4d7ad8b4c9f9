// The fused generation methods' native kernels (ExecuTorch custom ops; their PyTorch references are in
// toolchain/mesp/ops/quant.py, toolchain/mesp/decode.py and toolchain/mesp/decode_ops.py):
//   toolchain::int4_linear_a8     y = x W^T for group-wise int4 W
//   toolchain::attention_decode   softmax attention of C tokens over the KV cache and themselves
//   toolchain::lora_linear_a8     residual + (x W^T + bias + s (x A^T) B^T): a projection with its LoRA pair
//   toolchain::rms_norm, toolchain::rope_heads, toolchain::swiglu   the element-wise rest of a block
// (a decode layer is 13 calls of these and one permute_copy; the stock graph of the same layer is 173 portable ops).
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
// The integer sums are exact in any order, so every path below gives the same isum. The float sum is in one
// fixed order on every machine: group g goes into lane g mod 16 with a fused multiply-add (groups in
// increasing order), then the 16 lanes are summed as a fixed pairwise tree. So the AVX-512 VNNI path, the
// arm64 paths (neon, dotprod, i8mm: kernels_arm64.h) and the generic path give the same bits (tests/native,
// and scripts/check_kernel_arm64.sh under qemu); docs/kernels.md says which path runs where.
//
// The AVX-512 VNNI path (groups of 32, 64 or 128 columns): 64 weight bytes (128 weights) are split into
// their high and low nibbles (0..15, unsigned) and multiplied into the even / odd columns of the int8 x
// with vpdpbusd (64 products per instruction); 4-lane partial sums are folded into 16 group sums per block
// of 16 groups with permutes, and the correction for the nibble offset (- 8 sum_k a[t, k] per group) is
// subtracted once per group. Decode (T = 1) streams the weight rows past one row of x held in registers. A
// prefill chunk (T >= 10, e.g. 32; any T >= 2 for groups of 128) puts 16 weight rows in the 16 lanes instead
// (rows_vnni_broadcast): their group bytes are gathered into registers once and every row of x multiplies
// them with its 4-byte dwords broadcast; smaller T takes tiles of TT rows (rows_vnni_tiles).
//
// Built by toolchain/native/build.py (g++ -O3 -march=native, against the executorch wheel's headers and
// libexecutorch) for the host, and by the apps' native builds (android/, ios/) for arm64. Registers the
// ExecuTorch kernels `toolchain::<op>.out` of the ops above at load; `toolchain_<op>` are the same
// computations as C functions for the kernel tests.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define TOOLCHAIN_VNNI 1
#endif

namespace {

// The kernel paths, chosen once per process: the best one this CPU runs (and this build has), or the one
// TOOLCHAIN_KERNEL_PATH=<name> forces (for testing; refused, with one "Error:" line on stderr and every
// int4 call returning -1, when the CPU or the build lacks it). toolchain_kernel_path() names the choice.
enum class KernelPath { generic, avx2, avx_vnni, avx512_vnni, neon, dotprod, i8mm };
constexpr const char* kKernelPathNames[] = {"generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm"};
constexpr int kKernelPaths = 7;

}  // namespace

#if defined(__aarch64__)
#include "kernels_arm64.h"   // the neon / dotprod / i8mm paths and their run-time CPU checks
#endif

namespace {

// Whether this CPU and build run path p.
bool kernel_path_available(KernelPath p) {
  switch (p) {
    case KernelPath::generic: return true;
#ifdef TOOLCHAIN_VNNI
    case KernelPath::avx512_vnni: return true;   // compiled in only when the build's -march has it
#endif
#if defined(__aarch64__)
    case KernelPath::neon: case KernelPath::dotprod: case KernelPath::i8mm: return arm64::cpu_has(p);
#endif
    default: return false;
  }
}

struct KernelPathChoice {
  KernelPath path = KernelPath::generic;
  bool refused = false;
};

KernelPathChoice choose_kernel_path() {
  KernelPathChoice c;
  for (int p = kKernelPaths - 1; p >= 0; --p)
    if (kernel_path_available(static_cast<KernelPath>(p))) {
      c.path = static_cast<KernelPath>(p);
      break;
    }
  const char* forced = std::getenv("TOOLCHAIN_KERNEL_PATH");
  if (forced == nullptr || *forced == '\0') return c;
  for (int p = 0; p < kKernelPaths; ++p)
    if (std::strcmp(forced, kKernelPathNames[p]) == 0) {
      if (kernel_path_available(static_cast<KernelPath>(p))) {
        c.path = static_cast<KernelPath>(p);
        return c;
      }
      std::fprintf(stderr, "Error: TOOLCHAIN_KERNEL_PATH=%s: this CPU or build lacks the %s kernel path "
                   "(best here: %s)\n", forced, forced, kKernelPathNames[static_cast<int>(c.path)]);
      c.refused = true;
      return c;
    }
  std::fprintf(stderr, "Error: TOOLCHAIN_KERNEL_PATH=%s is not a kernel path (generic, avx2, avx_vnni, avx512_vnni, "
               "neon, dotprod, i8mm)\n", forced);
  c.refused = true;
  return c;
}

const KernelPathChoice& kernel_path_choice() {
  static const KernelPathChoice choice = choose_kernel_path();
  return choice;
}

inline KernelPath kernel_path() { return kernel_path_choice().path; }

constexpr int64_t L = 16;   // float accumulator lanes (group g -> lane g mod 16)
constexpr int64_t TT = 4;   // rows of x per weight load

// Lanes summed pairwise: ((a0 + a8) + (a4 + a12)) + ... (a fixed tree).
inline float lane_sum(const float* a) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

typedef float f32x16 __attribute__((vector_size(64)));   // GCC / Clang vector extensions: 16 lanes

// x quantized per row and group: int8 even / odd columns (each row padded with zeros to `stride` bytes),
// sa and 8 * sum_k a per group (padded with zeros to `gstride` groups).
struct QuantizedX {
  int64_t stride = 0, gstride = 0;
  std::vector<int8_t> even, odd;
  std::vector<int8_t> teven, todd;   // the same bytes per block of 16 groups of gb bytes, dword k of group y at
                                     // (k * 16 + y) * 4: what rows_vnni_tiles multiplies (transposed())
  std::vector<float> sa;
  std::vector<int32_t> corr;

  void build(const float* x, int64_t T, int64_t in, int64_t group, int64_t ng, int64_t pad_bytes) {
    const int64_t half = in / 2;
    stride = (half + pad_bytes - 1) / pad_bytes * pad_bytes;
    gstride = (ng + L - 1) / L * L;
    even.assign(static_cast<size_t>(T * stride), 0);
    odd.assign(static_cast<size_t>(T * stride), 0);
    sa.assign(static_cast<size_t>(T * gstride), 0.0f);
    corr.assign(static_cast<size_t>(T * gstride), 0);
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * in;
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t k0 = g * group, k1 = std::min(in, k0 + group);
#ifdef TOOLCHAIN_VNNI
        if ((k1 - k0) % 16 == 0) {   // whole vectors of 16 columns: group16, the same values as below
          group16(xt, k0, k1, t, g);
          continue;
        }
#endif
#if defined(__aarch64__)
        const size_t b = static_cast<size_t>(t * stride + k0 / 2), gi = static_cast<size_t>(t * gstride + g);
        if (kernel_path() >= KernelPath::neon &&   // whole vectors of 8 columns: the same values as below
            arm64::quantize_group(xt, k0, k1, &even[b], &odd[b], &sa[gi], &corr[gi]))
          continue;
#endif
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
  }

#ifdef TOOLCHAIN_VNNI
  // One group of columns k0 .. k1 - 1 (a multiple of 16) of row t, 16 at a time: the scalar loop's values
  // (the same max, the same IEEE division and round-to-nearest-even, NaN to 0, the same clamp), stored as its
  // even / odd bytes.
  void group16(const float* xt, int64_t k0, int64_t k1, int64_t t, int64_t g) {
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
      std::memcpy(&even[static_cast<size_t>(t * stride + k / 2)], bytes, 8);
      std::memcpy(&odd[static_cast<size_t>(t * stride + k / 2)], bytes + 8, 8);
    }
    sa[static_cast<size_t>(t * gstride + g)] = s;
    corr[static_cast<size_t>(t * gstride + g)] = 8 * _mm512_reduce_add_epi32(sum);
  }
#endif

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

#ifdef TOOLCHAIN_VNNI
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
                         int64_t half, int64_t ng, int64_t o, float* __restrict y) {
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
      _mm512_mask_storeu_ps(y + t * o + r0, rm, out);
    }
  }
}
#endif

// All o output rows for rows t0 .. t0 + nt - 1 of x.
template <int NT>
void rows(const QuantizedX& a, int64_t t0, const uint8_t* q, const float* s, int64_t half, int64_t gb, int64_t ng,
          int64_t o, float* y, int64_t ystride) {
#ifdef TOOLCHAIN_VNNI
  if (NT > 1) {
    switch (gb) {
      case 16: return rows_vnni_tiles<NT, 16>(a, t0, q, s, half, ng, o, y, ystride);
      case 32: return rows_vnni_tiles<NT, 32>(a, t0, q, s, half, ng, o, y, ystride);
      case 64: return rows_vnni_tiles<NT, 64>(a, t0, q, s, half, ng, o, y, ystride);
      default: break;
    }
  }
  if (NT == 1 && t0 == 0 && ng <= L) {
    if (gb == 16) return row_vnni_block_in_registers<16>(a, q, s, half, ng, o, y);
    if (gb == 32) return row_vnni_block_in_registers<32>(a, q, s, half, ng, o, y);
  }
  switch (gb) {
    case 16: return rows_vnni<NT, 16>(a, t0, q, s, half, ng, o, y, ystride);
    case 32: return rows_vnni<NT, 32>(a, t0, q, s, half, ng, o, y, ystride);
    case 64: return rows_vnni<NT, 64>(a, t0, q, s, half, ng, o, y, ystride);
    default: break;
  }
#endif
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

}  // namespace

extern "C" {

// The kernel path this process runs (see KernelPath), or nullptr when TOOLCHAIN_KERNEL_PATH forced one that
// is refused here.
const char* toolchain_kernel_path() {
  const KernelPathChoice& c = kernel_path_choice();
  return c.refused ? nullptr : kKernelPathNames[static_cast<int>(c.path)];
}

// y [T, o] = x [T, i] W^T with x quantized per row and group (see the top of the file); q [o, i/2],
// scales [o, ng] (ng = ceil(i / group)). Returns 0, or -1 for bad arguments (i odd, group odd or < 2,
// ng != ceil(i / group)).
int toolchain_int4_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales, int64_t o,
                             int64_t ng, int64_t group, float* y) {
  if (in <= 0 || in % 2 || group < 2 || group % 2 || ng != (in + group - 1) / group || T < 0 || o < 0) return -1;
  if (kernel_path_choice().refused) return -1;
  const int64_t half = in / 2, gb = group / 2;
  thread_local QuantizedX a;
  a.build(x, T, in, group, ng, 16 * 64);   // padded to whole VNNI blocks (16 groups of up to 64 bytes)
#if defined(__aarch64__)
  if (arm64::int4_rows(kernel_path(), {a.even.data(), a.odd.data(), a.sa.data(), a.corr.data(), a.stride, a.gstride},
                       T, q, scales, half, gb, ng, o, y))
    return 0;
#endif
#ifdef TOOLCHAIN_VNNI
  if ((T >= 10 && (gb == 16 || gb == 32)) || (T > 1 && gb == 64)) {   // where it beats the tiles (docs/benchmarks.md)
    switch (gb) {
      case 16: rows_vnni_broadcast<16>(a, T, q, scales, half, ng, o, y); return 0;
      case 32: rows_vnni_broadcast<32>(a, T, q, scales, half, ng, o, y); return 0;
      default: rows_vnni_broadcast<64>(a, T, q, scales, half, ng, o, y); return 0;
    }
  }
  if (T > 1 && (gb == 16 || gb == 32 || gb == 64)) a.transposed(T, gb);
#endif
  for (int64_t t0 = 0; t0 < T; t0 += TT) {
    float* yt = y + t0 * o;
    switch (std::min(TT, T - t0)) {
      case 4: rows<4>(a, t0, q, scales, half, gb, ng, o, yt, o); break;
      case 3: rows<3>(a, t0, q, scales, half, gb, ng, o, yt, o); break;
      case 2: rows<2>(a, t0, q, scales, half, gb, ng, o, yt, o); break;
      default: rows<1>(a, t0, q, scales, half, gb, ng, o, yt, o); break;
    }
  }
  return 0;
}


// out [C, H*D] = softmax attention of C query tokens (q [H, C, D], after RoPE) at positions pos .. pos + C - 1
// over the cache rows [0, min(pos, S)) of k_cache / v_cache [Hk, S, D] and, causally, the chunk's own k / v
// [Hk, C, D] (query head h reads kv head h / (H / Hk)); scores scaled by `scale`. Per query: the scores,
// their max m, then sum_s exp(s - m) v_s / sum_s exp(s - m). Returns 0, or -1 for bad arguments.
int toolchain_attention_decode(const float* q, const float* k, const float* v, const float* k_cache,
                               const float* v_cache, int64_t H, int64_t Hk, int64_t C, int64_t S, int64_t D,
                               int64_t pos, float scale, float* out) {
  if (H <= 0 || Hk <= 0 || H % Hk || C <= 0 || S < 0 || D <= 0 || pos < 0) return -1;
  const int64_t G = H / Hk, n = std::min(pos, S);
  thread_local std::vector<float> p, o;
  p.resize(static_cast<size_t>(n + C));
  o.resize(static_cast<size_t>(D));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t j = h / G;
    const float* kc = k_cache + j * S * D;
    const float* vc = v_cache + j * S * D;
    const float* kn = k + j * C * D;
    const float* vn = v + j * C * D;
    for (int64_t c = 0; c < C; ++c) {
      const float* qv = q + (h * C + c) * D;
      float m = -INFINITY;
      for (int64_t s = 0; s < n + c + 1; ++s) {
        const float* kr = s < n ? kc + s * D : kn + (s - n) * D;
        f32x16 acc = f32x16{};
        float tail = 0.0f;
        int64_t d = 0;
        for (; d + L <= D; d += L) {
          f32x16 a, b;
          std::memcpy(&a, qv + d, sizeof a);
          std::memcpy(&b, kr + d, sizeof b);
          acc = acc + a * b;
        }
        for (; d < D; ++d) tail += qv[d] * kr[d];
        float lanes[L];
        std::memcpy(lanes, &acc, sizeof lanes);
        const float sc = (lane_sum(lanes) + tail) * scale;
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
      float* dst = out + c * H * D + h * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = o[static_cast<size_t>(d)] / denom;
    }
  }
  return 0;
}


// The small ops around them, one call each instead of ExecuTorch's portable graphs (references in
// toolchain/mesp/decode_ops.py):

// y [T, d] = w * (x * r), r = 1 / sqrt(mean_k x[t, k]^2 + eps) per row (RMSNorm).
int toolchain_rms_norm(const float* x, int64_t T, int64_t d, const float* w, float eps, float* y) {
  if (T < 0 || d <= 0) return -1;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * d;
    f32x16 acc = f32x16{};
    float tail = 0.0f;
    int64_t k = 0;
    for (; k + L <= d; k += L) {
      f32x16 a;
      std::memcpy(&a, xt + k, sizeof a);
      acc = acc + a * a;
    }
    for (; k < d; ++k) tail += xt[k] * xt[k];
    float lanes[L];
    std::memcpy(lanes, &acc, sizeof lanes);
    const float r = 1.0f / std::sqrt((lane_sum(lanes) + tail) / static_cast<float>(d) + eps);
    float* yt = y + t * d;
    for (k = 0; k < d; ++k) yt[k] = w[k] * (xt[k] * r);
  }
  return 0;
}

// Sum of x[k] y[k] over k < n: 16 lanes (k mod 16, fused multiply-adds in increasing k), lane_sum's tree,
// then the tail in order.
inline float dot(const float* __restrict x, const float* __restrict y, int64_t n) {
  f32x16 acc = f32x16{};
  int64_t k = 0;
  for (; k + L <= n; k += L) {
    f32x16 a, b;
    std::memcpy(&a, x + k, sizeof a);
    std::memcpy(&b, y + k, sizeof b);
    acc = acc + a * b;
  }
  float lanes[L];
  std::memcpy(lanes, &acc, sizeof lanes);
  float tail = 0.0f;
  for (; k < n; ++k) tail += x[k] * y[k];
  return lane_sum(lanes) + tail;
}

// y [T, o] = residual + ((x W^T + bias) + s (x A^T) B^T): the int4 W4A8 product (toolchain_int4_linear_a8)
// with the projection's bias, its LoRA pair a [r, in], b [o, r] (scale s) and a residual [T, o] added;
// bias, a / b and residual may each be null (absent). h = x A^T per row is `dot`; (h B^T)[n] = sum_j h[j]
// b[n, j] as fused multiply-adds in increasing j (explicit std::fma, not left to the compiler's contraction),
// from b transposed once per call, 64 outputs at a time in registers together with the bias and residual adds
// (lora_epilogue: one pass over y instead of r + 1). Returns 0, or -1 for bad arguments.
int toolchain_lora_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales, int64_t o,
                             int64_t ng, int64_t group, const float* bias, const float* a, const float* b, int64_t r,
                             float s, const float* residual, float* y) {
  if ((a == nullptr) != (b == nullptr) || r < 0) return -1;
  const int rc = toolchain_int4_linear_a8(x, T, in, q, scales, o, ng, group, y);
  if (rc != 0) return rc;
  thread_local std::vector<float> h, bt;
  // b is read in place for one row of x when r is a small constant (decode, rank 8: the epilogue's loads of b
  // are strided, no transposed copy per call), else transposed once per call for all rows.
  const bool in_place = T == 1 && r == 8;
  if (a != nullptr) {
    h.resize(static_cast<size_t>(T * r));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < r; ++j) h[static_cast<size_t>(t * r + j)] = dot(x + t * in, a + j * in, in);
    if (!in_place) {
      bt.resize(static_cast<size_t>(r * o));
      for (int64_t n = 0; n < o; ++n)
        for (int64_t j = 0; j < r; ++j) bt[static_cast<size_t>(j * o + n)] = b[n * r + j];
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* ht = a != nullptr ? h.data() + t * r : nullptr;
    const float* rt = residual != nullptr ? residual + t * o : nullptr;
    float* yt = y + t * o;
    int64_t n0 = 0;
    if (in_place) {
      for (; n0 + LORA_BLOCK <= o; n0 += LORA_BLOCK)
        lora_epilogue<LORA_BLOCK, 8>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, b + n0 * r, 1, r, s,
                                     rt != nullptr ? rt + n0 : nullptr, LORA_BLOCK);
      for (; n0 < o; n0 += L)
        lora_epilogue<L, 8>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, b + n0 * r, 1, r, s,
                            rt != nullptr ? rt + n0 : nullptr, std::min<int64_t>(L, o - n0));
      continue;
    }
    for (; n0 + LORA_BLOCK <= o; n0 += LORA_BLOCK)
      lora_epilogue<LORA_BLOCK, 1>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, bt.data() + n0, o, r, s,
                                   rt != nullptr ? rt + n0 : nullptr, LORA_BLOCK);
    for (; n0 < o; n0 += L)
      lora_epilogue<L, 1>(yt + n0, bias != nullptr ? bias + n0 : nullptr, ht, bt.data() + n0, o, r, s,
                          rt != nullptr ? rt + n0 : nullptr, std::min<int64_t>(L, o - n0));
  }
  return 0;
}

// out [n, C, D] = RoPE of x [C, n * D] split into n heads, the C tokens at positions pos .. pos + C - 1:
// out = x cos + rot(x) sin, rot(x) = (-x[D/2:], x[:D/2]), cos / sin of (pos + c) * theta^(-2i / D) in float32
// as transformers computes them. Returns 0, or -1 for bad arguments (D odd).
int toolchain_rope_heads(const float* x, int64_t C, int64_t n, int64_t D, int64_t pos, float theta, float* out) {
  if (C < 0 || n <= 0 || D <= 0 || D % 2 || D > 1024 || pos < 0) return -1;
  const int64_t half = D / 2;
  float inv_freq[512], cs[512], sn[512];
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
  for (int64_t c = 0; c < C; ++c) {
    const float p = static_cast<float>(pos + c);
    for (int64_t i = 0; i < half; ++i) {
      const float f = p * inv_freq[i];
      cs[i] = std::cos(f);
      sn[i] = std::sin(f);
    }
    for (int64_t h = 0; h < n; ++h) {
      const float* xh = x + c * n * D + h * D;
      float* oh = out + (h * C + c) * D;
      for (int64_t i = 0; i < half; ++i) {
        oh[i] = xh[i] * cs[i] + (-xh[i + half]) * sn[i];
        oh[i + half] = xh[i + half] * cs[i] + xh[i] * sn[i];
      }
    }
  }
  return 0;
}

// exp(x) per lane, Cephes' expf: x = n ln2 + f (n rounded to nearest, ln2 in two parts), exp(f) a degree-6
// polynomial, times 2^n from the exponent bits; x clamped to [-87.34, 88.38] (normal results). Within 2 ulp
// of the correctly rounded value; element-wise, so any vector width gives the same bits.
inline f32x16 exp16(f32x16 x) {
  typedef int32_t i32x16 __attribute__((vector_size(64)));
  x = x > 88.3762626647949f ? f32x16{} + 88.3762626647949f : x;
  x = x < -87.3365478515625f ? f32x16{} - 87.3365478515625f : x;
  const f32x16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   // round to nearest (|n| < 2^22)
  f32x16 f = x - n * 0.693359375f;
  f = f - n * -2.12194440e-4f;
  f32x16 p = f32x16{} + 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  p = p * (f * f) + f + 1.0f;
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// out [N] = silu(g) * u = g / (1 + exp(-g)) * u (SwiGLU), exp by exp16 (the tail in a zero-padded vector).
inline f32x16 swiglu16(f32x16 g, f32x16 u) { return g / (1.0f + exp16(-g)) * u; }

int toolchain_swiglu(const float* g, const float* u, int64_t N, float* out) {
  if (N < 0) return -1;
  int64_t k = 0;
  for (; k + L <= N; k += L) {
    f32x16 gv, uv;
    std::memcpy(&gv, g + k, sizeof gv);
    std::memcpy(&uv, u + k, sizeof uv);
    const f32x16 ov = swiglu16(gv, uv);
    std::memcpy(out + k, &ov, sizeof ov);
  }
  if (k < N) {
    float gt[L] = {}, ut[L] = {}, ot[L];
    std::memcpy(gt, g + k, static_cast<size_t>(N - k) * sizeof(float));
    std::memcpy(ut, u + k, static_cast<size_t>(N - k) * sizeof(float));
    f32x16 gv, uv;
    std::memcpy(&gv, gt, sizeof gv);
    std::memcpy(&uv, ut, sizeof uv);
    const f32x16 ov = swiglu16(gv, uv);
    std::memcpy(ot, &ov, sizeof ov);
    std::memcpy(out + k, ot, static_cast<size_t>(N - k) * sizeof(float));
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

}  // namespace

EXECUTORCH_LIBRARY(toolchain, "int4_linear_a8.out", int4_linear_a8_out);
EXECUTORCH_LIBRARY(toolchain, "attention_decode.out", attention_decode_out);
EXECUTORCH_LIBRARY(toolchain, "rms_norm.out", rms_norm_out);
EXECUTORCH_LIBRARY(toolchain, "lora_linear_a8.out", lora_linear_a8_out);
EXECUTORCH_LIBRARY(toolchain, "rope_heads.out", rope_heads_out);
EXECUTORCH_LIBRARY(toolchain, "swiglu.out", swiglu_out);
#endif
