// Checked reading of the serialised AST (layout in dfa.h), shared by the NFA builder and the walks
// that answer questions about the NFA it would build without building it (tree_facts.h).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dfa.h"

namespace llmserve {

class AstReader {
 protected:
  AstReader(const int32_t* ast, int64_t n, Budget& budget) : ast_(ast), n_(n), budget_(budget) {}

  // Every word is read through at(): the array may come from a cache file a hostile writer crafted,
  // so a position outside it (past the end, or before the start after a bad count) is refused.
  int32_t at(int64_t i) const {
    if (i < 0 || i >= n_) throw std::invalid_argument("truncated AST");
    return ast_[i];
  }
  // A count of items read at `pos` (advanced past it): not negative, and no more than the rest of
  // the array holds at `words` words an item at least, so that any loop or allocation it drives is
  // bounded by the array's length.
  int32_t count_at(int64_t& pos, int64_t words, const char* what) {
    const int32_t c = at(pos++);
    if (c < 0) throw std::invalid_argument(std::string(what) + ": negative count");
    if (static_cast<int64_t>(c) * words > n_ - pos)
      throw std::invalid_argument(std::string(what) + ": count past the end of the AST");
    return c;
  }
  // lo, hi of a repetition or list (hi -1: unbounded), `pos` advanced past them
  std::pair<int32_t, int32_t> bounds_at(int64_t& pos, const char* what) {
    const int32_t lo = at(pos), hi = at(pos + 1);
    pos += 2;
    if (lo < 0 || hi < -1 || (hi >= 0 && hi < lo)) throw std::invalid_argument(what);
    return {lo, hi};
  }
  // the size S of an embedded automaton and its start, checked, `pos` advanced past them: S accept
  // flags and S rows (a count each at least) must fit in the rest of the array
  std::pair<int32_t, int32_t> dfa_size_at(int64_t& pos) {
    const int32_t count = at(pos), start = at(pos + 1);
    pos += 2;
    if (count <= 0 || start < 0 || start >= count) throw std::invalid_argument("embedded DFA: bad size or start");
    if (2 * static_cast<int64_t>(count) > n_ - pos)
      throw std::invalid_argument("embedded DFA: count past the end of the AST");
    return {count, start};
  }
  // one edge of an embedded automaton of `count` states, checked, `pos` advanced past it
  std::array<int32_t, 3> dfa_edge_at(int64_t& pos, int32_t count) {
    const int32_t lo = at(pos), hi = at(pos + 1), to = at(pos + 2);
    pos += 3;
    if (lo < 0 || hi > 255 || lo > hi || to < 0 || to >= count) throw std::invalid_argument("embedded DFA: bad edge");
    return {lo, hi, to};
  }
  // one code-point range of a set, checked, `pos` advanced past it
  std::pair<int32_t, int32_t> range_at(int64_t& pos) {
    const int32_t lo = at(pos), hi = at(pos + 1);
    pos += 2;
    if (lo < 0 || hi > 0x10FFFF || lo > hi) throw std::invalid_argument("code-point range out of bounds");
    return {lo, hi};
  }
  // f(sequence) for each UTF-8 byte-range sequence of a set's `count` ranges at `pos` (advanced
  // past them), range by range, in order
  template <class F>
  void each_sequence(int64_t& pos, int32_t count, F&& f) {
    std::vector<std::vector<std::pair<int, int>>> seqs;
    for (int32_t k = 0; k < count; ++k) {
      budget_.poll();
      const auto [lo, hi] = range_at(pos);
      seqs.clear();
      utf8_sequences(lo, hi, seqs);
      for (const auto& seq : seqs) f(seq);
    }
  }
  // the count of members and the at-least-one flag, checked, `pos` advanced past them: a member
  // takes 3 words at least (its flag and a node)
  std::pair<int32_t, int32_t> members_at(int64_t& pos) {
    const int32_t n = at(pos), at_least_one = at(pos + 1);
    pos += 2;
    if (n < 0) throw std::invalid_argument("members: bad count");
    if (3 * static_cast<int64_t>(n) > n_ - pos) throw std::invalid_argument("members: count past the end of the AST");
    return {n, at_least_one};
  }
  // The recursion's depth, bounded (a deep AST would overflow the stack): one per open node.
  struct Depth {
    int& d;
    explicit Depth(int& d_) : d(d_) {
      if (++d > kMaxAstDepth) throw std::invalid_argument("AST nested deeper than " + std::to_string(kMaxAstDepth));
    }
    ~Depth() { --d; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
  };
  // Step over the subtree at `pos` without reading it as a tree (a repetition or list of at most 0
  // copies). Its counts are checked as a walk checks them: each item then takes words of the array,
  // so the step is bounded by the array's length, and it polls the time budget as it goes.
  void skip(int64_t& pos) {
    Depth depth(skip_depth_);
    budget_.poll();
    const int32_t kind = at(pos++);
    if (kind == 0) {
      pos += 2 * static_cast<int64_t>(count_at(pos, 2, "set"));
    } else if (kind == 1 || kind == 2) {
      const int32_t count = count_at(pos, 2, kind == 1 ? "cat" : "alt");
      for (int32_t k = 0; k < count; ++k) skip(pos);
    } else if (kind == 3 || kind == 6) {
      bounds_at(pos, kind == 3 ? "repetition bounds" : "list bounds");
      skip(pos);
    } else if (kind == 4) {
      const int32_t count = dfa_size_at(pos).first;
      pos += count;  // the accept flags
      for (int32_t q = 0; q < count; ++q) {
        budget_.poll();
        pos += 3 * static_cast<int64_t>(count_at(pos, 3, "embedded DFA"));
      }
    } else if (kind == 5) {
      const int32_t n = members_at(pos).first;
      for (int32_t k = 0; k < n; ++k) {
        ++pos;  // the member's required flag
        skip(pos);
      }
    } else {
      throw std::invalid_argument("unknown AST node kind");
    }
  }

  const int32_t* ast_;
  int64_t n_;
  Budget& budget_;
  int depth_ = 0, skip_depth_ = 0;
};

}  // namespace llmserve
