// A persistent pool of native threads for the constraint core's batch work (mask rows, fills,
// applies), so the hot path never starts a thread and never holds the GIL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llmserve {

// LLMSERVE_CONSTRAINT_THREADS when set, else the hardware threads (at most 16).
int default_threads();

// Waking a worker costs microseconds on an idle machine and up to a scheduler slice on a busy one,
// while one thread streams a 128k-token row of logits in ~7 us: a memory-bound call is only worth
// splitting when every thread gets at least this many bytes to touch. 2 MiB (~0.1-0.2 ms of one
// thread's streaming) keeps a single row inline up to a 262,144-token vocabulary (a Llama-3 row is
// 1 MB read and written) and still splits a B=256 fill (8 MB at 128k tokens). Settable for tests
// and tuning.
constexpr int64_t kDefaultMinBytesPerThread = int64_t(2) << 20;
int64_t min_bytes_per_thread();
int64_t set_min_bytes_per_thread(int64_t bytes);  // returns the previous value; <= 0 restores the default

// parallel_for hands out task indices from an atomic counter; the calling thread works too. One
// parallel_for at a time (calls from several threads serialise). A call that uses one thread runs
// inline: it neither wakes a worker nor waits for another caller.
class ThreadPool {
 public:
  explicit ThreadPool(int n);
  ~ThreadPool();
  void parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads = 0);
  // Threads (the caller included) worth using for memory-bound work touching `bytes` (read and
  // written), at most
  // max_threads (0: the pool).
  int threads_for_bytes(int64_t bytes, int max_threads = 0) const;
  int size() const { return nthreads_; }
  // parallel_for calls that woke workers, since the pool started (tests read it, not timings)
  uint64_t dispatches() const { return dispatches_.load(std::memory_order_relaxed); }
  static ThreadPool& global();

 private:
  void worker();
  void run_tasks(const std::function<void(int64_t)>* job, int64_t ntasks);
  int nthreads_;
  std::vector<std::thread> workers_;
  std::mutex mu_, call_mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  // the current call: workers may join while it is open, up to `wanted_`; the caller waits only for
  // those that joined, never for a worker that wakes after the work is done
  bool open_ = false;
  int wanted_ = 0;
  int joined_ = 0;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t ntasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> dispatches_{0};
};

}  // namespace llmserve
