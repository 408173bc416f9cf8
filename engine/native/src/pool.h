// A small fork-join thread pool for the kernels: the caller works too, workers spin briefly
// between calls (a decode step makes ~150 calls a few microseconds apart), yielding the core
// to any thread that wants it, and then sleep, so an idle pool costs no CPU, and nothing here
// touches OpenBLAS's threads. Threads claim the
// call's indices; the caller runs every index no worker has claimed by the time it is done
// with its own, so a worker that is asleep or descheduled (a busy machine) never holds up a
// call it has not started.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace forkv {

class Pool {
 public:
  explicit Pool(int num_threads);
  int num_threads() const { return num_threads_; }
  // Run fn(thread_index) on `n` threads (n <= num_threads), the caller being index 0.
  void run(int n, const std::function<void(int)>& fn);

 private:
  void work();
  int claim(uint64_t epoch, int n);  // the next unclaimed index of call `epoch`, or -1
  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> claim_{0};  // the call's epoch (low 32 bits) << 32 | next index
  std::atomic<int> finished_{0};    // indices workers have finished in this call
  int active_ = 0;
  const std::function<void(int)>* job_ = nullptr;
  std::mutex run_mutex_;  // one call at a time (several mlx streams may call in)
};

// The process-wide pool (FORKV_NATIVE_THREADS, else the CPUs this process may run on).
Pool& pool();
int default_num_threads();

}  // namespace forkv
