#include "checksum.h"

#include <cstring>

namespace llmserve {

namespace {
constexpr uint64_t K1 = 0x9E3779B97F4A7C15ull, K2 = 0xC2B2AE3D27D4EB4Full;

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) uint64_t sum_words(const uint64_t* w, int64_t n,
                                                                                  uint64_t seed) {
  uint64_t h = 0;
  for (int64_t i = 0; i < n; ++i) h += mix((w[i] ^ (static_cast<uint64_t>(i) * K1)) + seed);
  return h;
}
}  // namespace

uint64_t checksum(const uint8_t* data, int64_t n, uint64_t seed) {
  const int64_t full = n / 8;
  uint64_t h;
  if (reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) == 0) {
    h = sum_words(reinterpret_cast<const uint64_t*>(data), full, seed);
  } else {
    h = 0;
    for (int64_t i = 0; i < full; ++i) {
      uint64_t x;
      std::memcpy(&x, data + 8 * i, 8);
      h += mix((x ^ (static_cast<uint64_t>(i) * K1)) + seed);
    }
  }
  if (n % 8) {
    uint64_t x = 0;
    std::memcpy(&x, data + 8 * full, n % 8);
    h += mix((x ^ (static_cast<uint64_t>(full) * K1)) + seed);
  }
  return mix(h ^ (static_cast<uint64_t>(n) * K2));
}

}  // namespace llmserve
