// A byte DFA compiled against a vocabulary: one packed token-mask row per DFA state, computed all at
// once (compile_masks) or row by row on first use (Grammar).
//
// Layout shared with Python (llmserve/constraints/compiled.py), while rows are computed or when
// dense: table int32[S,256] (-1 dead), accept uint8[S], masks uint32[S+1, W] (row S: the dead row);
// bit (t % 32) of word (t / 32) of a row set = token t allowed. A complete grammar is compressed
// (CompactRows below, and its byte classes packed as a comb: Transitions in vocab_trie.h, comb.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "vocab_trie.h"

namespace llmserve {

class LazyDfa;

// The end-of-sequence rule of a state's mask row, given the tokens that walk from it: end of sequence
// is allowed when the state accepts, or when nothing else is.
void add_end_of_sequence(const Vocab& v, bool accepting, uint32_t* row);
// This thread's stack for the vocabulary's walks (max_len() + 2 entries).
int32_t* walk_stack(const Vocab& v);

// Fill out[S+1, W]: row s = tokens whose bytes walk the DFA from s without dying (+ end of sequence
// when s accepts, or when nothing else is allowed); row S = end of sequence only (the dead row).
void compile_masks(const Vocab& v, const int32_t* table, const uint8_t* accept, int64_t S, uint32_t* out,
                   int nthreads);

// The complete mask rows of a constraint, compressed: each distinct row stored once (states reach
// the same row often: every state inside a free string allows the same tokens), and each in the
// smallest of three forms, so that a constraint costs about what its information costs rather than
// S x V bits (a 2,000-state schema over 100k tokens: 25 MB dense, ~1 MB compressed):
//   kWords:   bitmap[nb] (bit w: word w is all ones, else all zeros unless listed), p, then the p
//             listed words' indices (increasing) and the p words; nb = ceil(W / 32)
//   kAllowed: the allowed token ids, increasing (the row is zero elsewhere)
//   kRefused: the refused token ids in [0, 32 W), increasing (the row is all ones elsewhere)
//   kDense:   the W words as they are (when most words are partial: never more than dense rows)
//   kDelta:   base, p, then p word indices (increasing) and the p words where the row differs from
//             distinct row `base` (an earlier row of another kind): strings at different depths of
//             a JSON value allow the same tokens but the few that close them, so such rows repeat
//             one large row with a few words changed
//   kShared:  k: the row is shared row k (`shared`), a kWords or kDense row held once per process
//             for every constraint over the vocabulary that has it (llmserve/constraints/
//             shared_rows.py): the rows of a JSON value's free strings and numbers recur in most
//             schemas
// A fill expands a row's words straight into the bitmask, or into a chunk buffer that stays in L1
// before the logits pass: a write of the row's words, never a second pass over the logits.
// Layout shared with Python (llmserve/constraints/compiled.py, disk_cache.py):
//   row_of int32[S+1] (distinct row per state row), off int64[R+1] (row r: data[off[r], off[r+1])),
//   kind uint8[R], data uint32[off[R]]
struct CompactRows {
  enum Kind : uint8_t { kWords = 0, kAllowed = 1, kRefused = 2, kDense = 3, kDelta = 4, kShared = 5 };
  struct Shared {
    const uint32_t* data;
    int64_t n;
    uint8_t kind;  // kWords or kDense
  };
  const int32_t* row_of = nullptr;
  const int64_t* off = nullptr;
  const uint8_t* kind = nullptr;
  const uint32_t* data = nullptr;
  int64_t R = 0, W = 0;
  const Shared* shared = nullptr;
  int64_t n_shared = 0;
  // words [w0, w1) of state row s into out[0, w1 - w0)
  void expand(int64_t s, int64_t w0, int64_t w1, uint32_t* out) const { expand_row(row_of[s], w0, w1, out); }
  // the same for distinct row r
  void expand_row(int64_t r, int64_t w0, int64_t w1, uint32_t* out) const;
  // throws std::invalid_argument unless every index stays inside the arrays (a file read from disk)
  void check(int64_t rows, int64_t ndata) const;

 private:
  void expand_span(uint8_t how, const uint32_t* d, int64_t n, int64_t w0, int64_t w1, uint32_t* out) const;
  void check_span(uint8_t how, const uint32_t* d, int64_t n, int64_t r) const;
};

struct CompactArrays {
  std::vector<int32_t> row_of;
  std::vector<int64_t> off;
  std::vector<uint8_t> kind;
  std::vector<uint32_t> data;
};

// Compress masks[rows, W] (complete rows; rows may repeat).
CompactArrays compact_rows(const uint32_t* masks, int64_t rows, int64_t W, int nthreads);


// A compiled constraint. Raw pointers into buffers owned by the Python object (numpy, possibly mmap).
// Mask rows may be computed lazily: `status` says per row whether it is ready; `ensure` computes a
// missing row on the calling thread (one thread computes, others wait), so a new constraint is
// usable as soon as its DFA and start row exist, and the rest fill in on first use or in the
// background (`complete`).
struct Grammar {
  std::shared_ptr<Vocab> vocab;
  Transitions tr;  // dense or byte classes while lazy (as given), a comb of byte classes once compressed
  const uint8_t* accept = nullptr;
  uint32_t* masks = nullptr;  // written only for rows that are not ready yet
  int64_t S = 0;
  int32_t start = 0;
  // per mask row: 0 missing, 2 ready, odd: being computed (by a thread of the process generation
  // it encodes, see ensure)
  std::unique_ptr<std::atomic<uint8_t>[]> status;
  // rows whose status is 2, kept as they become ready: a cache counts a lazy form's memory at each
  // use, and walking `status` for it cost one load per state
  mutable std::atomic<int64_t> ready_count{0};
  // set: the rows are complete and compressed (`masks` is null); a compressed grammar is never lazy
  bool compact = false;
  CompactRows rows;
  std::vector<CompactRows::Shared> shared_rows;  // rows.shared (their words: buffers Python owns)
  // set: the automaton itself is built as steps and rows reach it (lazy_dfa.h; `tr`, `accept` and
  // `masks` are unused): S is its state limit (row S the dead row, as always), rows are allocated
  // in blocks of kRowBlock on first use, and every use of the automaton holds `lazy_lock` (shared
  // with its other users). A step or row past the automaton's limits ends the answer: the state is
  // dead (end of sequence only).
  std::shared_ptr<LazyDfa> lazy;
  std::shared_ptr<std::mutex> lazy_lock;
  static constexpr int64_t kRowBlock = 64;
  std::unique_ptr<std::atomic<uint32_t*>[]> blocks;  // [S / kRowBlock + 1], lazy only

  Grammar() = default;
  Grammar(const Grammar&) = delete;
  Grammar& operator=(const Grammar&) = delete;
  ~Grammar();
  // a grammar over `lazy`, rows computed on first use; its state limit `max_states`
  static std::shared_ptr<Grammar> over_lazy(std::shared_ptr<Vocab> v, std::shared_ptr<LazyDfa> lazy,
                                            std::shared_ptr<std::mutex> lock, int64_t max_states);
  // where mask row r is (a lazy grammar's block is allocated on first use)
  uint32_t* row_ptr(int64_t r) const;
  // states numbered so far: S, or a lazy automaton's found states
  int64_t states() const;

  // all rows ready (`masks` complete, may be read-only) or only the dead row (`masks` writable)
  void init(bool ready);
  int32_t step(int32_t state, int64_t token) const;
  bool ready(int64_t row) const { return status[row].load(std::memory_order_acquire) == 2; }
  void ensure(int64_t row) const;
  void complete(int nthreads) const;
  // every row compressed on this thread, in the same arrays as compact_rows over the dense table:
  // rows already ready are read where they are, the others computed one at a time into a scratch
  // row and left missing, so the dense table is never held (a schema whose dense table takes
  // gigabytes costs its compressed form plus at most 512 copied delta bases). False, `out`
  // unspecified, as soon as the arrays' capacity passes `max_bytes`.
  bool compact_all(int64_t max_bytes, CompactArrays& out) const;
  int64_t ready_rows() const;
  // words [w0, w1) of mask row r (w1 <= vocab->words()) into out[0, w1 - w0); the row must be ready
  void row_words(int64_t r, int64_t w0, int64_t w1, uint32_t* out) const;

 private:
  void compute(int64_t row) const;
};

}  // namespace llmserve
