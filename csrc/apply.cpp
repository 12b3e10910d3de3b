#include "apply.h"

#include <algorithm>
#include <limits>

#include "thread_pool.h"

namespace llmserve {

// Branch-free per 32-token word so that the compiler vectorises the select (a blend per lane):
// the cost is then one pass over the logits whatever the mask looks like. The clones are picked
// once, at load, by the CPU (an ifunc), so callers in other files get the same code.
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
      pool.threads_for_bytes(2 * B * V * int64_t(sizeof(float)), nthreads));
}

}  // namespace llmserve
