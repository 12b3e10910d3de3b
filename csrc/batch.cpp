#include "batch.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "apply.h"
#include "thread_pool.h"

namespace llmserve {

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
          g.row_words(s, 0, std::min(W, vw), dst);
          if (W > vw) std::memset(dst + vw, 0, (W - vw) * sizeof(uint32_t));
          if (active) active[r] = 1;
        }
      },
      pool.threads_for_bytes(2 * B * W * int64_t(sizeof(uint32_t)), nthreads));
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
        if (dst) {
          if (w0 < vw) g.row_words(s, w0, std::min(w1, vw), dst + w0);
          if (w1 > vw) std::memset(dst + std::max(w0, vw), 0, (w1 - std::max(w0, vw)) * sizeof(uint32_t));
          if (c == chunks - 1 && W > lw) std::memset(dst + lw, 0, (W - lw) * sizeof(uint32_t));
          apply_words(logits + r * stride, dst, w0, w1, V);
        } else {
          const int64_t mw = std::min(w1, vw);
          float* p = logits + r * stride;
          if (!g.compact) {
            apply_words(p, g.row_ptr(s), w0, mw, V);
          } else if (w0 < mw) {
            // the chunk's words expanded where the logits pass reads them (4 KiB, in L1)
            uint32_t buf[kChunkWords];
            g.row_words(s, w0, mw, buf);
            apply_words(p + w0 * 32, buf, 0, mw - w0, V - w0 * 32);
          }
          // logits wider than the vocabulary: tokens past it are never allowed
          if (w1 > vw)
            for (int64_t t = std::max(w0, vw) * 32; t < std::min(V, w1 * 32); ++t)
              p[t] = -std::numeric_limits<float>::infinity();
        }
      },
      pool.threads_for_bytes(2 * B * V * int64_t(sizeof(float)), nthreads));
}

}  // namespace llmserve
