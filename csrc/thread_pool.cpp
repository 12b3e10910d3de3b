#include "thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <exception>

namespace llmserve {

namespace {
std::atomic<int64_t> g_min_bytes_per_thread{kDefaultMinBytesPerThread};
}

int64_t min_bytes_per_thread() { return g_min_bytes_per_thread.load(std::memory_order_relaxed); }

int64_t set_min_bytes_per_thread(int64_t bytes) {
  return g_min_bytes_per_thread.exchange(bytes > 0 ? bytes : kDefaultMinBytesPerThread);
}

ThreadPool::ThreadPool(int n) : nthreads_(std::max(1, n)) {
  for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    ++generation_;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* job;
    int64_t ntasks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      if (!open_ || joined_ >= wanted_) continue;
      ++joined_;
      job = job_;
      ntasks = ntasks_;
    }
    run_tasks(job, ntasks);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--joined_ == 0 && !open_) done_cv_.notify_all();
    }
  }
}

void ThreadPool::run_tasks(const std::function<void(int64_t)>* job, int64_t ntasks) {
  for (;;) {
    int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= ntasks) return;
    (*job)(t);
  }
}

void ThreadPool::parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads) {
  if (ntasks <= 0) return;
  const int use = static_cast<int>(
      std::min<int64_t>(std::min(nthreads_, max_threads <= 0 ? nthreads_ : max_threads), ntasks));
  if (use <= 1) {
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> one_at_a_time(call_mu_);
  dispatches_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    ntasks_ = ntasks;
    next_.store(0, std::memory_order_relaxed);
    wanted_ = use - 1;
    joined_ = 0;
    open_ = true;
    ++generation_;
  }
  for (int i = 0; i < use - 1; ++i) cv_.notify_one();
  // fn must outlive every worker that joined, also when a task throws here (an allocation failure)
  std::exception_ptr failed;
  try {
    run_tasks(&fn, ntasks);
  } catch (...) {
    failed = std::current_exception();
    next_.store(ntasks, std::memory_order_relaxed);  // the workers stop at their next task
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    open_ = false;  // every task is claimed: a worker waking from now on has nothing to do
    done_cv_.wait(lk, [&] { return joined_ == 0; });
    job_ = nullptr;
  }
  if (failed) std::rethrow_exception(failed);
}

int ThreadPool::threads_for_bytes(int64_t bytes, int max_threads) const {
  const int cap = max_threads <= 0 ? nthreads_ : std::min(nthreads_, max_threads);
  const int64_t want = std::max<int64_t>(1, bytes / std::max<int64_t>(1, min_bytes_per_thread()));
  return static_cast<int>(std::min<int64_t>(cap, want));
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(default_threads());
  return pool;
}

int default_threads() {
  if (const char* env = std::getenv("LLMSERVE_CONSTRAINT_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::max(1u, std::min(hw, 16u)));
}

}  // namespace llmserve
