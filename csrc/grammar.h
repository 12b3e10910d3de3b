// A byte DFA compiled against a vocabulary: one packed token-mask row per DFA state, computed all at
// once (compile_masks) or row by row on first use (Grammar).
//
// Layout shared with Python (llmserve/constraints/compiled.py):
//   table int32[S,256] (-1 dead), accept uint8[S], masks uint32[S+1, W] (row S: the dead row);
//   bit (t % 32) of word (t / 32) of a row set = token t allowed
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "vocab_trie.h"

namespace llmserve {

// Fill out[S+1, W]: row s = tokens whose bytes walk the DFA from s without dying (+ end of sequence
// when s accepts, or when nothing else is allowed); row S = end of sequence only (the dead row).
void compile_masks(const Vocab& v, const int32_t* table, const uint8_t* accept, int64_t S, uint32_t* out,
                   int nthreads);

// A compiled constraint. Raw pointers into buffers owned by the Python object (numpy, possibly mmap).
// Mask rows may be computed lazily: `status` says per row whether it is ready; `ensure` computes a
// missing row on the calling thread (one thread computes, others wait), so a new constraint is
// usable as soon as its DFA and start row exist, and the rest fill in on first use or in the
// background (`complete`).
struct Grammar {
  std::shared_ptr<Vocab> vocab;
  const int32_t* table = nullptr;
  const uint8_t* accept = nullptr;
  uint32_t* masks = nullptr;  // written only for rows that are not ready yet
  int64_t S = 0;
  int32_t start = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> status;  // per mask row: 0 missing, 1 being computed, 2 ready

  // all rows ready (`masks` complete, may be read-only) or only the dead row (`masks` writable)
  void init(bool ready);
  int32_t step(int32_t state, int64_t token) const;
  bool ready(int64_t row) const { return status[row].load(std::memory_order_acquire) == 2; }
  void ensure(int64_t row) const;
  void complete(int nthreads) const;
  int64_t ready_rows() const;
  const uint32_t* row(int64_t r) const { return masks + r * vocab->words(); }

 private:
  void compute(int64_t row) const;
};

}  // namespace llmserve
