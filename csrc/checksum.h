// A fast checksum of the constraint cache files (llmserve/constraints/disk_cache.py), to catch a file
// that was corrupted, truncated or rewritten: it is verified on every load, so it must cost little
// next to reading the file (a few GB/s). Not cryptographic: it detects accidents, not an attacker
// who can write the cache folder (who could write a matching checksum too).
//
// Definition (disk_cache.py has the same in numpy, for builds without the core): the data, padded
// with zeros to a multiple of 8 bytes, as little-endian uint64 words x_i;
//   h = sum_i mix((x_i ^ (i * K1)) + seed)  (mod 2^64),  result = mix(h ^ (len * K2))
// with mix(z) = splitmix64's finaliser. Each word is mixed with its index, so moved or swapped
// words change the sum; the terms are independent, so the loop vectorises.
#pragma once

#include <cstdint>

namespace llmserve {

uint64_t checksum(const uint8_t* data, int64_t n, uint64_t seed);

}  // namespace llmserve
