#include "thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace llmserve {

ThreadPool::ThreadPool(int n) : nthreads_(std::max(1, n)) {
  for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this, i] { worker(i); });
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

void ThreadPool::worker(int) {
  uint64_t seen = 0;
  for (;;) {
    std::function<void(int64_t)>* job;
    int64_t ntasks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      job = job_;
      ntasks = ntasks_;
    }
    run_tasks(job, ntasks);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }
}

void ThreadPool::run_tasks(std::function<void(int64_t)>* job, int64_t ntasks) {
  for (;;) {
    int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= ntasks) return;
    (*job)(t);
  }
}

void ThreadPool::parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads) {
  if (ntasks <= 0) return;
  int use = std::min<int64_t>(std::min(nthreads_, max_threads <= 0 ? nthreads_ : max_threads), ntasks);
  if (use <= 1) {
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> one_at_a_time(call_mu_);
  std::function<void(int64_t)> job = fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &job;
    ntasks_ = ntasks;
    next_.store(0);
    active_ = nthreads_ - 1;
    ++generation_;
  }
  cv_.notify_all();
  run_tasks(&job, ntasks);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return active_ == 0; });
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
