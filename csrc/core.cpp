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
  for (int64_t i = 0; i < size_; ++i)
    if (len(i) > 0) order_.push_back(static_cast<int32_t>(i));
  std::sort(order_.begin(), order_.end(), [this](int32_t a, int32_t b) {
    const uint8_t *pa = ptr(a), *pb = ptr(b);
    int64_t la = len(a), lb = len(b);
    int c = std::memcmp(pa, pb, std::min(la, lb));
    if (c != 0) return c < 0;
    if (la != lb) return la < lb;
    return a < b;
  });
  lcp_.assign(order_.size(), 0);
  for (size_t k = 1; k < order_.size(); ++k) {
    int32_t a = order_[k - 1], b = order_[k];
    int64_t n = std::min(len(a), len(b)), l = 0;
    const uint8_t *pa = ptr(a), *pb = ptr(b);
    while (l < n && pa[l] == pb[l]) ++l;
    lcp_[k] = static_cast<int32_t>(l);
  }
  max_len_ = 0;
  for (int64_t i = 0; i < size_; ++i) max_len_ = std::max(max_len_, len(i));
}

// ------------------------------------------------------------------------------------------ compile

void compile_masks(const Vocab& v, const int32_t* table, const uint8_t* accept, int64_t S, uint32_t* out,
                   int nthreads) {
  const int64_t W = v.words();
  auto one_state = [&](int64_t s, std::vector<int32_t>& st) {
    uint32_t* m = out + s * W;
    std::memset(m, 0, W * sizeof(uint32_t));
    const auto& order = v.order();
    const auto& lcp = v.lcp();
    int64_t depth_ok = 0;  // st[0..depth_ok] hold live states along the previous token's bytes
    bool dead = false;     // the previous token died at byte depth_ok
    st[0] = static_cast<int32_t>(s);
    for (size_t k = 0; k < order.size(); ++k) {
      const int32_t t = order[k];
      const int64_t l = lcp[k];
      if (dead && l > depth_ok) continue;  // shares the dead prefix
      int64_t d = std::min<int64_t>(l, depth_ok);
      const uint8_t* p = v.ptr(t);
      const int64_t n = v.len(t);
      dead = false;
      int32_t cur = st[d];
      for (; d < n; ++d) {
        cur = table[static_cast<int64_t>(cur) * 256 + p[d]];
        if (cur < 0) break;
        st[d + 1] = cur;
      }
      if (d < n) {
        depth_ok = d;
        dead = true;
      } else {
        depth_ok = n;
        m[t >> 5] |= 1u << (t & 31);
      }
    }
    bool any = false;
    for (int64_t w = 0; w < W && !any; ++w) any = m[w] != 0;
    if (accept[s] || !any)
      for (int32_t e : v.eos()) m[e >> 5] |= 1u << (e & 31);
  };
  auto& pool = ThreadPool::global();
  pool.parallel_for(
      S,
      [&](int64_t s) {
        thread_local std::vector<int32_t> st;
        if (st.size() < static_cast<size_t>(v.max_len() + 2)) st.resize(v.max_len() + 2);
        one_state(s, st);
      },
      nthreads);
  // dead row: end of sequence only
  uint32_t* m = out + S * W;
  std::memset(m, 0, W * sizeof(uint32_t));
  for (int32_t e : v.eos()) m[e >> 5] |= 1u << (e & 31);
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

// ------------------------------------------------------------------------------------------ apply

namespace {
constexpr int64_t kChunkWords = 1024;  // 32k tokens per task

__attribute__((target_clones("avx512f", "avx2", "default"))) void apply_words(float* row, const uint32_t* m,
                                                                              int64_t w0, int64_t w1, int64_t V) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t w = w0; w < w1; ++w) {
    const uint32_t bits = m[w];
    if (bits == 0xFFFFFFFFu) continue;
    float* p = row + w * 32;
    const int64_t lim = std::min<int64_t>(32, V - w * 32);
    if (lim == 32) {
      for (int j = 0; j < 32; ++j)
        if (!((bits >> j) & 1u)) p[j] = ninf;
    } else {
      for (int64_t j = 0; j < lim; ++j)
        if (!((bits >> j) & 1u)) p[j] = ninf;
    }
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

void BatchState::fill(uint32_t* out, int64_t B, int64_t W, uint8_t* active, int nthreads) const {
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
          std::memcpy(dst, g.masks + s * vw, std::min(W, vw) * sizeof(uint32_t));
          if (W > vw) std::memset(dst + vw, 0, (W - vw) * sizeof(uint32_t));
          if (active) active[r] = 1;
        }
      },
      B * vw >= 4096 ? nthreads : 1);
}

void BatchState::fill_apply(float* logits, int64_t B, int64_t V, int64_t stride, uint32_t* out, int64_t W,
                            int nthreads) const {
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
        const uint32_t* src = g.masks + s * vw;
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
