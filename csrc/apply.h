// Applying a packed token bitmask to logits: disallowed tokens become -inf.
//
// bitmask uint32[B, W]: bit (t % 32) of word (t / 32) set = token t allowed
#pragma once

#include <cstdint>

namespace llmserve {

// Words per task of a parallel apply (32k tokens): a row is split in chunks so that a small batch
// of wide rows still spreads over the pool.
constexpr int64_t kChunkWords = 1024;

// logits[w0 * 32, min(w1 * 32, V)) of one row: tokens whose bit in m is clear become -inf.
void apply_words(float* row, const uint32_t* m, int64_t w0, int64_t w1, int64_t V);

// Rows r < B (those with rows_active[r] set, or all when it is null) of logits[B, V] (row stride
// `stride` floats) against bitmask[B, W].
void apply_bitmask(float* logits, int64_t B, int64_t V, int64_t stride, const uint32_t* bitmask, int64_t W,
                   const uint8_t* rows_active, int nthreads);

}  // namespace llmserve
