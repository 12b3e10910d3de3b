// A compressed automaton's transitions packed as a comb (row displacement with an owner check, the
// classic scanner-table compression). A JSON schema's automaton moves on a few of its ~50-80 byte
// classes per state (5-11% of the class columns live in the large corpus forms), so once the mask
// rows are shared the columns were most of a large form's memory; the comb holds one slot per live
// entry: next(s, c) = slot[base[s] + c].next if slot[base[s] + c].owner == s, else -1.
#pragma once

#include <cstdint>
#include <vector>

#include "vocab_trie.h"

namespace llmserve {

struct Comb {
  std::vector<int32_t> base;   // [S]: every base[s] + C <= N, so no lookup needs a bound check
  std::vector<int32_t> slots;  // [N, 2]: (owner, next), (-1, -1) where no state owns the slot
};

// The columns [S, C] (entries -1 or a state) packed first-fit, states with the most live entries
// first: each state at the lowest base where its live classes land on free slots.
Comb pack_comb(const int32_t* columns, int64_t S, int64_t C);

// An automaton's transitions as a compressed form holds them: its fewest byte classes into cls[256]
// (byte_classes) and their columns packed as a comb.
Comb comb_of(const Transitions& tr, int64_t S, uint8_t* cls);

}  // namespace llmserve
