#include "grammar.h"

#include <cstring>
#include <thread>
#include <vector>

#include "thread_pool.h"

namespace llmserve {

namespace {
int32_t* stack_for(const Vocab& v) {
  thread_local std::vector<int32_t> st;
  if (st.size() < static_cast<size_t>(v.max_len() + 2)) st.resize(v.max_len() + 2);
  return st.data();
}

void state_row(const Vocab& v, const int32_t* table, const uint8_t* accept, int64_t S, int64_t s, uint32_t* m) {
  const int64_t W = v.words();
  if (s == S) {  // the dead row: end of sequence only
    std::memset(m, 0, W * sizeof(uint32_t));
  } else {
    v.state_mask(table, static_cast<int32_t>(s), m, stack_for(v));
    bool any = false;
    for (int64_t w = 0; w < W && !any; ++w) any = m[w] != 0;
    if (accept[s] == 0 && any) return;
  }
  for (int32_t e : v.eos()) m[e >> 5] |= 1u << (e & 31);
}
}  // namespace

void compile_masks(const Vocab& v, const int32_t* table, const uint8_t* accept, int64_t S, uint32_t* out,
                   int nthreads) {
  ThreadPool::global().parallel_for(
      S + 1, [&](int64_t s) { state_row(v, table, accept, S, s, out + s * v.words()); }, nthreads);
}

void Grammar::init(bool ready) {
  status.reset(new std::atomic<uint8_t>[S + 1]);
  for (int64_t r = 0; r <= S; ++r) status[r].store(ready ? 2 : 0, std::memory_order_relaxed);
  if (!ready) ensure(S);
}

void Grammar::compute(int64_t r) const { state_row(*vocab, table, accept, S, r, masks + r * vocab->words()); }

void Grammar::ensure(int64_t r) const {
  std::atomic<uint8_t>& st = status[r];
  if (st.load(std::memory_order_acquire) == 2) return;
  uint8_t expected = 0;
  if (st.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    compute(r);
    st.store(2, std::memory_order_release);
    return;
  }
  while (st.load(std::memory_order_acquire) != 2) std::this_thread::yield();  // another thread computes it
}

void Grammar::complete(int nthreads) const {
  if (nthreads == 1) {
    for (int64_t r = 0; r <= S; ++r) ensure(r);
    return;
  }
  ThreadPool::global().parallel_for(S + 1, [&](int64_t r) { ensure(r); }, nthreads);
}

int64_t Grammar::ready_rows() const {
  int64_t n = 0;
  for (int64_t r = 0; r <= S; ++r) n += ready(r);
  return n;
}

int32_t Grammar::step(int32_t state, int64_t token) const {
  if (state < 0) return -1;
  if (token < 0 || token >= vocab->size()) return -1;
  if (vocab->is_eos(token)) return accept[state] ? state : -1;
  const int64_t n = vocab->len(token);
  if (n == 0) return -1;
  const uint8_t* p = vocab->ptr(token);
  for (int64_t i = 0; i < n && state >= 0; ++i) state = table[static_cast<int64_t>(state) * 256 + p[i]];
  return state;
}

}  // namespace llmserve
