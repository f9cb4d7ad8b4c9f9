// A driver for counting the instructions the int4 kernel executes (scripts/arm64_kernel_instructions.sh runs it
// under qemu-aarch64 with the TB trace on): `arm64_count T O I GROUP CALLS` calls toolchain_int4_linear_a8 CALLS
// times on random x [T, I], weights [O, I/2] and scales (a fixed seed), on the path TOOLCHAIN_KERNEL_PATH
// chooses; prints the path and a checksum of y (so the calls cannot be optimized away).

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" int toolchain_int4_linear_a8(const float* x, int64_t T, int64_t in, const uint8_t* q, const float* scales,
                                        int64_t o, int64_t ng, int64_t group, float* y);
extern "C" const char* toolchain_kernel_path();
extern "C" const char* toolchain_kernel_path_error();

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s T O I GROUP CALLS\n", argv[0]);
    return 2;
  }
  const int64_t T = std::atoll(argv[1]), o = std::atoll(argv[2]), in = std::atoll(argv[3]), group = std::atoll(argv[4]);
  const int calls = std::atoi(argv[5]);
  const int64_t ng = (in + group - 1) / group;
  uint64_t state = 88172645463325252ull;
  auto next = [&state] { state ^= state << 13; state ^= state >> 7; state ^= state << 17; return state; };
  std::vector<float> x(static_cast<size_t>(T * in)), s(static_cast<size_t>(o * ng)), y(static_cast<size_t>(T * o));
  std::vector<uint8_t> q(static_cast<size_t>(o * in / 2));
  for (float& v : x) v = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) / 100.0f;
  for (float& v : s) v = static_cast<float>(next() % 1000 + 1) / 1e5f;
  for (uint8_t& v : q) v = static_cast<uint8_t>(next());
  const char* path = toolchain_kernel_path();
  if (const char* error = toolchain_kernel_path_error()) {   // a refused TOOLCHAIN_KERNEL_PATH
    std::fprintf(stderr, "Error: %s\n", error);
    return 3;
  }
  double sum = 0;
  for (int c = 0; c < calls; ++c) {
    if (toolchain_int4_linear_a8(x.data(), T, in, q.data(), s.data(), o, ng, group, y.data()) != 0) return 2;
    for (float v : y) sum += v;
  }
  std::printf("%s %.6g\n", path, sum);
  return 0;
}
