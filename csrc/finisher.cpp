#include "finisher.h"

#include "thread_pool.h"

namespace llmserve {

void Finisher::enqueue(int64_t id, std::shared_ptr<const Grammar> g) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.emplace_back(id, std::move(g));
  }
  cv_.notify_one();
}

int64_t Finisher::next_done() {
  std::pair<int64_t, std::shared_ptr<const Grammar>> job;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !queue_.empty(); });
    job = std::move(queue_.front());
    queue_.erase(queue_.begin());
  }
  job.second->complete(1);
  return job.first;
}

Finisher& Finisher::global() {
  // Never destroyed: at exit a thread may still wait on it, and destroying a condition variable
  // with a waiter blocks. A forked child gets one of its own: the inherited queue's lock may be
  // held by a thread that is not in the child, and the completion that thread had taken is lost.
  static std::atomic<Finisher*> current{nullptr};
  Finisher* f = current.load(std::memory_order_acquire);
  const uint32_t generation = fork_generation();
  if (f != nullptr && f->generation_ == generation) return *f;
  auto* fresh = new Finisher;
  fresh->generation_ = generation;
  while (!current.compare_exchange_weak(f, fresh, std::memory_order_acq_rel)) {
    if (f != nullptr && f->generation_ == generation) {
      delete fresh;
      return *f;
    }
  }
  return *fresh;
}

}  // namespace llmserve
