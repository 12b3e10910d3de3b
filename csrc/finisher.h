// Background completion of lazily compiled grammars (see grammar.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comb.h"
#include "grammar.h"

namespace llmserve {

// Completes lazily compiled grammars one at a time on whichever thread calls next_done(), which
// waits without the GIL: the Python side only wakes when a grammar is complete (to write its cache),
// not when one is queued, so queueing adds nothing to the compile that queued it. A grammar is
// completed compressed, row by row (Grammar::compact_all): completing it never holds its dense rows.
class Finisher {
 public:
  // The compressed form of a finished grammar, for take(); `complete` false: it passed max_bytes,
  // or failed with `error` (out of memory)
  struct Done {
    bool finished = false;  // next_done() is through with it (until then take() leaves it)
    bool complete = false;
    std::string error;
    CompactArrays rows;
    std::vector<uint8_t> classes;  // [256]
    Comb comb;                     // the transitions over those classes
  };
  // `g` compressed row by row on this thread (Grammar::compact_all, then its transitions' comb); throws
  // what they throw (out of memory)
  static Done compress(const Grammar& g, int64_t max_bytes);
  // throws (out of memory) before anything is queued: the result's place is made here, so that
  // next_done() allocates nothing once it has taken a job (a job it lost would never be reported)
  void enqueue(int64_t id, std::shared_ptr<const Grammar> g, int64_t max_bytes);
  int64_t next_done();  // blocks until a queued grammar is complete; returns its id
  // the result of next_done()'s grammar `id`, once (null if there is none, or not yet)
  std::unique_ptr<Done> take(int64_t id);
  static Finisher& global();

 private:
  struct Job {
    int64_t id;
    std::shared_ptr<const Grammar> g;
    int64_t max_bytes;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Job> queue_;
  std::unordered_map<int64_t, std::unique_ptr<Done>> done_;
  uint32_t generation_ = 0;  // the process generation (fork_generation) it serves
};

}  // namespace llmserve
