// A fast checksum of the constraint cache files (llmserve/constraints/disk_cache.py), to catch a file
// that was corrupted, truncated or rewritten: it is verified on every load, so it must cost little
// next to reading the file (a few GB/s). Not cryptographic: it detects accidents, not an attacker
// who can write the cache folder (who could write a matching checksum too).
//
// Definition (disk_cache.py has the same in numpy, for builds without the core): the data, padded
// with zeros to a multiple of 8 bytes, as little-endian uint64 words x_i;
//   h = sum_i term((x_i ^ (i * K1)) + seed)  (mod 2^64),  result = finish(h ^ (len * K2))
// with term(z) = z' ^ (z' >> 29), z' = (z ^ (z >> 32)) * K3, and finish = splitmix64's finaliser.
// Each word is mixed with its index, so moved or swapped words change the sum; the terms are
// independent, so the loop vectorises and large buffers split over the thread pool.
#pragma once

#include <cstdint>

namespace llmserve {

uint64_t checksum(const uint8_t* data, int64_t n, uint64_t seed);

}  // namespace llmserve
