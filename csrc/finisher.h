// Background completion of lazily compiled grammars (see grammar.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "grammar.h"

namespace llmserve {

// Completes lazily compiled grammars one at a time on whichever thread calls next_done(), which
// waits without the GIL: the Python side only wakes when a grammar is complete (to write its cache),
// not when one is queued, so queueing adds nothing to the compile that queued it.
class Finisher {
 public:
  void enqueue(int64_t id, std::shared_ptr<const Grammar> g);
  int64_t next_done();  // blocks until a queued grammar is complete; returns its id
  static Finisher& global();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<int64_t, std::shared_ptr<const Grammar>>> queue_;
  uint32_t generation_ = 0;  // the process generation (fork_generation) it serves
};

}  // namespace llmserve
