#include "checksum.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "thread_pool.h"

namespace llmserve {

namespace {
constexpr uint64_t K1 = 0x9E3779B97F4A7C15ull, K2 = 0xC2B2AE3D27D4EB4Full;

constexpr uint64_t K3 = 0xBF58476D1CE4E5B9ull, K4 = 0x94D049BB133111EBull;

// one multiply per word (the per-word term); the final value gets splitmix64's full finaliser
inline uint64_t term(uint64_t z) {
  z = (z ^ (z >> 32)) * K3;
  return z ^ (z >> 29);
}

inline uint64_t finish(uint64_t z) {
  z = (z ^ (z >> 30)) * K3;
  z = (z ^ (z >> 27)) * K4;
  return z ^ (z >> 31);
}

// words [i0, i1) of w
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) uint64_t sum_words(const uint64_t* w, int64_t i0,
                                                                                        int64_t i1, uint64_t seed) {
  uint64_t h = 0;
  for (int64_t i = i0; i < i1; ++i) h += term((w[i] ^ (static_cast<uint64_t>(i) * K1)) + seed);
  return h;
}

// The terms are independent and summed, so large buffers are split over the pool (a cache hit
// verifies megabytes on the request path).
uint64_t sum_words_parallel(const uint64_t* w, int64_t n, uint64_t seed) {
  constexpr int64_t kChunk = 32768;  // words per task: 256 KiB
  const int64_t tasks = (n + kChunk - 1) / kChunk;
  if (tasks <= 1) return sum_words(w, 0, n, seed);
  std::vector<uint64_t> part(tasks, 0);
  ThreadPool::global().parallel_for(
      tasks, [&](int64_t t) { part[t] = sum_words(w, t * kChunk, std::min(n, (t + 1) * kChunk), seed); });
  uint64_t h = 0;
  for (uint64_t p : part) h += p;
  return h;
}
}  // namespace

uint64_t checksum(const uint8_t* data, int64_t n, uint64_t seed) {
  const int64_t full = n / 8;
  uint64_t h;
  if (reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) == 0) {
    h = sum_words_parallel(reinterpret_cast<const uint64_t*>(data), full, seed);
  } else {
    h = 0;
    for (int64_t i = 0; i < full; ++i) {
      uint64_t x;
      std::memcpy(&x, data + 8 * i, 8);
      h += term((x ^ (static_cast<uint64_t>(i) * K1)) + seed);
    }
  }
  if (n % 8) {
    uint64_t x = 0;
    std::memcpy(&x, data + 8 * full, n % 8);
    h += term((x ^ (static_cast<uint64_t>(full) * K1)) + seed);
  }
  return finish(h ^ (static_cast<uint64_t>(n) * K2));
}

}  // namespace llmserve
