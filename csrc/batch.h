// The GIL-free part of the persistent batch: per row its grammar and DFA state, and the fill of the
// batch's bitmask (and logits) from the grammars' mask rows. The Python-object part (each row's
// token list) lives in the binding (bindings.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "grammar.h"
#include "vocab_trie.h"

namespace llmserve {

struct RowCore {
  std::shared_ptr<const Grammar> grammar;  // null: unconstrained row
  int32_t state = 0;
};

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
