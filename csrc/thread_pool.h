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

// parallel_for hands out task indices from an atomic counter; the calling thread works too. One
// parallel_for at a time (calls from several threads serialise).
class ThreadPool {
 public:
  explicit ThreadPool(int n);
  ~ThreadPool();
  void parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads = 0);
  int size() const { return nthreads_; }
  static ThreadPool& global();

 private:
  void worker(int id);
  void run_tasks(std::function<void(int64_t)>* job, int64_t ntasks);
  int nthreads_;
  std::vector<std::thread> workers_;
  std::mutex mu_, call_mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int active_ = 0;
  std::function<void(int64_t)>* job_ = nullptr;
  int64_t ntasks_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace llmserve
