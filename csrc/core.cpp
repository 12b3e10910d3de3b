// llmserve constraint core: token-level compilation of byte DFAs, per-row state tracking and the
// batched mask fill + apply hot path. Python binding in bindings.cpp; the pure-Python reference with
// the same interface is llmserve/constraints/reference.py (property tests check they agree exactly).
//
// Data layout shared with Python:
//   vocab   offsets int64[size+1], data uint8: token i = data[offsets[i]:offsets[i+1]] (empty: never allowed)
//   grammar table int32[S,256] (-1 dead), accept uint8[S], masks uint32[S+1, W] (row S: the dead row)
//   bitmask uint32[B, W]: bit (t % 32) of word (t / 32) set = token t allowed

#include "core.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace llmserve {

// ------------------------------------------------------------------------------------------ pool

ThreadPool::ThreadPool(int n) : nthreads_(std::max(1, n)) {
  for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    ++generation_;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int) {
  uint64_t seen = 0;
  for (;;) {
    std::function<void(int64_t)>* job;
    int64_t ntasks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      job = job_;
      ntasks = ntasks_;
    }
    run_tasks(job, ntasks);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }
}

void ThreadPool::run_tasks(std::function<void(int64_t)>* job, int64_t ntasks) {
  for (;;) {
    int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= ntasks) return;
    (*job)(t);
  }
}

void ThreadPool::parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads) {
  if (ntasks <= 0) return;
  int use = std::min<int64_t>(std::min(nthreads_, max_threads <= 0 ? nthreads_ : max_threads), ntasks);
  if (use <= 1) {
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> one_at_a_time(call_mu_);
  std::function<void(int64_t)> job = fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &job;
    ntasks_ = ntasks;
    next_.store(0);
    active_ = nthreads_ - 1;
    ++generation_;
  }
  cv_.notify_all();
  run_tasks(&job, ntasks);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return active_ == 0; });
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(default_threads());
  return pool;
}

int default_threads() {
  if (const char* env = std::getenv("LLMSERVE_CONSTRAINT_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::max(1u, std::min(hw, 16u)));
}

// ------------------------------------------------------------------------------------------ vocab

Vocab::Vocab(std::vector<int64_t> offsets, std::vector<uint8_t> data, std::vector<int32_t> eos, int64_t size)
    : offsets_(std::move(offsets)), data_(std::move(data)), eos_(std::move(eos)), size_(size) {
  words_ = (size_ + 31) / 32;
  is_eos_.assign(size_, 0);
  for (int32_t e : eos_)
    if (e >= 0 && e < size_) is_eos_[e] = 1;
  std::vector<int32_t> order;  // ids of the tokens with bytes, sorted by their bytes: the trie's preorder
  for (int64_t i = 0; i < size_; ++i)
    if (len(i) > 0) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [this](int32_t a, int32_t b) {
    const uint8_t *pa = ptr(a), *pb = ptr(b);
    int64_t la = len(a), lb = len(b);
    int c = std::memcmp(pa, pb, std::min(la, lb));
    if (c != 0) return c < 0;
    if (la != lb) return la < lb;
    return a < b;
  });
  std::vector<int32_t> lcp(order.size(), 0);  // common prefix length with the previous token in order
  for (size_t k = 1; k < order.size(); ++k) {
    int32_t a = order[k - 1], b = order[k];
    int64_t n = std::min(len(a), len(b)), l = 0;
    const uint8_t *pa = ptr(a), *pb = ptr(b);
    while (l < n && pa[l] == pb[l]) ++l;
    lcp[k] = static_cast<int32_t>(l);
  }
  max_len_ = 0;
  for (int64_t i = 0; i < size_; ++i) max_len_ = std::max(max_len_, len(i));
  build_trie(order, lcp);
}

void Vocab::build_trie(const std::vector<int32_t>& order, const std::vector<int32_t>& lcp) {
  // order is sorted by bytes, which is the trie's preorder: each token opens nodes for its bytes
  // past the prefix it shares with the previous token, closing the deeper nodes of that one.
  std::vector<int32_t> path;  // path[d] = open node at depth d + 1
  std::vector<int32_t> tok_node;
  for (size_t k = 0; k < order.size(); ++k) {
    const int32_t t = order[k];
    const int64_t n = len(t), l = k ? lcp[k] : 0;
    while (static_cast<int64_t>(path.size()) > l) {
      trie_end_[path.back()] = static_cast<int32_t>(trie_byte_.size());
      path.pop_back();
    }
    const uint8_t* p = ptr(t);
    for (int64_t d = l; d < n; ++d) {
      path.push_back(static_cast<int32_t>(trie_byte_.size()));
      trie_byte_.push_back(p[d]);
      trie_depth_.push_back(static_cast<int32_t>(d + 1));
      trie_end_.push_back(0);
    }
    tok_node.push_back(path.back());  // l == n only for a duplicate of the previous token's bytes
    trie_tok_.push_back(t);
  }
  while (!path.empty()) {
    trie_end_[path.back()] = static_cast<int32_t>(trie_byte_.size());
    path.pop_back();
  }
  trie_tok_off_.assign(trie_byte_.size() + 1, 0);
  for (int32_t node : tok_node) ++trie_tok_off_[node + 1];
  for (size_t i = 0; i < trie_byte_.size(); ++i) trie_tok_off_[i + 1] += trie_tok_off_[i];
}

void Vocab::state_mask(const int32_t* table, int32_t s, uint32_t* out, int32_t* stack) const {
  std::memset(out, 0, words_ * sizeof(uint32_t));
  stack[0] = s;
  const int32_t n = static_cast<int32_t>(trie_byte_.size());
  const uint8_t* byte = trie_byte_.data();
  const int32_t* depth = trie_depth_.data();
  const int32_t* end = trie_end_.data();
  const int32_t* off = trie_tok_off_.data();
  const int32_t* tok = trie_tok_.data();
  for (int32_t i = 0; i < n;) {
    const int32_t d = depth[i];
    const int32_t cur = table[static_cast<int64_t>(stack[d - 1]) * 256 + byte[i]];
    if (cur < 0) {
      i = end[i];
      continue;
    }
    stack[d] = cur;
    for (int32_t k = off[i]; k < off[i + 1]; ++k) out[tok[k] >> 5] |= 1u << (tok[k] & 31);
    ++i;
  }
}

// ------------------------------------------------------------------------------------------ compile

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

// ------------------------------------------------------------------------------------------ apply

namespace {
constexpr int64_t kChunkWords = 1024;  // 32k tokens per task

// Branch-free per 32-token word so that the compiler vectorises the select (a blend per lane):
// the cost is then one pass over the logits whatever the mask looks like.
__attribute__((target_clones("avx512f", "avx2", "default"))) void apply_words(float* row, const uint32_t* m,
                                                                              int64_t w0, int64_t w1, int64_t V) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t full = std::min(w1, V / 32);
  for (int64_t w = w0; w < full; ++w) {
    const uint32_t bits = m[w];
    if (bits == 0xFFFFFFFFu) continue;
    float* p = row + w * 32;
    for (int j = 0; j < 32; ++j) p[j] = ((bits >> j) & 1u) ? p[j] : ninf;
  }
  for (int64_t w = std::max(w0, full); w < w1; ++w) {  // the last, partial word
    const uint32_t bits = m[w];
    float* p = row + w * 32;
    for (int64_t j = 0; j < V - w * 32; ++j)
      if (!((bits >> j) & 1u)) p[j] = ninf;
  }
}
}  // namespace

void apply_bitmask(float* logits, int64_t B, int64_t V, int64_t stride, const uint32_t* bitmask, int64_t W,
                   const uint8_t* rows_active, int nthreads) {
  const int64_t vw = std::min<int64_t>(W, (V + 31) / 32);
  const int64_t chunks = (vw + kChunkWords - 1) / kChunkWords;
  auto& pool = ThreadPool::global();
  pool.parallel_for(
      B * chunks,
      [&](int64_t task) {
        const int64_t r = task / chunks, c = task % chunks;
        if (rows_active && !rows_active[r]) return;
        const int64_t w0 = c * kChunkWords, w1 = std::min(vw, w0 + kChunkWords);
        apply_words(logits + r * stride, bitmask + r * W, w0, w1, V);
      },
      B * V >= (1 << 16) ? nthreads : 1);
}

// ------------------------------------------------------------------------------------------ batch

void BatchState::ensure(int64_t n) {
  if (static_cast<int64_t>(rows_.size()) < n) rows_.resize(n);
}

void BatchState::prepare(int64_t B, int nthreads) const {
  std::vector<std::pair<const Grammar*, int64_t>> todo;
  const int64_t n = std::min<int64_t>(B, rows_.size());
  for (int64_t r = 0; r < n; ++r) {
    const Grammar* g = rows_[r].grammar.get();
    if (!g) continue;
    const int64_t s = rows_[r].state < 0 ? g->S : rows_[r].state;
    if (!g->ready(s)) todo.emplace_back(g, s);
  }
  if (todo.empty()) return;
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  ThreadPool::global().parallel_for(
      static_cast<int64_t>(todo.size()), [&](int64_t i) { todo[i].first->ensure(todo[i].second); }, nthreads);
}

void BatchState::fill(uint32_t* out, int64_t B, int64_t W, uint8_t* active, int nthreads) const {
  prepare(B, nthreads);
  const int64_t vw = vocab_->words();
  auto& pool = ThreadPool::global();
  const int64_t per = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, vw));  // rows per task (~32 KiB)
  const int64_t ntasks = (B + per - 1) / per;
  pool.parallel_for(
      ntasks,
      [&](int64_t task) {
        for (int64_t r = task * per; r < std::min(B, (task + 1) * per); ++r) {
          uint32_t* dst = out + r * W;
          const RowCore* row = r < static_cast<int64_t>(rows_.size()) ? &rows_[r] : nullptr;
          if (!row || !row->grammar) {
            std::memset(dst, 0xFF, W * sizeof(uint32_t));
            if (active) active[r] = 0;
            continue;
          }
          const Grammar& g = *row->grammar;
          const int64_t s = row->state < 0 ? g.S : row->state;
          std::memcpy(dst, g.row(s), std::min(W, vw) * sizeof(uint32_t));
          if (W > vw) std::memset(dst + vw, 0, (W - vw) * sizeof(uint32_t));
          if (active) active[r] = 1;
        }
      },
      B * vw >= 4096 ? nthreads : 1);
}

void BatchState::fill_apply(float* logits, int64_t B, int64_t V, int64_t stride, uint32_t* out, int64_t W,
                            int nthreads) const {
  prepare(B, nthreads);
  const int64_t vw = vocab_->words();
  const int64_t lw = std::min<int64_t>((V + 31) / 32, W);
  const int64_t chunks = (lw + kChunkWords - 1) / kChunkWords;
  auto& pool = ThreadPool::global();
  pool.parallel_for(
      B * chunks,
      [&](int64_t task) {
        const int64_t r = task / chunks, c = task % chunks;
        const int64_t w0 = c * kChunkWords, w1 = std::min(lw, w0 + kChunkWords);
        const RowCore* row = r < static_cast<int64_t>(rows_.size()) ? &rows_[r] : nullptr;
        uint32_t* dst = out ? out + r * W : nullptr;
        if (!row || !row->grammar) {
          if (dst) {
            std::memset(dst + w0, 0xFF, (w1 - w0) * sizeof(uint32_t));
            if (c == chunks - 1 && W > lw) std::memset(dst + lw, 0xFF, (W - lw) * sizeof(uint32_t));
          }
          return;
        }
        const Grammar& g = *row->grammar;
        const int64_t s = row->state < 0 ? g.S : row->state;
        const uint32_t* src = g.row(s);
        if (dst) {
          const int64_t cw = std::max<int64_t>(0, std::min(w1, vw) - w0);
          std::memcpy(dst + w0, src + w0, cw * sizeof(uint32_t));
          if (w1 > vw) std::memset(dst + std::max(w0, vw), 0, (w1 - std::max(w0, vw)) * sizeof(uint32_t));
          if (c == chunks - 1 && W > lw) std::memset(dst + lw, 0, (W - lw) * sizeof(uint32_t));
          apply_words(logits + r * stride, dst, w0, w1, V);
        } else if (w1 <= vw) {
          apply_words(logits + r * stride, src, w0, w1, V);
        } else {
          // logits wider than the vocabulary: tokens past it are never allowed
          apply_words(logits + r * stride, src, w0, vw, V);
          float* p = logits + r * stride;
          for (int64_t t = vw * 32; t < V; ++t) p[t] = -std::numeric_limits<float>::infinity();
        }
      },
      B * V >= (1 << 16) ? nthreads : 1);
}

}  // namespace llmserve
