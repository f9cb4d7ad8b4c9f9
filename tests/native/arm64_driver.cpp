// Checks a build of toolchain/native/kernels.cpp (linked in, built with TOOLCHAIN_NO_EXECUTORCH) on the
// cases of tests/native/make_arm64_cases.py; run by scripts/check_kernel_arm64.sh under qemu-aarch64, once per
// kernel path (TOOLCHAIN_KERNEL_PATH) and CPU model.
//
//   arm64_driver CASES [LABEL [DYW_CASES [TRAIN_X86]]]
//   arm64_driver --train LABEL (--write FILE | --compare FILE)
//
// First line: "LABEL: kernel path NAME" (toolchain_kernel_path()), or, when the path forced by
// TOOLCHAIN_KERNEL_PATH is refused (kernels.cpp's convention: the kernel returns -2 for a valid call and
// toolchain_kernel_path_error() says why), "LABEL: kernel path refused ..." on stdout and one
// "Error: LABEL: <the library's reason>" line on stderr (exit 3).
// For each case: (a) the kernel's y against its definition in float64 (x quantized per row and group as the
// kernel's top comment says, sa = max|x| / 127 in float32, a = round-to-even(x / sa); the
// integer sums isum_g = sum_k a_k (n_k - 8) exact; y = sum_g isum_g sw_g sa_g in double), within the float32
// bound of the group sum |err| <= gamma_(ng+6) * sum_g |isum_g sw_g sa_g|, gamma_k = k u / (1 - k u), u = 2^-24
// (as tests/native/test_kernels.py); a row of x with a NaN or an infinity must give NaN in every output (its
// group scale is NaN or infinite and its int8 values 0: 0 times that scale); (b) y against the x86-64 kernel's
// y stored in the file, bit for bit (NaN counted equal to NaN: x86 and arm64 generate different default NaNs
// for 0 * inf), and the largest difference in ulps where not; (c) a 64-bit FNV-1a hash of every output's bits
// in order ("outputs hash"), which scripts/check_kernel_arm64.sh compares across paths, CPU models and
// compilers; in the pooled build (linked with arm64_pool.cpp), the count of row chunks the pool ran.
// DYW_CASES (tests/native/make_arm64_cases.py --dyw): the same three checks of toolchain_int4_dyw_a8 (dx = dy W,
// kernels.cpp's "dX for training"), on a line of their own ("LABEL (PATH path) dyw: ..."): dy quantized per row
// and block of `group` n as above, W^T requantized to int8 per (k-group g, block b) (swt = max_n |sw[n, g]| / 15.875,
// e = sw / swt in float32, Wt8 = round-half-even(e (n - 8)) in [-127, 127]), the exact integer sums, dx = sum_b
// isum * float32(sa swt) in double, within gamma_(nb+6) * sum_b |isum sa swt| (nb = ceil(o / group)); a row of dy
// with a NaN or an infinity gives NaN in every output.
// TRAIN_X86, and the --train form: the training step's float32 ops (attention_train, attention_train_backward,
// swiglu_train, swiglu, rms_norm, online_softmax_stats, exp_sub_rows, lora_backward, lora_rows_backward,
// lora_linear_a8, lora_linear_a8_rows, rope_train, rope_train_backward, rms_norm_backward) on the deterministic
// cases of tests/native/arm64_train_ops.cpp, one line per op ("LABEL (PATH path) train OP: ...") and a summary
// ("... train ops: ..."): outputs hash (NaN counted as one NaN), the pool's chunks per op, and against the x86
// build's outputs (the file --write made there) the count equal bit for bit.
// Exit 0 if (a) held everywhere (and every train output equals x86's), 1 if not, 2 for a bad file or a refused
// valid call.
//
// Build this file with -ffp-contract=off: the reference's double sums are then plain products and sums.

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "arm64_check_util.h"

extern "C" int toolchain_int4_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales,
                                        int64_t o, int64_t ng, int64_t group, float* y);
extern "C" int toolchain_int4_dyw_a8(const float* dy, int64_t T, int64_t o, const uint8_t* q, const float* scales,
                                     int64_t in, int64_t ng, int64_t group, float* dx);
extern "C" int toolchain_int4_dyw_a8_acc(const float* dy, int64_t T, int64_t o, const uint8_t* q, const float* scales,
                                         int64_t in, int64_t ng, int64_t group, int64_t row0, const float* add,
                                         float* dx);
extern "C" const char* toolchain_kernel_path();
extern "C" const char* toolchain_kernel_path_error();
// tests/native/arm64_train_ops.cpp: the train ops' check (its top comment); 0, 1 or 2 as this driver's exit.
int check_train_ops(const char* label, const char* path, const char* write, const char* compare);
// kernels.cpp: the units it ran over more than one thread (0 in a build without TOOLCHAIN_THREADPOOL).
extern "C" int64_t toolchain_pool_units() __attribute__((weak));

namespace {

using arm64_check::read_all;
using arm64_check::ulps;

// The DYW_CASES file: magic "TCDYCAS1", int64 count, per case int64 T, o, i, group, ng, then dy f32 [T, o],
// q u8 [o, i/2], scales f32 [o, ng], dx f32 [T, i] (the x86 kernel's). Returns the exit code's part: 0, 1, 2.
int check_dyw(const char* file, const char* label, const char* path) {
  std::FILE* f = std::fopen(file, "rb");
  char magic[8];
  int64_t count = 0;
  if (!f || !read_all(f, magic, 8) || std::memcmp(magic, "TCDYCAS1", 8) || !read_all(f, &count, 8) || count < 0) {
    std::fprintf(stderr, "%s: %s is not a dyw case file\n", label, file);
    return 2;
  }
  const double u = std::ldexp(1.0, -24);
  int64_t bound_ok = 0, bit_equal = 0, elems = 0, elems_equal = 0, worst_ulps = 0, shown = 0, nan_rows = 0;
  uint64_t hash = 1469598103934665603ull;
  double worst_ratio = 0;
  int64_t acc_equal = 0;   // cases whose toolchain_int4_dyw_a8_acc is add + dx bit for bit
  for (int64_t c = 0; c < count; ++c) {
    int64_t h[5];
    if (!read_all(f, h, sizeof h)) {
      std::fprintf(stderr, "%s: dyw case %" PRId64 ": truncated header\n", label, c);
      return 2;
    }
    const int64_t T = h[0], o = h[1], in = h[2], group = h[3], ng = h[4];
    if (T < 0 || o <= 0 || in <= 0 || in % 2 || group < 2 || T > (1 << 20) || o > (1 << 20) || in > (1 << 24) ||
        ng != (in + group - 1) / group) {
      std::fprintf(stderr, "%s: dyw case %" PRId64 ": bad shape\n", label, c);
      return 2;
    }
    std::vector<float> dy(T * o), s(o * ng), dx86(T * in), dx(T * in, std::nanf(""));
    std::vector<uint8_t> q(o * in / 2);
    if (!read_all(f, dy.data(), dy.size() * 4) || !read_all(f, q.data(), q.size()) ||
        !read_all(f, s.data(), s.size() * 4) || !read_all(f, dx86.data(), dx86.size() * 4)) {
      std::fprintf(stderr, "%s: dyw case %" PRId64 ": truncated data\n", label, c);
      return 2;
    }
    if (toolchain_int4_dyw_a8(dy.data(), T, o, q.data(), s.data(), in, ng, group, dx.data()) != 0) {
      std::fprintf(stderr, "%s: dyw case %" PRId64 ": the kernel refused valid arguments\n", label, c);
      return 2;
    }
    {   // toolchain_int4_dyw_a8_acc: add + dy W is add + dx bit for bit (NaN = NaN), into another buffer and in place
      std::vector<float> add(T * in), acc(T * in, std::nanf("")), inplace(T * in);
      for (int64_t j = 0; j < T * in; ++j)
        add[j] = std::ldexp(static_cast<float>(static_cast<int64_t>((j * 2654435761u) % 2001u) - 1000), -8 - (j % 5));
      if (T * in > 2) add[1] = std::nanf(""), add[2] = -INFINITY;
      inplace = add;
      bool same = toolchain_int4_dyw_a8_acc(dy.data(), T, o, q.data(), s.data(), in, ng, group, 0, add.data(),
                                            acc.data()) == 0 &&
                  toolchain_int4_dyw_a8_acc(dy.data(), T, o, q.data(), s.data(), in, ng, group, 0, inplace.data(),
                                            inplace.data()) == 0;
      for (int64_t j = 0; j < T * in && same; ++j) {
        const float want = add[j] + dx[j];
        same = (std::isnan(want) && std::isnan(acc[j]) && std::isnan(inplace[j])) ||
               (std::memcmp(&want, &acc[j], 4) == 0 && std::memcmp(&want, &inplace[j], 4) == 0);
      }
      acc_equal += same;
      if (!same && shown++ < 10) std::fprintf(stderr, "%s: dyw case %" PRId64 ": acc + dy W is not acc + dx\n", label, c);
    }
    for (float v : dx) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      for (int k = 0; k < 4; ++k) hash = (hash ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
    const int64_t nb = (o + group - 1) / group;
    const double gamma = (nb + 6) * u / (1 - (nb + 6) * u);
    std::vector<int> w(o * in);   // n - 8
    for (int64_t n = 0; n < o; ++n)
      for (int64_t k = 0; k < in; ++k)
        w[n * in + k] = ((k % 2 == 0) ? (q[n * (in / 2) + k / 2] >> 4) : (q[n * (in / 2) + k / 2] & 15)) - 8;
    bool ok = true, equal = true;
    std::vector<double> a(o), sa(nb), exact(in), mag(in);
    for (int64_t t = 0; t < T; ++t) {
      bool finite = true;
      for (int64_t n = 0; n < o; ++n) finite = finite && std::isfinite(dy[t * o + n]);
      if (!finite) ++nan_rows;
      std::fill(exact.begin(), exact.end(), 0.0);
      std::fill(mag.begin(), mag.end(), 0.0);
      for (int64_t b = 0; b < nb && finite; ++b) {   // dy quantized per block of `group` n (float32)
        const int64_t n0 = b * group, n1 = std::min(o, n0 + group);
        float amax = 0;
        for (int64_t n = n0; n < n1; ++n) amax = std::max(amax, std::fabs(dy[t * o + n]));
        const float sg = amax / 127.0f;
        sa[b] = sg;
        for (int64_t n = n0; n < n1; ++n)
          a[n] = sg > 0 ? std::min(127.0, std::max(-127.0, static_cast<double>(std::nearbyint(dy[t * o + n] / sg)))) : 0.0;
        for (int64_t g = 0; g < ng; ++g) {   // W^T requantized: swt = max |sw| / 15.875, Wt8 = round(e (n - 8))
          float m = 0;
          for (int64_t n = n0; n < n1; ++n) m = std::max(m, std::fabs(s[n * ng + g]));
          const float swt = m / 15.875f;
          const double c = static_cast<double>(sg * swt);   // a float32 product
          for (int64_t k = g * group; k < std::min(in, (g + 1) * group); ++k) {
            double isum = 0;   // an integer, exact in double
            for (int64_t n = n0; n < n1; ++n) {
              const float e = swt > 0 ? s[n * ng + g] / swt : 0.0f;
              const double wt8 = std::min(127.0, std::max(-127.0, std::nearbyint(static_cast<double>(e) * w[n * in + k])));
              isum += a[n] * wt8;
            }
            exact[k] += isum * c;
            mag[k] += std::fabs(isum * c);
          }
        }
      }
      for (int64_t k = 0; k < in; ++k) {
        const float got = dx[t * in + k], ref86 = dx86[t * in + k];
        ++elems;
        if (!finite) {
          if (!std::isnan(got)) {
            ok = false;
            if (shown++ < 10)
              std::fprintf(stderr, "%s: dyw case %" PRId64 " row %" PRId64 " has a NaN / inf but dx[%" PRId64
                           "] = %.9g\n", label, c, t, k, got);
          }
          if (std::isnan(got) && std::isnan(ref86)) ++elems_equal;
          else equal = false, worst_ulps = INT64_MAX;
          continue;
        }
        const double err = std::fabs(static_cast<double>(got) - exact[k]), bound = gamma * mag[k];
        if (!(err <= bound)) {
          ok = false;
          if (shown++ < 10)
            std::fprintf(stderr, "%s: dyw case %" PRId64 " (T %" PRId64 " o %" PRId64 " i %" PRId64 " group %" PRId64
                         ") dx[%" PRId64 ", %" PRId64 "] = %.9g, exact %.17g: err %.3g > bound %.3g\n",
                         label, c, T, o, in, group, t, k, got, exact[k], err, bound);
        }
        if (bound > 0 && err / bound > worst_ratio) worst_ratio = err / bound;
        if (std::memcmp(&got, &ref86, 4) == 0) {
          ++elems_equal;
        } else {
          equal = false;
          const int64_t d = std::isfinite(got) && std::isfinite(ref86) ? ulps(got, ref86) : INT64_MAX;
          if (d > worst_ulps) worst_ulps = d;
        }
      }
    }
    bound_ok += ok;
    bit_equal += equal;
  }
  std::fclose(f);
  std::printf("%s (%s path) dyw: float32 bound held on %" PRId64 "/%" PRId64 " cases (max err/bound %.3f; %" PRId64
              " rows with NaN / inf all NaN); bitwise equal to x86 on %" PRId64 "/%" PRId64 " cases, %" PRId64 "/%" PRId64
              " outputs; max difference %" PRId64 " ulp; outputs hash %016" PRIx64 "\n",
              label, path, bound_ok, count, worst_ratio, nan_rows, bit_equal, count, elems_equal, elems, worst_ulps,
              hash);
  std::printf("%s (%s path) dyw_acc: acc + dy W equal to acc + dx on %" PRId64 "/%" PRId64 " cases\n", label, path,
              acc_equal, count);
  return bound_ok == count && acc_equal == count ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool train_only = argc > 1 && std::strcmp(argv[1], "--train") == 0;
  if (argc < 2 || (train_only && (argc != 5 || (std::strcmp(argv[3], "--write") && std::strcmp(argv[3], "--compare"))))) {
    std::fprintf(stderr, "usage: %s CASES [LABEL [DYW_CASES [TRAIN_X86]]]\n       %s --train LABEL (--write FILE | --compare FILE)\n",
                 argv[0], argv[0]);
    return 2;
  }
  const char* label = argc > 2 ? argv[2] : "arm64";
  const char* path = toolchain_kernel_path();
  const char* error = toolchain_kernel_path_error();
  if (path == nullptr) {
    std::fprintf(stderr, "%s: toolchain_kernel_path() is NULL\n", label);
    return 2;
  }
  {  // a forced path the CPU lacks: the kernel returns -2 for a valid call and toolchain_kernel_path_error() says why
    float x[64] = {}, s[1] = {1.0f}, y[1];
    uint8_t q[32] = {};
    const int rc = toolchain_int4_linear_a8(x, 1, 64, q, s, 1, 1, 64, y);
    if (rc == -2 && error != nullptr) {
      std::printf("%s: kernel path refused (the kernel returns -2 for a valid call)\n", label);
      std::fprintf(stderr, "Error: %s: %s\n", label, error);
      return 3;
    }
    if (rc != 0 || error != nullptr) {   // any other pairing breaks the convention
      std::fprintf(stderr, "%s: a valid call returned %d with toolchain_kernel_path_error() %s\n", label, rc,
                   error != nullptr ? error : "NULL");
      return 2;
    }
  }
  std::printf("%s: kernel path %s\n", label, path);
  if (train_only) {
    const bool write = std::strcmp(argv[3], "--write") == 0;
    const int rc = check_train_ops(label, path, write ? argv[4] : nullptr, write ? nullptr : argv[4]);
    if (toolchain_pool_units != nullptr)
      std::printf("%s: rows split over the thread pool in %" PRId64 " chunks\n", label, toolchain_pool_units());
    return rc;
  }
  std::FILE* f = std::fopen(argv[1], "rb");
  char magic[8];
  int64_t count = 0;
  if (!f || !read_all(f, magic, 8) || std::memcmp(magic, "TCI4CAS1", 8) || !read_all(f, &count, 8) || count < 0) {
    std::fprintf(stderr, "%s: %s is not a case file\n", label, argv[1]);
    return 2;
  }
  const double u = std::ldexp(1.0, -24);
  int64_t bound_ok = 0, bit_equal = 0, elems = 0, elems_equal = 0, worst_ulps = 0, shown = 0, nan_rows = 0;
  uint64_t hash = 1469598103934665603ull;   // FNV-1a 64 over the bits of every output
  double worst_ratio = 0;  // max err / bound over all outputs with a nonzero bound
  for (int64_t c = 0; c < count; ++c) {
    int64_t h[5];
    if (!read_all(f, h, sizeof h)) {
      std::fprintf(stderr, "%s: case %" PRId64 ": truncated header\n", label, c);
      return 2;
    }
    const int64_t T = h[0], o = h[1], in = h[2], group = h[3], ng = h[4];
    if (T < 0 || o < 0 || in <= 0 || in % 2 || T > (1 << 20) || o > (1 << 20) || in > (1 << 24)) {
      std::fprintf(stderr, "%s: case %" PRId64 ": bad shape\n", label, c);
      return 2;
    }
    std::vector<float> x(T * in), s(o * ng), y86(T * o), y(T * o, std::nanf(""));
    std::vector<uint8_t> q(o * in / 2);
    if (!read_all(f, x.data(), x.size() * 4) || !read_all(f, q.data(), q.size()) ||
        !read_all(f, s.data(), s.size() * 4) || !read_all(f, y86.data(), y86.size() * 4)) {
      std::fprintf(stderr, "%s: case %" PRId64 ": truncated data\n", label, c);
      return 2;
    }
    if (toolchain_int4_linear_a8(x.data(), T, in, q.data(), s.data(), o, ng, group, y.data()) != 0) {
      std::fprintf(stderr, "%s: case %" PRId64 " (T %" PRId64 " o %" PRId64 " i %" PRId64 " group %" PRId64
                   "): the kernel refused valid arguments\n", label, c, T, o, in, group);
      return 2;
    }
    // x quantized per row and group (the definition), and the nibble values n - 8.
    std::vector<double> a(T * in), sa(T * ng);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t k0 = g * group, k1 = std::min(in, k0 + group);
        float amax = 0;
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[t * in + k]));
        const float sg = amax / 127.0f;
        sa[t * ng + g] = sg;
        for (int64_t k = k0; k < k1; ++k)
          a[t * in + k] = sg > 0 ? std::min(127.0, std::max(-127.0, static_cast<double>(std::nearbyint(x[t * in + k] / sg)))) : 0.0;
      }
    std::vector<int> w(o * in);
    for (int64_t r = 0; r < o; ++r)
      for (int64_t k = 0; k < in; ++k)
        w[r * in + k] = ((k % 2 == 0) ? (q[r * (in / 2) + k / 2] >> 4) : (q[r * (in / 2) + k / 2] & 15)) - 8;
    const double gamma = (ng + 6) * u / (1 - (ng + 6) * u);
    bool ok = true, equal = true;
    for (float v : y) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      for (int k = 0; k < 4; ++k) hash = (hash ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
    for (int64_t t = 0; t < T; ++t) {
      bool finite = true;
      for (int64_t k = 0; k < in; ++k) finite = finite && std::isfinite(x[t * in + k]);
      if (!finite) {   // the definition: NaN in every output of the row
        ++nan_rows;
        for (int64_t r = 0; r < o; ++r) {
          const float got = y[t * o + r], ref86 = y86[t * o + r];
          ++elems;
          if (!std::isnan(got)) {
            ok = false;
            if (shown++ < 10)
              std::fprintf(stderr, "%s: case %" PRId64 " row %" PRId64 " has a NaN / inf but y[%" PRId64 "] = %.9g\n",
                           label, c, t, r, got);
          }
          if (std::isnan(got) == std::isnan(ref86) && (std::isnan(got) || std::memcmp(&got, &ref86, 4) == 0))
            ++elems_equal;
          else
            equal = false, worst_ulps = INT64_MAX;
        }
        continue;
      }
      for (int64_t r = 0; r < o; ++r) {
        double exact = 0, mag = 0;
        for (int64_t g = 0; g < ng; ++g) {
          double isum = 0;   // an integer, exact in double
          for (int64_t k = g * group; k < std::min(in, (g + 1) * group); ++k) isum += a[t * in + k] * w[r * in + k];
          const double p = isum * static_cast<double>(s[r * ng + g]) * sa[t * ng + g];
          exact += p;
          mag += std::fabs(p);
        }
        const float got = y[t * o + r], ref86 = y86[t * o + r];
        const double err = std::fabs(static_cast<double>(got) - exact), bound = gamma * mag;
        if (!(err <= bound)) {
          ok = false;
          if (shown++ < 10)
            std::fprintf(stderr, "%s: case %" PRId64 " (T %" PRId64 " o %" PRId64 " i %" PRId64 " group %" PRId64
                         ") y[%" PRId64 ", %" PRId64 "] = %.9g, exact %.17g: err %.3g > bound %.3g\n",
                         label, c, T, o, in, group, t, r, got, exact, err, bound);
        }
        if (bound > 0 && err / bound > worst_ratio) worst_ratio = err / bound;
        ++elems;
        if (std::memcmp(&got, &ref86, 4) == 0) {
          ++elems_equal;
        } else {
          equal = false;
          const int64_t d = std::isfinite(got) && std::isfinite(ref86) ? ulps(got, ref86) : INT64_MAX;
          if (d > worst_ulps) worst_ulps = d;
        }
      }
    }
    bound_ok += ok;
    bit_equal += equal;
  }
  std::fclose(f);
  std::printf("%s (%s path): float32 bound held on %" PRId64 "/%" PRId64 " cases (max err/bound %.3f; %" PRId64
              " rows with NaN / inf all NaN); bitwise equal to x86 on %" PRId64 "/%" PRId64 " cases, %" PRId64 "/%" PRId64
              " outputs; max difference %" PRId64 " ulp; outputs hash %016" PRIx64 "\n",
              label, path, bound_ok, count, worst_ratio, nan_rows, bit_equal, count, elems_equal, elems, worst_ulps,
              hash);
  int dyw = 0;
  if (argc > 3) {
    dyw = check_dyw(argv[3], label, path);
    if (dyw == 2) return 2;
  }
  int train = 0;
  if (argc > 4) {
    train = check_train_ops(label, path, nullptr, argv[4]);
    if (train == 2) return 2;
  }
  if (toolchain_pool_units != nullptr)
    std::printf("%s: rows split over the thread pool in %" PRId64 " chunks\n", label, toolchain_pool_units());
  return bound_ok == count && dyw == 0 && train == 0 ? 0 : 1;
}
