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
// A wait's first spins only pause; later ones also yield the core, so a thread that waits
// never holds it from one with work (the Python thread building the next step, the server
// streaming a token, or the very worker being waited for, descheduled on a busy machine).
constexpr int kPauses = 16;
inline void wait_a_moment(int spins) {
  if (spins < kPauses)
    relax();
  else
    std::this_thread::yield();
}
constexpr auto kSpin = std::chrono::microseconds(200);
}  // namespace

Pool::Pool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { work(); });
}

int Pool::claim(uint64_t epoch, int n) {
  uint64_t v = claim_.load(std::memory_order_acquire);
  for (;;) {
    // A later call's counter: the claim fails, and the stale job is never touched.
    if ((v >> 32) != (epoch & 0xFFFFFFFFu)) return -1;
    const int index = int(v & 0xFFFFFFFFu);
    if (index >= n) return -1;
    if (claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) return index;
  }
}

void Pool::run(int n, const std::function<void(int)>& fn) {
  n = n < 1 ? 1 : (n > num_threads_ ? num_threads_ : n);
  if (n == 1) {
    fn(0);
    return;
  }
  std::lock_guard<std::mutex> one(run_mutex_);
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    active_ = n;
    epoch = epoch_.load(std::memory_order_relaxed) + 1;
    finished_.store(0, std::memory_order_relaxed);
    claim_.store((epoch & 0xFFFFFFFFu) << 32 | 1u, std::memory_order_relaxed);
    epoch_.store(epoch, std::memory_order_release);
  }
  wake_.notify_all();
  fn(0);
  int mine = 1;
  for (int index; (index = claim(epoch, n)) >= 0; ++mine) fn(index);
  for (int spins = 0; finished_.load(std::memory_order_acquire) != n - mine; ++spins)
    wait_a_moment(spins);
}

void Pool::work() {
  uint64_t seen = 0;
  for (;;) {
    // Spin for a moment (the next call usually comes within microseconds), then sleep.
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (epoch_.load(std::memory_order_acquire) == seen) {
      wait_a_moment(spins);
      if (++spins % 16 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
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
    // The caller waits for every index claimed here, so `job` outlives these calls.
    for (int index; (index = claim(seen, active)) >= 0;) {
      (*job)(index);
      finished_.fetch_add(1, std::memory_order_acq_rel);
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
