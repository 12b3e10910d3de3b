#include "finisher.h"

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
  // never destroyed: at exit a thread may still wait on it, and destroying a condition variable
  // with a waiter blocks
  static Finisher* f = new Finisher;
  return *f;
}

}  // namespace llmserve
