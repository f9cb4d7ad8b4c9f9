// A stand-in for ExecuTorch's thread pool (get_pthreadpool() and pthreadpool_get_threads_count(), the pthreadpool
// C API kernels.cpp declares under TOOLCHAIN_THREADPOOL: the thread count its own workers match), so
// scripts/check_kernel_arm64.sh can check under qemu the kernels' split of their calls over threads: 3 threads
// reported ($TOOLCHAIN_TEST_POOL_THREADS = 1 .. 8 sets another count: the train ops are run at 1 and 2). kernels.cpp
// runs the units on its SpinPool's real threads (std::thread), the arm64 paths' thread_local buffers included, and
// counts them (toolchain_pool_units()), so the driver can show that the pooled build really split calls.

#include <cstddef>
#include <cstdlib>

namespace {
size_t threads_from_env() {
  const char* v = std::getenv("TOOLCHAIN_TEST_POOL_THREADS");
  const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 3;
  return n >= 1 && n <= 8 ? static_cast<size_t>(n) : 3;
}
}  // namespace

extern "C" {
struct pthreadpool {
  size_t threads;
};
typedef struct pthreadpool* pthreadpool_t;

size_t pthreadpool_get_threads_count(pthreadpool_t pool) { return pool->threads; }
}

namespace executorch::extension::threadpool {
pthreadpool_t get_pthreadpool() {
  static pthreadpool pool{threads_from_env()};
  return &pool;
}
}  // namespace executorch::extension::threadpool
