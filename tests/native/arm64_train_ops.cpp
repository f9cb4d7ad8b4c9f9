// The training step's float32 ops of toolchain/native/kernels.cpp (the `--compute int8` programs' native ops:
// toolchain/mesp/kernels.py's table) called on deterministic inputs, for scripts/check_kernel_arm64.sh: linked into
// tests/native/arm64_driver.cpp's binary, built for aarch64 (run under qemu-aarch64, every kernel path and CPU model,
// and in the pooled build at 1 and 2 threads) and for this x86-64 host (-march=native, the flags of
// toolchain/native/build.py), whose outputs the aarch64 runs compare with bit for bit. The ops that call
// kernels.cpp's `dot` (attention_train_backward, lora_backward, lora_rows_backward, lora_linear_a8,
// lora_linear_a8_rows), attention_train (whose reference the backward's needs) and rms_norm_backward (two row sums)
// also have float64 references here, and every build must
// hold their bound (`within`): where a compiler rounds dot's scalar tail differently from the x86 build
// (docs/kernels.md, "On arm64" under the training step's float32 ops), that bound, not bit equality, is what such
// an op is held to.
//
// Ops (C entries) and their cases: odd shapes (T not a multiple of 4 or 16, D, i, o, C, V, N not multiples of 16,
// grouped and ungrouped heads, T = 1), int4 groups with a partial last group, calls large enough that the pooled
// build splits them over 2 threads (kernels.cpp's parallel_for thresholds; the driver counts each op's chunks),
// and NaN / inf where the op defines what they do: element-wise (swiglu, swiglu_train; rope_train and its backward:
// the pair i, i + D/2 of a head and token, also from the tables), per row (rms_norm, rms_norm_backward,
// online_softmax_stats, exp_sub_rows, lora_linear_a8's and lora_linear_a8_rows' rows of x, lora_backward's dx), per
// query row (attention_train: a sixth forward call, the first case with a NaN in one query row of one head).
//   attention_train, attention_train_backward   (H, Hk, T, D) = (4, 2, 37, 24) (3, 3, 19, 33) (2, 1, 1, 8)
//                                               (6, 2, 70, 64) (2, 1, 45, 80)
//   swiglu_train                                N = 7, 1029, 5003 (NaN, +inf, -inf, |g| past exp16's clamp)
//   swiglu                                      N = 13, 65541 (the same kinds)
//   rms_norm                                    (T, d) = (37, 896) (5, 13) (64, 300) (a NaN row, an inf row, a zero row)
//   online_softmax_stats, exp_sub_rows          (C, V) = (37, 1029) (5, 37, first chunk: m = -inf) (3, 16) (a NaN
//                                               row, a row with +inf, a row of -inf)
//   lora_backward                               (T, i, o, r) = (37, 200, 70, 3) (1, 5, 7, 1) (70, 130, 65, 16)
//                                               (33, 896, 128, 8) (NaN / inf rows of dx)
//   lora_rows_backward                          (T, C, r) = (37, 70, 3) (33, 256, 8) (1, 9, 2)
//   lora_linear_a8                              (T, i, o, group, r) = (1, 200, 70, 64, 8: decode, b in place)
//                                               (9, 896, 45, 32, 8) (37, 130, 33, 128, 3) (3, 96, 17, 96, no LoRA)
//                                               (13, 70, 40, 10, 4: the generic rows) (40, 2080, 48, 96, 8)
//                                               (bias, residual, NaN / inf rows of x)
//   lora_linear_a8_rows                         (T, i, o, group, row0, rows, r) = (1, 200, 70, 64, 13, 40, 8: decode)
//                                               (37, 130, 77, 32, 5, 71, 3) (9, 96, 40, 96, 0, 40, 0: no LoRA)
//                                               (13, 70, 50, 10, 49, 1, 4: the last row) (40, 2080, 96, 96, 48, 48, 8)
//                                               (NaN / inf rows of x)
//   rope_train, rope_train_backward             (N, start, T, n, D) = (3, 0, 37, 3, 24) (1, 0, 1, 1, 2)
//                                               (7, 2, 19, 5, 130) (12, 8, 70, 4, 128) (NaN / inf in x, dy, cos, sin)
//   rms_norm_backward                           (T, d) = (37, 896: dy2, dy3, residual) (5, 13) (64, 300: dy2) (1, 17:
//                                               dy3, residual) (9, 40: dy3) (rows: NaN in x, inf in x, zero, NaN in
//                                               dy, -inf in dy3)
// Inputs: integers from splitmix64 times powers of two (exact in float32 and the same on every machine: no libm).
//
// Per op: the count of outputs, of NaNs, a 64-bit FNV-1a hash of the outputs' bits in order with every NaN counted
// as the one NaN 0x7fc00000 ("outputs hash": x86 and arm64 make different default NaNs, and which of two NaN
// operands an instruction keeps is the ISA's rule, so NaN payloads are not compared; where each NaN is, is), the
// pool's chunks during the op's calls (the pooled build), the float64 bound (the ops that have one); against a file
// of the x86 build's outputs: how many are equal bit for bit (NaN = NaN) and the largest difference in ulps and
// relative to the op's largest |output|.

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "arm64_check_util.h"

extern "C" {
int toolchain_attention_train(const float* q, const float* k, const float* v, int64_t H, int64_t Hk, int64_t T,
                              int64_t D, float scale, float* out);
int toolchain_attention_train_backward(const float* dout, const float* q, const float* k, const float* v,
                                       const float* o, int64_t H, int64_t Hk, int64_t T, int64_t D, float scale,
                                       float* out);
int toolchain_swiglu_train(const float* g, const float* u, const float* da, int64_t N, float* out);
int toolchain_swiglu(const float* g, const float* u, int64_t N, float* out);
int toolchain_rms_norm(const float* x, int64_t T, int64_t d, const float* w, float eps, float* y);
int toolchain_online_softmax_stats(const float* z, const float* m, const float* s, int64_t C, int64_t V, float* out);
int toolchain_exp_sub_rows(const float* z, const float* m, int64_t C, int64_t V, float* out);
int toolchain_lora_backward(const float* dy, const float* x, const float* a, const float* b, const float* dx,
                            int64_t T, int64_t in, int64_t o, int64_t r, float s, float* out);
int toolchain_lora_rows_backward(const float* dy, const float* h, const float* b, int64_t T, int64_t C, int64_t r,
                                 float s, float* out);
int toolchain_lora_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales, int64_t o,
                             int64_t ng, int64_t group, const float* bias, const float* a, const float* b, int64_t r,
                             float s, const float* residual, float* y);
int toolchain_lora_linear_a8_rows(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales,
                                  int64_t o, int64_t ng, int64_t group, int64_t row0, int64_t rows, const float* a,
                                  const float* b, int64_t r, float s, float* y);
int toolchain_rope_train(const float* x, const float* cos, const float* sin, int64_t T, int64_t n, int64_t D,
                         float* out);
int toolchain_rope_train_backward(const float* dy, const float* cos, const float* sin, int64_t N, int64_t start,
                                  int64_t T, int64_t n, int64_t D, float* out);
int toolchain_rms_norm_backward(const float* x, const float* w, const float* dy, const float* dy2, const float* dy3,
                                const float* residual, int64_t T, int64_t d, float eps, float* out);
int64_t toolchain_pool_units() __attribute__((weak));
}

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {   // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // An integer in [-2^(bits-1), 2^(bits-1)).
  int32_t integer(int bits) { return static_cast<int32_t>(next() >> (64 - bits)) - (int32_t{1} << (bits - 1)); }
  // A bell-shaped value of standard deviation about 0.58 `scale` (a power of two): the sum of four 21-bit integers
  // (|sum| <= 2^22, exact in float32) times scale 2^-21 (exact): no libm, the same bits on every machine.
  float normal(float scale) {
    const int32_t n = integer(21) + integer(21) + integer(21) + integer(21);
    return static_cast<float>(n) * (scale * 0x1p-21f);
  }
  std::vector<float> normals(int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(scale);
    return v;
  }
};

int64_t chunks_now() { return toolchain_pool_units != nullptr ? toolchain_pool_units() : 0; }

struct Op {
  std::string name;
  int64_t cases = 0, chunks = 0;
  std::vector<float> out;
  int64_t parts = 0, parts_ok = 0;   // the float64 reference's check (the ops that have one), per part
  double worst = 0;                  // max err / bound over the parts
};

// One part of an op's output (a case's whole output, or its dx / dA / dB) against its float64 value, at the bound
// tests/native/test_kernel_train.py holds the x86 kernels to: |got - exact| <= 2e-5 max |exact| over the part's
// finite values; where the exact value is NaN the kernel's is NaN, where it is an infinity the same infinity.
void within(Op& op, const float* got, const std::vector<double>& exact, const char* label) {
  double amax = 0;
  for (double e : exact)
    if (std::isfinite(e)) amax = std::max(amax, std::fabs(e));
  const double bound = 2e-5 * amax;
  bool ok = true;
  for (size_t e = 0; e < exact.size(); ++e) {
    const double x = exact[e], g = got[e];
    const bool good = std::isnan(x) ? std::isnan(g) : std::isinf(x) ? g == x : std::fabs(g - x) <= bound;
    if (!good && ok)
      std::fprintf(stderr, "%s: train %s case %" PRId64 " output %zu = %.9g, float64 %.17g, bound %.3g\n", label,
                   op.name.c_str(), op.cases, e, g, x, bound);
    ok = ok && good;
    if (std::isfinite(x) && bound > 0) op.worst = std::max(op.worst, std::fabs(g - x) / bound);
  }
  ++op.parts;
  op.parts_ok += ok;
}

// The float64 references of the ops with sums (most call kernels.cpp's `dot`, whose scalar tail the compilers once
// rounded differently: docs/kernels.md, "arm64"): attention (the definition above toolchain_attention_train in
// kernels.cpp, o = the exact forward), the LoRA backward ops (above toolchain_lora_backward), lora_linear_a8 and
// lora_linear_a8_rows (lora_linear_reference below), rms_norm_backward (in rms_norm_backward below). Sums in plain
// order, exp from libm in double.
void attention_reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                         const std::vector<float>& dout, int64_t H, int64_t Hk, int64_t T, int64_t D, float scale,
                         std::vector<double>& o, std::vector<double>& g) {
  const double c = scale;
  o.assign(static_cast<size_t>(T * H * D), 0.0);
  g.assign(static_cast<size_t>((H + 2 * Hk) * T * D), 0.0);
  std::vector<double> p(static_cast<size_t>(T * T)), ds(static_cast<size_t>(T * T));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t j = h / (H / Hk);
    const float *qh = &q[h * T * D], *kj = &k[j * T * D], *vj = &v[j * T * D];
    for (int64_t i = 0; i < T; ++i) {
      double m = -INFINITY, sum = 0;
      for (int64_t l = 0; l <= i; ++l) {
        double sc = 0;
        for (int64_t d = 0; d < D; ++d) sc += static_cast<double>(qh[i * D + d]) * kj[l * D + d];
        p[i * T + l] = c * sc;
        m = std::max(m, c * sc);
      }
      for (int64_t l = 0; l <= i; ++l) sum += (p[i * T + l] = std::exp(p[i * T + l] - m));
      for (int64_t l = 0; l <= i; ++l) p[i * T + l] /= sum;
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t l = 0; l <= i; ++l) acc += p[i * T + l] * vj[l * D + d];
        o[i * H * D + h * D + d] = acc;
      }
    }
    for (int64_t i = 0; i < T; ++i) {   // dS = P (dP - rows), dP = dO V^T, rows = dO . O
      const float* doi = &dout[i * H * D + h * D];
      double rows = 0;
      for (int64_t d = 0; d < D; ++d) rows += doi[d] * o[i * H * D + h * D + d];
      for (int64_t l = 0; l <= i; ++l) {
        double dp = 0;
        for (int64_t d = 0; d < D; ++d) dp += static_cast<double>(doi[d]) * vj[l * D + d];
        ds[i * T + l] = p[i * T + l] * (dp - rows);
      }
    }
    double *dq = &g[h * T * D], *dk = &g[(H + j) * T * D], *dv = &g[(H + Hk + j) * T * D];
    for (int64_t i = 0; i < T; ++i)
      for (int64_t l = 0; l <= i; ++l)
        for (int64_t d = 0; d < D; ++d) {
          dq[i * D + d] += c * ds[i * T + l] * kj[l * D + d];
          dk[l * D + d] += c * ds[i * T + l] * qh[i * D + d];
          dv[l * D + d] += p[i * T + l] * dout[i * H * D + h * D + d];
        }
  }
}

// out [(T + r) i + o r] = (dx + dh A, dh^T x, s dy^T h), h = x A^T, dh = s dy B.
std::vector<double> lora_backward_reference(const std::vector<float>& dy, const std::vector<float>& x,
                                            const std::vector<float>& a, const std::vector<float>& b,
                                            const std::vector<float>& dx, int64_t T, int64_t in, int64_t o, int64_t r,
                                            double s) {
  std::vector<double> h(static_cast<size_t>(T * r), 0.0), dh(static_cast<size_t>(T * r), 0.0);
  std::vector<double> out(static_cast<size_t>((T + r) * in + o * r), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < r; ++j) {
      for (int64_t k = 0; k < in; ++k) h[t * r + j] += static_cast<double>(x[t * in + k]) * a[j * in + k];
      for (int64_t n = 0; n < o; ++n) dh[t * r + j] += static_cast<double>(dy[t * o + n]) * b[n * r + j];
      dh[t * r + j] *= s;
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < in; ++k) {
      double acc = dx[t * in + k];
      for (int64_t j = 0; j < r; ++j) acc += dh[t * r + j] * a[j * in + k];
      out[t * in + k] = acc;
    }
  for (int64_t j = 0; j < r; ++j)
    for (int64_t k = 0; k < in; ++k)
      for (int64_t t = 0; t < T; ++t) out[T * in + j * in + k] += dh[t * r + j] * x[t * in + k];
  for (int64_t n = 0; n < o; ++n)
    for (int64_t j = 0; j < r; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < T; ++t) acc += static_cast<double>(dy[t * o + n]) * h[t * r + j];
      out[(T + r) * in + n * r + j] = s * acc;
    }
  return out;
}

// lora_linear_a8's float64 value: the W4A8 product as its definition (x rounded per row and group in float32, exact
// integer sums, sum_g isum sw sa), + bias + s (x A^T) B^T + residual (bias, a / b, residual: null when absent); a row
// of x with a NaN or an infinity: NaN throughout. y [T, o]; q, scales, b: o rows from where they point.
std::vector<double> lora_linear_reference(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales,
                                          int64_t o, int64_t ng, int64_t group, const float* bias, const float* a,
                                          const float* b, int64_t r, double s, const float* residual) {
  std::vector<double> exact(static_cast<size_t>(T * o));
  if (a == nullptr) r = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = &x[t * in];
    bool finite = true;
    for (int64_t k = 0; k < in; ++k) finite = finite && std::isfinite(xt[k]);
    std::vector<double> aq(static_cast<size_t>(in)), sa(static_cast<size_t>(ng)), h(static_cast<size_t>(r), 0.0);
    for (int64_t g = 0; g < ng && finite; ++g) {
      float amax = 0;
      for (int64_t k = g * group; k < std::min(in, (g + 1) * group); ++k) amax = std::max(amax, std::fabs(xt[k]));
      const float sg = amax / 127.0f;
      sa[g] = sg;
      for (int64_t k = g * group; k < std::min(in, (g + 1) * group); ++k)
        aq[k] = sg > 0 ? std::min(127.0, std::max(-127.0, static_cast<double>(std::nearbyint(xt[k] / sg)))) : 0.0;
    }
    for (int64_t j = 0; j < r; ++j)
      for (int64_t k = 0; k < in; ++k) h[j] += static_cast<double>(xt[k]) * a[j * in + k];
    for (int64_t n = 0; n < o; ++n) {
      if (!finite) {
        exact[t * o + n] = NAN;
        continue;
      }
      double acc = 0;
      for (int64_t g = 0; g < ng; ++g) {
        double isum = 0;   // an integer, exact in double
        for (int64_t k = g * group; k < std::min(in, (g + 1) * group); ++k) {
          const uint8_t byte = q[n * (in / 2) + k / 2];
          isum += aq[k] * (((k % 2 == 0) ? (byte >> 4) : (byte & 15)) - 8);
        }
        acc += isum * scales[n * ng + g] * sa[g];
      }
      if (bias != nullptr) acc += static_cast<double>(bias[n]);
      if (residual != nullptr) acc += static_cast<double>(residual[t * o + n]);
      double lo = 0;
      for (int64_t j = 0; j < r; ++j) lo += h[j] * b[n * r + j];
      exact[t * o + n] = acc + s * lo;
    }
  }
  return exact;
}

// Parts [begin, end) of a flat output, as a vector (for `within`).
std::vector<double> slice(const std::vector<double>& v, size_t begin, size_t end) {
  return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end));
}

// A failed call: the driver's exit 2 (the kernel refused valid arguments).
bool called(int rc, const char* what, const char* label) {
  if (rc == 0) return true;
  std::fprintf(stderr, "%s: train %s returned %d for valid arguments\n", label, what, rc);
  return false;
}

void append(Op& op, const std::vector<float>& v) { op.out.insert(op.out.end(), v.begin(), v.end()); }

bool attention(Op& fwd, Op& bwd, const char* label, Rng& rng) {
  const int64_t cases[][4] = {{4, 2, 37, 24}, {3, 3, 19, 33}, {2, 1, 1, 8}, {6, 2, 70, 64}, {2, 1, 45, 80}};
  int n = 0;
  for (const auto& c : cases) {
    const int64_t H = c[0], Hk = c[1], T = c[2], D = c[3];
    auto q = rng.normals(H * T * D, 2.0f), k = rng.normals(Hk * T * D, 2.0f), v = rng.normals(Hk * T * D, 1.0f);
    auto dout = rng.normals(T * H * D, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));   // IEEE sqrt and division: the same everywhere
    std::vector<float> o(static_cast<size_t>(T * H * D)), g(static_cast<size_t>((H + 2 * Hk) * T * D));
    int64_t c0 = chunks_now();
    if (!called(toolchain_attention_train(q.data(), k.data(), v.data(), H, Hk, T, D, scale, o.data()),
                "attention_train", label))
      return false;
    fwd.chunks += chunks_now() - c0;
    c0 = chunks_now();
    if (!called(toolchain_attention_train_backward(dout.data(), q.data(), k.data(), v.data(), o.data(), H, Hk, T, D,
                                                   scale, g.data()), "attention_train_backward", label))
      return false;
    bwd.chunks += chunks_now() - c0;
    std::vector<double> eo, eg;
    attention_reference(q, k, v, dout, H, Hk, T, D, scale, eo, eg);
    within(fwd, o.data(), eo, label);
    within(bwd, g.data(), eg, label);
    append(fwd, o);
    append(bwd, g);
    ++fwd.cases, ++bwd.cases;
    if (n++ == 0) {   // the forward with a NaN in query row 5 of head 1: that row of o is NaN, the rest as before
      q[(1 * T + 5) * D + 3] = NAN;
      if (!called(toolchain_attention_train(q.data(), k.data(), v.data(), H, Hk, T, D, scale, o.data()),
                  "attention_train", label))
        return false;
      attention_reference(q, k, v, dout, H, Hk, T, D, scale, eo, eg);
      within(fwd, o.data(), eo, label);
      append(fwd, o);
      ++fwd.cases;
    }
  }
  return true;
}

// g, u, da: scale 4, and a few elements past exp16's clamp (|g| > 88) and non-finite ones.
void swiglu_inputs(Rng& rng, int64_t N, std::vector<float>& g, std::vector<float>& u, std::vector<float>& da) {
  g = rng.normals(N, 4.0f), u = rng.normals(N, 4.0f), da = rng.normals(N, 4.0f);
  if (N > 5) g[1] = 100.0f, g[2] = -100.0f, g[3] = 87.5f, g[4] = -90.0f;
  if (N > 7) {
    g[N - 1] = NAN, g[N / 2] = INFINITY, g[N / 3] = -INFINITY, u[N / 4] = NAN, da[5] = INFINITY;
  }
}

bool swiglu_ops(Op& train, Op& fwd, const char* label, Rng& rng) {
  std::vector<float> g, u, da;
  for (int64_t N : {7, 1029, 5003}) {
    swiglu_inputs(rng, N, g, u, da);
    std::vector<float> out(static_cast<size_t>(3 * N));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_swiglu_train(g.data(), u.data(), da.data(), N, out.data()), "swiglu_train", label))
      return false;
    train.chunks += chunks_now() - c0;
    append(train, out);
    ++train.cases;
  }
  for (int64_t N : {13, 65541}) {
    swiglu_inputs(rng, N, g, u, da);
    std::vector<float> out(static_cast<size_t>(N));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_swiglu(g.data(), u.data(), N, out.data()), "swiglu", label)) return false;
    fwd.chunks += chunks_now() - c0;
    append(fwd, out);
    ++fwd.cases;
  }
  return true;
}

bool rms_norm(Op& op, const char* label, Rng& rng) {
  const int64_t cases[][2] = {{37, 896}, {5, 13}, {64, 300}};
  for (const auto& c : cases) {
    const int64_t T = c[0], d = c[1];
    auto x = rng.normals(T * d, 8.0f), w = rng.normals(d, 1.0f);
    if (T > 3) {
      x[1 * d + d / 2] = NAN;                                    // row 1: NaN everywhere
      x[2 * d + 1] = INFINITY;                                   // row 2: r = 0: NaN at the inf, +-0 elsewhere
      for (int64_t k = 0; k < d; ++k) x[3 * d + k] = 0.0f;       // row 3: zero (r = 1 / sqrt(eps))
    }
    std::vector<float> y(static_cast<size_t>(T * d));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_rms_norm(x.data(), T, d, w.data(), 1e-6f, y.data()), "rms_norm", label)) return false;
    op.chunks += chunks_now() - c0;
    append(op, y);
    ++op.cases;
  }
  return true;
}

bool softmax(Op& stats, Op& exps, const char* label, Rng& rng) {
  const int64_t cases[][3] = {{37, 1029, 0}, {5, 37, 1}, {3, 16, 0}};   // C, V, first chunk
  for (const auto& c : cases) {
    const int64_t C = c[0], V = c[1];
    const bool first = c[2] != 0;
    auto z = rng.normals(C * V, 8.0f);
    std::vector<float> m(static_cast<size_t>(C)), s(static_cast<size_t>(C));
    for (int64_t t = 0; t < C; ++t) {
      m[t] = first ? -INFINITY : rng.normal(8.0f);
      s[t] = first ? 0.0f : static_cast<float>(rng.next() >> 44) * 0x1p-14f;   // [0, 64)
    }
    if (C > 3) {
      z[0 * V + V / 2] = NAN;                                    // row 0: a NaN
      z[1 * V + 3] = INFINITY;                                   // row 1: an infinity (m' = inf)
      for (int64_t k = 0; k < V; ++k) z[2 * V + k] = -INFINITY;  // row 2: all -inf
    }
    std::vector<float> st(static_cast<size_t>(3 * C)), p(static_cast<size_t>(C * V));
    int64_t c0 = chunks_now();
    if (!called(toolchain_online_softmax_stats(z.data(), m.data(), s.data(), C, V, st.data()),
                "online_softmax_stats", label))
      return false;
    stats.chunks += chunks_now() - c0;
    std::vector<float> mn(static_cast<size_t>(C));
    for (int64_t t = 0; t < C; ++t) mn[t] = st[3 * t];   // exp(z - m') with the stats' m', as head_loss calls it
    c0 = chunks_now();
    if (!called(toolchain_exp_sub_rows(z.data(), mn.data(), C, V, p.data()), "exp_sub_rows", label)) return false;
    exps.chunks += chunks_now() - c0;
    append(stats, st);
    append(exps, p);
    ++stats.cases, ++exps.cases;
  }
  return true;
}

bool lora(Op& back, Op& rows, const char* label, Rng& rng) {
  const int64_t cases[][4] = {{37, 200, 70, 3}, {1, 5, 7, 1}, {70, 130, 65, 16}, {33, 896, 128, 8}};
  for (const auto& c : cases) {
    const int64_t T = c[0], in = c[1], o = c[2], r = c[3];
    auto dy = rng.normals(T * o, 1.0f), x = rng.normals(T * in, 1.0f), a = rng.normals(r * in, 0.0625f);
    auto b = rng.normals(o * r, 0.25f), dx = rng.normals(T * in, 1.0f);
    if (T > 2) dx[1 * in + in / 3] = NAN, dx[2 * in] = -INFINITY;   // rows of the frozen dX: NaN / inf in place
    const float s = 2.0f / static_cast<float>(r);
    std::vector<float> out(static_cast<size_t>((T + r) * in + o * r));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_lora_backward(dy.data(), x.data(), a.data(), b.data(), dx.data(), T, in, o, r, s,
                                        out.data()), "lora_backward", label))
      return false;
    back.chunks += chunks_now() - c0;
    const auto exact = lora_backward_reference(dy, x, a, b, dx, T, in, o, r, s);
    const size_t e1 = static_cast<size_t>(T * in), e2 = static_cast<size_t>((T + r) * in);
    within(back, out.data(), slice(exact, 0, e1), label);                     // dx + dh A
    within(back, out.data() + e1, slice(exact, e1, e2), label);               // dA
    within(back, out.data() + e2, slice(exact, e2, exact.size()), label);     // dB
    append(back, out);
    ++back.cases;
  }
  const int64_t rcases[][3] = {{37, 70, 3}, {33, 256, 8}, {1, 9, 2}};
  for (const auto& c : rcases) {
    const int64_t T = c[0], C = c[1], r = c[2];
    auto dy = rng.normals(T * C, 1.0f), h = rng.normals(T * r, 2.0f), b = rng.normals(C * r, 0.25f);
    std::vector<float> out(static_cast<size_t>((C + T) * r));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_lora_rows_backward(dy.data(), h.data(), b.data(), T, C, r, 0.5f, out.data()),
                "lora_rows_backward", label))
      return false;
    rows.chunks += chunks_now() - c0;
    std::vector<double> edb(static_cast<size_t>(C * r), 0.0), edh(static_cast<size_t>(T * r), 0.0);
    for (int64_t n = 0; n < C; ++n)   // s dy^T h, then s dy b
      for (int64_t j = 0; j < r; ++j) {
        for (int64_t t = 0; t < T; ++t) edb[n * r + j] += static_cast<double>(dy[t * C + n]) * h[t * r + j];
        edb[n * r + j] *= 0.5;
      }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < r; ++j) {
        for (int64_t n = 0; n < C; ++n) edh[t * r + j] += static_cast<double>(dy[t * C + n]) * b[n * r + j];
        edh[t * r + j] *= 0.5;
      }
    within(rows, out.data(), edb, label);
    within(rows, out.data() + C * r, edh, label);
    append(rows, out);
    ++rows.cases;
  }
  return true;
}

bool lora_linear(Op& op, const char* label, Rng& rng) {
  // T, in, o, group, r (0: no LoRA pair), bias and residual
  const int64_t cases[][6] = {{1, 200, 70, 64, 8, 1}, {9, 896, 45, 32, 8, 1}, {37, 130, 33, 128, 3, 0},
                              {3, 96, 17, 96, 0, 1},  {13, 70, 40, 10, 4, 1}, {40, 2080, 48, 96, 8, 1}};
  for (const auto& c : cases) {
    const int64_t T = c[0], in = c[1], o = c[2], group = c[3], r = c[4], ng = (in + group - 1) / group;
    const bool extras = c[5] != 0;
    auto x = rng.normals(T * in, 2.0f);
    std::vector<uint8_t> q(static_cast<size_t>(o * in / 2));
    for (uint8_t& byte : q) byte = static_cast<uint8_t>(rng.next() >> 56);
    std::vector<float> scales(static_cast<size_t>(o * ng));
    for (float& sc : scales) sc = static_cast<float>(rng.integer(12)) * 0x1p-16f;   // both signs, some 0
    auto bias = rng.normals(o, 1.0f), a = rng.normals(r * in, 0.0625f), b = rng.normals(o * r, 0.25f);
    auto residual = rng.normals(T * o, 4.0f);
    if (T > 2) x[1 * in + 7] = NAN, x[2 * in + in - 1] = INFINITY;   // rows 1, 2: NaN in every output of the row
    std::vector<float> y(static_cast<size_t>(T * o));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_lora_linear_a8(x.data(), T, in, q.data(), scales.data(), o, ng, group,
                                         extras ? bias.data() : nullptr, r > 0 ? a.data() : nullptr,
                                         r > 0 ? b.data() : nullptr, r, 0.5f, extras ? residual.data() : nullptr,
                                         y.data()), "lora_linear_a8", label))
      return false;
    op.chunks += chunks_now() - c0;
    within(op, y.data(), lora_linear_reference(x.data(), T, in, q.data(), scales.data(), o, ng, group,
                                               extras ? bias.data() : nullptr, r > 0 ? a.data() : nullptr,
                                               r > 0 ? b.data() : nullptr, r, 0.5, extras ? residual.data() : nullptr),
           label);
    append(op, y);
    ++op.cases;
  }
  return true;
}

// lora_linear_a8_rows: rows [row0, row0 + rows) of W (q, scales) and of B in place, no bias or residual; its float64
// value is lora_linear_reference on those rows. (T, in, o, group, row0, rows, r): a decode row of rank 8 (B read in
// place), odd row counts and offsets, the last rows of W, no LoRA (r = 0), the generic rows (group 10), a call the
// pooled build splits; NaN / inf rows of x.
bool lora_linear_rows(Op& op, const char* label, Rng& rng) {
  const int64_t cases[][7] = {{1, 200, 70, 64, 13, 40, 8}, {37, 130, 77, 32, 5, 71, 3}, {9, 96, 40, 96, 0, 40, 0},
                              {13, 70, 50, 10, 49, 1, 4},  {40, 2080, 96, 96, 48, 48, 8}};
  for (const auto& c : cases) {
    const int64_t T = c[0], in = c[1], o = c[2], group = c[3], row0 = c[4], rows = c[5], r = c[6];
    const int64_t ng = (in + group - 1) / group;
    auto x = rng.normals(T * in, 2.0f);
    std::vector<uint8_t> q(static_cast<size_t>(o * in / 2));
    for (uint8_t& byte : q) byte = static_cast<uint8_t>(rng.next() >> 56);
    std::vector<float> scales(static_cast<size_t>(o * ng));
    for (float& sc : scales) sc = static_cast<float>(rng.integer(12)) * 0x1p-16f;   // both signs, some 0
    auto a = rng.normals(r * in, 0.0625f), b = rng.normals(o * r, 0.25f);
    if (T > 2) x[1 * in + 3] = -INFINITY, x[2 * in + in / 2] = NAN;   // rows 1, 2: NaN in every output of the row
    std::vector<float> y(static_cast<size_t>(T * rows));
    const float* pa = r > 0 ? a.data() : nullptr;
    const float* pb = r > 0 ? b.data() : nullptr;
    const int64_t c0 = chunks_now();
    if (!called(toolchain_lora_linear_a8_rows(x.data(), T, in, q.data(), scales.data(), o, ng, group, row0, rows, pa,
                                              pb, r, 0.5f, y.data()), "lora_linear_a8_rows", label))
      return false;
    op.chunks += chunks_now() - c0;
    within(op, y.data(), lora_linear_reference(x.data(), T, in, q.data() + row0 * (in / 2), scales.data() + row0 * ng,
                                               rows, ng, group, nullptr, pa, pb ? pb + row0 * r : nullptr, r, 0.5,
                                               nullptr), label);
    append(op, y);
    ++op.cases;
  }
  return true;
}

// rope_train (T, n, D) and rope_train_backward (N, start, T, n, D): element-wise (no sum, no float64 reference);
// tables cos / sin as deterministic values in (-1, 1) (not libm's: the op reads them as given); NaN / inf in x / dy
// (the pair i, i + D/2 of that head and token: NaN or inf there, the rest finite) and in the tables.
bool rope(Op& fwd, Op& bwd, const char* label, Rng& rng) {
  const int64_t cases[][5] = {{3, 0, 37, 3, 24}, {1, 0, 1, 1, 2}, {7, 2, 19, 5, 130}, {12, 8, 70, 4, 128}};
  for (const auto& c : cases) {
    const int64_t N = c[0], start = c[1], T = c[2], n = c[3], D = c[4];
    auto x = rng.normals(T * n * D, 4.0f), dy = rng.normals(N * T * D, 4.0f);
    auto cs = rng.normals(T * D, 0.5f), sn = rng.normals(T * D, 0.5f);
    if (T > 2) {
      x[1 * n * D + D / 2 - 1] = NAN, x[2 * n * D + D - 1] = INFINITY;
      dy[(start * T + 1) * D] = -INFINITY, dy[((start + n - 1) * T + 2) * D + D / 2] = NAN;
      cs[3 * D + 1] = NAN, sn[4 * D + D - 2] = INFINITY;
    }
    std::vector<float> o(static_cast<size_t>(n * T * D)), g(static_cast<size_t>(T * n * D));
    int64_t c0 = chunks_now();
    if (!called(toolchain_rope_train(x.data(), cs.data(), sn.data(), T, n, D, o.data()), "rope_train", label))
      return false;
    fwd.chunks += chunks_now() - c0;
    c0 = chunks_now();
    if (!called(toolchain_rope_train_backward(dy.data(), cs.data(), sn.data(), N, start, T, n, D, g.data()),
                "rope_train_backward", label))
      return false;
    bwd.chunks += chunks_now() - c0;
    append(fwd, o);
    append(bwd, g);
    ++fwd.cases, ++bwd.cases;
  }
  return true;
}

// rms_norm_backward (T, d, which of dy2 / dy3 / residual): out = residual + r (g - xhat mean_k(g_k xhat_k)),
// g = ((dy + dy2) + dy3) w, r = 1 / sqrt(mean_k x_k^2 + eps), xhat = x r; float64 reference of that definition.
// Rows: a NaN in x, an inf in x (r = 0: xhat NaN at the inf, so the whole row NaN), a zero row, a NaN in dy (its row
// NaN), an inf in dy3.
bool rms_norm_backward(Op& op, const char* label, Rng& rng) {
  const int64_t cases[][3] = {{37, 896, 7}, {5, 13, 0}, {64, 300, 1}, {1, 17, 6}, {9, 40, 2}};   // bits: dy2 dy3 res
  const float eps = 1e-6f;
  for (const auto& c : cases) {
    const int64_t T = c[0], d = c[1];
    const bool has2 = c[2] & 1, has3 = c[2] & 2, hasr = c[2] & 4;
    auto x = rng.normals(T * d, 8.0f), w = rng.normals(d, 1.0f), dy = rng.normals(T * d, 1.0f);
    auto dy2 = rng.normals(T * d, 1.0f), dy3 = rng.normals(T * d, 1.0f), res = rng.normals(T * d, 4.0f);
    if (T > 5) {
      x[1 * d + d / 2] = NAN;
      x[2 * d + 1] = INFINITY;
      for (int64_t k = 0; k < d; ++k) x[3 * d + k] = 0.0f;
      dy[4 * d + d - 1] = NAN;
      dy3[5 * d + 2] = -INFINITY;
    }
    std::vector<float> out(static_cast<size_t>(T * d));
    const int64_t c0 = chunks_now();
    if (!called(toolchain_rms_norm_backward(x.data(), w.data(), dy.data(), has2 ? dy2.data() : nullptr,
                                            has3 ? dy3.data() : nullptr, hasr ? res.data() : nullptr, T, d, eps,
                                            out.data()), "rms_norm_backward", label))
      return false;
    op.chunks += chunks_now() - c0;
    std::vector<double> exact(static_cast<size_t>(T * d)), g(static_cast<size_t>(d)), xh(static_cast<size_t>(d));
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0, gx = 0;
      for (int64_t k = 0; k < d; ++k) ss += static_cast<double>(x[t * d + k]) * x[t * d + k];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      for (int64_t k = 0; k < d; ++k) {
        const size_t i = static_cast<size_t>(t * d + k);
        g[k] = (static_cast<double>(dy[i]) + (has2 ? dy2[i] : 0.0) + (has3 ? dy3[i] : 0.0)) * w[k];
        xh[k] = x[i] * r;
        gx += g[k] * xh[k];
      }
      const double mean = gx / static_cast<double>(d);
      for (int64_t k = 0; k < d; ++k)
        exact[t * d + k] = (hasr ? res[t * d + k] : 0.0) + r * (g[k] - xh[k] * mean);
    }
    within(op, out.data(), exact, label);
    append(op, out);
    ++op.cases;
  }
  return true;
}

uint32_t bits(float v) {
  if (std::isnan(v)) return 0x7fc00000u;   // one NaN (see the top)
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

using arm64_check::read_all;
using arm64_check::ulps;

}  // namespace

// The train ops on their cases, one line per op and a summary line (see the top). `write`: a file for the x86
// outputs (b"TCTRAIN1", int64 ops, per op int64 name length, the name, int64 n, n float32); `compare`: such a file
// to compare with. An op passes when its float64 reference's bound holds (the ops that have one) and, with
// `compare`, when every output equals x86's bit for bit (NaN = NaN) or, for an op with a float64 reference, differs
// within that bound. Returns 0 when every op passed, 1 when one did not, 2 when a call or the file failed.
int check_train_ops(const char* label, const char* path, const char* write, const char* compare) {
  Rng rng{20261207};
  std::vector<Op> ops(14);
  const char* names[] = {"attention_train", "attention_train_backward", "swiglu_train", "swiglu", "rms_norm",
                         "online_softmax_stats", "exp_sub_rows", "lora_backward", "lora_rows_backward",
                         "lora_linear_a8", "lora_linear_a8_rows", "rope_train", "rope_train_backward",
                         "rms_norm_backward"};
  for (size_t i = 0; i < ops.size(); ++i) ops[i].name = names[i];
  if (!attention(ops[0], ops[1], label, rng) || !swiglu_ops(ops[2], ops[3], label, rng) ||
      !rms_norm(ops[4], label, rng) || !softmax(ops[5], ops[6], label, rng) || !lora(ops[7], ops[8], label, rng) ||
      !lora_linear(ops[9], label, rng) || !lora_linear_rows(ops[10], label, rng) ||
      !rope(ops[11], ops[12], label, rng) || !rms_norm_backward(ops[13], label, rng))
    return 2;

  std::vector<std::vector<float>> ref;   // the x86 outputs, per op
  if (compare != nullptr) {
    std::FILE* f = std::fopen(compare, "rb");
    char magic[8];
    int64_t n_ops = 0;
    if (!f || !read_all(f, magic, 8) || std::memcmp(magic, "TCTRAIN1", 8) || !read_all(f, &n_ops, 8) ||
        n_ops != static_cast<int64_t>(ops.size())) {
      std::fprintf(stderr, "%s: %s is not a train-ops file of these %zu ops\n", label, compare, ops.size());
      if (f) std::fclose(f);
      return 2;
    }
    for (const Op& op : ops) {
      int64_t len = 0, n = 0;
      std::string name;
      bool ok = read_all(f, &len, 8) && len > 0 && len < 64;
      if (ok) {
        name.resize(static_cast<size_t>(len));
        ok = read_all(f, &name[0], static_cast<size_t>(len)) && read_all(f, &n, 8);
      }
      if (!ok || name != op.name || n != static_cast<int64_t>(op.out.size())) {
        std::fprintf(stderr, "%s: %s: op %s missing or of another size\n", label, compare, op.name.c_str());
        std::fclose(f);
        return 2;
      }
      ref.emplace_back(static_cast<size_t>(n));
      if (!read_all(f, ref.back().data(), static_cast<size_t>(n) * 4)) {
        std::fprintf(stderr, "%s: %s: truncated\n", label, compare);
        std::fclose(f);
        return 2;
      }
    }
    std::fclose(f);
  }

  uint64_t all = 1469598103934665603ull;
  int64_t total = 0, total_equal = 0, ops_equal = 0;
  std::string bounded, failed;   // ops that differ from x86 within their float64 bound; ops that fail
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    uint64_t hash = 1469598103934665603ull;
    int64_t nans = 0, equal = 0, nan_bits_equal = 0, ref_nans = 0, worst_ulps = 0;
    double amax = 0, worst_abs = 0;
    for (size_t e = 0; e < op.out.size(); ++e) {
      const float v = op.out[e];
      const uint32_t b = bits(v);
      for (int k = 0; k < 4; ++k) {
        hash = (hash ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
        all = (all ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
      }
      nans += std::isnan(v);
      if (std::isfinite(v)) amax = std::max(amax, static_cast<double>(std::fabs(v)));
      if (compare == nullptr) continue;
      const float w = ref[i][e];
      if (bits(v) == bits(w)) {
        ++equal;
        if (std::isnan(w)) ++ref_nans, nan_bits_equal += std::memcmp(&v, &w, 4) == 0;
      } else if (std::isfinite(v) && std::isfinite(w)) {
        worst_ulps = std::max(worst_ulps, ulps(v, w));
        worst_abs = std::max(worst_abs, std::fabs(static_cast<double>(v) - w));
      } else {
        worst_ulps = INT64_MAX;   // a NaN or an infinity where x86 has another value
      }
    }
    const bool ref_ok = op.parts_ok == op.parts, all_equal = equal == static_cast<int64_t>(op.out.size());
    total += static_cast<int64_t>(op.out.size());
    total_equal += equal;
    std::printf("%s (%s path) train %s: %" PRId64 " cases, %zu outputs (%" PRId64 " NaN); ", label, path,
                op.name.c_str(), op.cases, op.out.size(), nans);
    if (op.parts > 0)
      std::printf("float64 bound held on %" PRId64 "/%" PRId64 " parts (max err/bound %.2g); ", op.parts_ok, op.parts,
                  op.worst);
    if (compare != nullptr)
      std::printf("bitwise equal to x86 on %" PRId64 "/%zu outputs (NaN = NaN; NaN bits equal on %" PRId64 "/%" PRId64
                  "), max difference %" PRId64 " ulp, %.3g of max |output| %.3g; ", equal, op.out.size(),
                  nan_bits_equal, ref_nans, worst_ulps, amax > 0 ? worst_abs / amax : 0.0, amax);
    std::printf("pool chunks %" PRId64 "; hash %016" PRIx64 "\n", op.chunks, hash);
    if (!ref_ok)
      failed += " " + op.name + " (float64 bound held on " + std::to_string(op.parts_ok) + "/" +
                std::to_string(op.parts) + " parts: stderr)";
    else if (compare != nullptr && !all_equal && op.parts == 0)
      failed += " " + op.name + " (not equal to x86, no float64 reference)";
    else if (compare != nullptr && !all_equal)
      bounded += " " + op.name;
    ops_equal += compare != nullptr && all_equal;
  }
  std::printf("%s (%s path) train ops: %zu ops, %" PRId64 " outputs", label, path, ops.size(), total);
  if (compare != nullptr)
    std::printf("; bitwise equal to x86 on %" PRId64 "/%" PRId64 " outputs, %" PRId64 "/%zu ops; differing from x86 "
                "within the float64 bound:%s", total_equal, total, ops_equal, ops.size(), bounded.empty() ? " none" : bounded.c_str());
  std::printf("; outputs hash %016" PRIx64 "\n", all);
  if (!failed.empty())
    std::printf("%s (%s path) train ops FAILED:%s\n", label, path, failed.c_str());
  else
    std::printf("%s (%s path) train ops passed\n", label, path);

  if (write != nullptr) {
    std::FILE* f = std::fopen(write, "wb");
    const int64_t n_ops = static_cast<int64_t>(ops.size());
    bool ok = f && std::fwrite("TCTRAIN1", 1, 8, f) == 8 && std::fwrite(&n_ops, 8, 1, f) == 1;
    for (const Op& op : ops) {
      const int64_t len = static_cast<int64_t>(op.name.size()), n = static_cast<int64_t>(op.out.size());
      ok = ok && std::fwrite(&len, 8, 1, f) == 1 && std::fwrite(op.name.data(), 1, op.name.size(), f) == op.name.size() &&
           std::fwrite(&n, 8, 1, f) == 1 && std::fwrite(op.out.data(), 4, op.out.size(), f) == op.out.size();
    }
    if (f) ok = std::fclose(f) == 0 && ok;
    if (!ok) {
      std::fprintf(stderr, "%s: could not write %s\n", label, write);
      return 2;
    }
  }
  return failed.empty() ? 0 : 1;
}
