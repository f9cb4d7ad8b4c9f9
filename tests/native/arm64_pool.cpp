// A stand-in for ExecuTorch's thread pool (the pthreadpool C API and get_pthreadpool() that kernels.cpp declares
// under TOOLCHAIN_THREADPOOL), so scripts/check_kernel_arm64.sh can check under qemu the kernel's split of the
// weight rows into chunks (each chunk a row range whose outputs are ystride apart): 3 threads reported
// ($TOOLCHAIN_TEST_POOL_THREADS = 1 .. 8 sets another count: the train ops are run at 1 and 2), and each
// parallelize call runs its chunks on that many real threads (std::thread, chunk i on thread i mod n), the
// arm64 paths' thread_local buffers included. toolchain_test_pool_chunks() counts the chunks run, so the driver
// can show that the pooled build really split calls.

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <thread>
#include <vector>

namespace {
size_t threads_from_env() {
  const char* v = std::getenv("TOOLCHAIN_TEST_POOL_THREADS");
  const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 3;
  return n >= 1 && n <= 8 ? static_cast<size_t>(n) : 3;
}
std::atomic<int64_t> chunks_run{0};
}  // namespace

extern "C" {
struct pthreadpool {
  size_t threads;
};
typedef struct pthreadpool* pthreadpool_t;

size_t pthreadpool_get_threads_count(pthreadpool_t pool) { return pool->threads; }

void pthreadpool_parallelize_1d(pthreadpool_t pool, void (*fn)(void*, size_t), void* ctx, size_t range, uint32_t) {
  std::vector<std::thread> workers;
  for (size_t w = 0; w < pool->threads && w < range; ++w)
    workers.emplace_back([=] {
      for (size_t i = w; i < range; i += pool->threads) {
        fn(ctx, i);
        ++chunks_run;
      }
    });
  for (std::thread& t : workers) t.join();
}

int64_t toolchain_test_pool_chunks() { return chunks_run.load(); }
}

namespace executorch::extension::threadpool {
pthreadpool_t get_pthreadpool() {
  static pthreadpool pool{threads_from_env()};
  return &pool;
}
}  // namespace executorch::extension::threadpool
