#include "finisher.h"

#include <exception>

#include "thread_pool.h"

namespace llmserve {

void Finisher::enqueue(int64_t id, std::shared_ptr<const Grammar> g, int64_t max_bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto place = done_.emplace(id, std::make_unique<Done>());
    try {
      queue_.push_back({id, std::move(g), max_bytes});
    } catch (...) {
      done_.erase(place.first);
      throw;
    }
  }
  cv_.notify_one();
}

int64_t Finisher::next_done() {
  Job job;
  Done* out = nullptr;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !queue_.empty(); });
    job = std::move(queue_.front());
    queue_.erase(queue_.begin());
    out = done_.at(job.id).get();  // made by enqueue; only take() removes it, after this returns
  }
  Done done;
  try {
    done = compress(*job.g, job.max_bytes);
  } catch (const std::exception& e) {  // (out of memory) the grammar stays lazy, as past the cap
    try {
      done.error = e.what();
    } catch (...) {  // the message did not fit either: the caller still learns that it failed
    }
    if (done.error.empty()) done.error = "out of memory";  // short enough to need no allocation
  }
  std::lock_guard<std::mutex> lk(mu_);
  *out = std::move(done);
  out->finished = true;
  return job.id;
}

Finisher::Done Finisher::compress(const Grammar& g, int64_t max_bytes) {
  Done done;
  done.complete = g.compact_all(max_bytes, done.rows);
  if (!done.complete) {
    done.rows = CompactArrays{};  // what it held on the way
    return done;
  }
  done.classes.resize(256);
  done.comb = comb_of(g.tr, g.S, done.classes.data());
  return done;
}

std::unique_ptr<Finisher::Done> Finisher::take(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = done_.find(id);
  if (it == done_.end() || !it->second->finished) return nullptr;
  std::unique_ptr<Done> out = std::move(it->second);
  done_.erase(it);
  return out;
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
