#include "pool.h"

#include <cstdlib>
#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace forkv {

namespace {
inline void relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
constexpr auto kSpin = std::chrono::microseconds(200);
}  // namespace

Pool::Pool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { work(i); });
}

void Pool::run(int n, const std::function<void(int)>& fn) {
  n = n < 1 ? 1 : (n > num_threads_ ? num_threads_ : n);
  if (n == 1) {
    fn(0);
    return;
  }
  std::lock_guard<std::mutex> one(run_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    active_ = n;
    pending_.store(n - 1, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  fn(0);
  while (pending_.load(std::memory_order_acquire) != 0) relax();
}

void Pool::work(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for a moment (the next call usually comes within microseconds), then sleep.
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (epoch_.load(std::memory_order_acquire) == seen) {
      relax();
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return epoch_.load(std::memory_order_acquire) != seen; });
        break;
      }
    }
    const std::function<void(int)>* job;
    int active;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = epoch_.load(std::memory_order_acquire);
      job = job_;
      active = active_;
    }
    if (index < active) {
      (*job)(index);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

int default_num_threads() {
  if (const char* env = std::getenv("FORKV_NATIVE_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

Pool& pool() {
  // Never destroyed: workers blocked at exit die with the process instead of being joined
  // while the interpreter tears down.
  static Pool* p = new Pool(default_num_threads());
  return *p;
}

}  // namespace forkv
