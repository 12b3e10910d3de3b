#include "comb.h"

#include <algorithm>
#include <numeric>

namespace llmserve {

namespace {

// Slots taken so far, one bit each; past the end every slot is free.
class Taken {
 public:
  void set(int64_t i) {
    const auto w = static_cast<size_t>(i >> 6);
    if (w >= bits_.size()) bits_.resize(std::max(w + 1, 2 * bits_.size()), 0);
    bits_[w] |= uint64_t(1) << (i & 63);
  }
  // bit j: slot i + j is taken, for the 64 slots from i
  uint64_t window(int64_t i) const {
    const int64_t w = i >> 6, shift = i & 63;
    const uint64_t low = word(w) >> shift;
    return shift == 0 ? low : low | (word(w + 1) << (64 - shift));
  }
  // the first free slot at or after i
  int64_t free_from(int64_t i) const {
    for (;; i = (i | 63) + 1) {
      const uint64_t open = ~window(i);
      if (open != 0) return i + __builtin_ctzll(open);
    }
  }

 private:
  uint64_t word(int64_t w) const { return w < static_cast<int64_t>(bits_.size()) ? bits_[w] : 0; }
  std::vector<uint64_t> bits_;
};

}  // namespace

Comb pack_comb(const int32_t* columns, int64_t S, int64_t C) {
  std::vector<int32_t> live(S, 0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) live[s] += columns[s * C + c] >= 0;
  std::vector<int32_t> order(S);
  std::iota(order.begin(), order.end(), 0);
  // the widest states first, while the slots are still open: the narrow ones fill the gaps after
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return live[a] > live[b]; });

  Comb comb;
  comb.base.assign(S, 0);
  Taken taken;
  int64_t first_free = 0, top = 0;
  std::vector<int64_t> cols;
  for (int32_t s : order) {
    if (live[s] == 0) break;  // sorted: the rest own nothing (base 0: no slot names them)
    cols.clear();
    for (int64_t c = 0; c < C; ++c)
      if (columns[s * C + c] >= 0) cols.push_back(c);
    // the lowest base where every live class lands on a free slot, tried 64 bases at a time: bit j of
    // `clash` is set when base lo + j puts some live class on a taken slot
    int64_t lo = std::max<int64_t>(0, first_free - cols[0]);
    for (;; lo += 64) {
      uint64_t clash = 0;
      for (size_t k = 0; k < cols.size() && clash != ~uint64_t(0); ++k) clash |= taken.window(lo + cols[k]);
      if (clash != ~uint64_t(0)) {
        lo += __builtin_ctzll(~clash);
        break;
      }
    }
    comb.base[s] = static_cast<int32_t>(lo);
    for (int64_t c : cols) taken.set(lo + c);
    first_free = taken.free_from(first_free);
    top = std::max(top, lo);
  }
  const int64_t N = top + C;
  comb.slots.assign(2 * N, -1);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) {
      const int32_t to = columns[s * C + c];
      if (to < 0) continue;
      const int64_t i = 2 * (static_cast<int64_t>(comb.base[s]) + c);
      comb.slots[i] = static_cast<int32_t>(s);
      comb.slots[i + 1] = to;
    }
  return comb;
}

Comb comb_of(const Transitions& tr, int64_t S, uint8_t* cls) {
  int64_t C = 0;
  const std::vector<int32_t> columns = byte_classes(tr, S, cls, C);
  return pack_comb(columns.data(), S, C);
}

}  // namespace llmserve
