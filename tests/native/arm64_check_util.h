// Helpers shared by the arm64 check's driver files (tests/native/arm64_driver.cpp, arm64_train_ops.cpp), both
// linked into one binary by scripts/check_kernel_arm64.sh.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace arm64_check {

// n bytes from f into p (true when all were read; n = 0 reads nothing).
inline bool read_all(std::FILE* f, void* p, size_t n) { return n == 0 || std::fread(p, 1, n, f) == n; }

// Distance in ulps between two finite floats (the count of floats between them, across zero too).
inline int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  const int64_t oa = ia < 0 ? -static_cast<int64_t>(ia & 0x7fffffff) : ia;
  const int64_t ob = ib < 0 ? -static_cast<int64_t>(ib & 0x7fffffff) : ib;
  return oa > ob ? oa - ob : ob - oa;
}

}  // namespace arm64_check
