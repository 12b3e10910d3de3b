// llmserve constraint core (see core.cpp for the data layout).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace llmserve {

int default_threads();

// A persistent pool of native threads. parallel_for hands out task indices from an atomic counter;
// the calling thread works too. One parallel_for at a time (calls from several threads serialise).
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

class Vocab {
 public:
  Vocab(std::vector<int64_t> offsets, std::vector<uint8_t> data, std::vector<int32_t> eos, int64_t size);
  int64_t size() const { return size_; }
  int64_t words() const { return words_; }
  int64_t len(int64_t t) const { return offsets_[t + 1] - offsets_[t]; }
  const uint8_t* ptr(int64_t t) const { return data_.data() + offsets_[t]; }
  bool is_eos(int64_t t) const { return is_eos_[t] != 0; }
  const std::vector<int32_t>& eos() const { return eos_; }
  int64_t max_len() const { return max_len_; }

  // Row of the token mask for DFA state s (without the end-of-sequence rule): the tokens whose
  // bytes walk the DFA from s without dying. A depth-first walk over the token trie that skips
  // a whole subtree as soon as its prefix dies, so a state that allows few bytes costs little.
  // `stack` must hold max_len() + 1 entries.
  void state_mask(const int32_t* table, int32_t s, uint32_t* out, int32_t* stack) const;

 private:
  // order: the ids of tokens with bytes, sorted by their bytes; lcp: prefix shared with the previous
  void build_trie(const std::vector<int32_t>& order, const std::vector<int32_t>& lcp);
  std::vector<int64_t> offsets_;
  std::vector<uint8_t> data_;
  std::vector<int32_t> eos_;
  std::vector<uint8_t> is_eos_;
  int64_t size_, words_, max_len_;
  // token trie, nodes in preorder: node i is entered by byte trie_byte_[i] from its parent, the
  // last node of depth trie_depth_[i] - 1 before it; trie_end_[i] is one past its subtree; the
  // tokens whose bytes end at node i are trie_tok_[trie_tok_off_[i] .. trie_tok_off_[i + 1]).
  std::vector<uint8_t> trie_byte_;
  std::vector<int32_t> trie_depth_, trie_end_, trie_tok_off_, trie_tok_;
};

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

void apply_bitmask(float* logits, int64_t B, int64_t V, int64_t stride, const uint32_t* bitmask, int64_t W,
                   const uint8_t* rows_active, int nthreads);

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
};

struct RowCore {
  std::shared_ptr<const Grammar> grammar;  // null: unconstrained row
  int32_t state = 0;
};

// Rows of the persistent batch (the GIL-free part; the Python-object part lives in the binding).
class BatchState {
 public:
  explicit BatchState(std::shared_ptr<Vocab> v) : vocab_(std::move(v)) {}
  void ensure(int64_t n);
  std::vector<RowCore>& rows() { return rows_; }
  const std::vector<RowCore>& rows() const { return rows_; }
  // compute the mask rows the first B rows need that are not ready yet (lazy grammars)
  void prepare(int64_t B, int nthreads) const;
  void fill(uint32_t* out, int64_t B, int64_t W, uint8_t* active, int nthreads) const;
  void fill_apply(float* logits, int64_t B, int64_t V, int64_t stride, uint32_t* out, int64_t W,
                  int nthreads) const;
  const std::shared_ptr<Vocab>& vocab() const { return vocab_; }

 private:
  std::shared_ptr<Vocab> vocab_;
  std::vector<RowCore> rows_;
};

}  // namespace llmserve
