// A tokenizer's vocabulary as bytes, with a token trie so that one DFA state's mask row costs a walk
// over the prefixes the state allows, not over every token.
//
// Layout shared with Python (llmserve/constraints/vocab.py, Vocab.packed):
//   offsets int64[size+1], data uint8: token i = data[offsets[i]:offsets[i+1]] (empty: never allowed)
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace llmserve {

// A DFA's transitions: the next state from s on byte b is t[s * stride + cls[b]] (-1: dead). A dense
// table is its own classes (the identity, stride 256); a construction keeps one column per class of
// bytes that every state treats alike (a JSON schema's ~2,000 states need a few dozen), a fraction
// of the 1 KB per state of a dense table. A compressed form packs those columns as a comb (comb.h):
// with `base` set, t (or t16) holds the (owner, next) slots, and s moves on b only where the slot at
// base[s] + cls[b] is its own.
struct Transitions {
  const int32_t* t = nullptr;
  const uint8_t* cls = nullptr;
  int64_t stride = 256;
  // set instead of t: the same in 16 bits, for an automaton of at most kMax16 states
  const int16_t* t16 = nullptr;
  const int32_t* base = nullptr;  // set: a comb
  static constexpr int64_t kMax16 = 32767;
  int32_t next(int32_t s, uint8_t b) const {
    if (base) {
      const int64_t i = 2 * (static_cast<int64_t>(base[s]) + cls[b]);
      if (t16) return t16[i] == s ? t16[i + 1] : -1;
      return t[i] == s ? t[i + 1] : -1;
    }
    const int64_t i = static_cast<int64_t>(s) * stride + cls[b];
    return t16 ? t16[i] : t[i];
  }
  static Transitions dense(const int32_t* table);
  // f(view), where view.next(s, b) is next(s, b) for this layout alone: a walk over the token trie
  // makes thousands of steps from one state, and the choice of layout on each of them cost 20% of
  // the exact distance search over a comb.
  template <class F>
  decltype(auto) visit(F&& f) const;
};

namespace layout {
template <class T>
struct Columns {
  const T* t;
  const uint8_t* cls;
  int64_t stride;
  int32_t next(int32_t s, uint8_t b) const { return t[static_cast<int64_t>(s) * stride + cls[b]]; }
};
template <class T>
struct Comb {
  const T* slots;
  const int32_t* base;
  const uint8_t* cls;
  int32_t next(int32_t s, uint8_t b) const {
    const T* slot = slots + 2 * (static_cast<int64_t>(base[s]) + cls[b]);
    return slot[0] == s ? slot[1] : -1;
  }
};
}  // namespace layout

template <class F>
decltype(auto) Transitions::visit(F&& f) const {
  if (base) return t16 ? f(layout::Comb<int16_t>{t16, base, cls}) : f(layout::Comb<int32_t>{t, base, cls});
  return t16 ? f(layout::Columns<int16_t>{t16, cls, stride}) : f(layout::Columns<int32_t>{t, cls, stride});
}

// The byte classes of an automaton, fewest (bytes every state treats alike share one): cls[256]
// (classes numbered by first byte) and the table with one column per class, [S, C]. From a dense
// table or from classes already (a construction's letters may leave two columns equal).
std::vector<int32_t> byte_classes(const Transitions& tr, int64_t S, uint8_t* cls, int64_t& C);

class Vocab {
 public:
  Vocab(std::vector<int64_t> offsets, std::vector<uint8_t> data, std::vector<int32_t> eos, int64_t size);
  int64_t size() const { return size_; }
  int64_t words() const { return words_; }
  int64_t len(int64_t t) const { return offsets_[t + 1] - offsets_[t]; }
  const uint8_t* ptr(int64_t t) const { return data_.data() + offsets_[t]; }
  bool is_eos(int64_t t) const { return is_eos_[t] != 0; }
  const std::vector<int32_t>& eos() const { return eos_; }
  int64_t max_len() const { return max_len_; }

  // Row of the token mask for DFA state s (without the end-of-sequence rule): the tokens whose
  // bytes walk the DFA from s without dying. A depth-first walk over the token trie that skips
  // a whole subtree as soon as its prefix dies, so a state that allows few bytes costs little.
  // `stack` must hold max_len() + 1 entries.
  void state_mask(const Transitions& tr, int32_t s, uint32_t* out, int32_t* stack) const;
  // The same walk over any automaton: next(q, byte) is the next state (-1: dead), e.g. one built as
  // it is walked (lazy_dfa.h).
  template <class Next>
  void walk_mask(Next&& next, int32_t s, uint32_t* out, int32_t* stack) const {
    std::memset(out, 0, words_ * sizeof(uint32_t));
    stack[0] = s;
    const int32_t n = static_cast<int32_t>(trie_byte_.size());
    const uint8_t* byte = trie_byte_.data();
    const int32_t* depth = trie_depth_.data();
    const int32_t* end = trie_end_.data();
    const int32_t* off = trie_tok_off_.data();
    const int32_t* tok = trie_tok_.data();
    for (int32_t i = 0; i < n;) {
      const int32_t d = depth[i];
      const int32_t cur = next(stack[d - 1], byte[i]);
      if (cur < 0) {
        i = end[i];
        continue;
      }
      stack[d] = cur;
      for (int32_t k = off[i]; k < off[i + 1]; ++k) out[tok[k] >> 5] |= 1u << (tok[k] & 31);
      ++i;
    }
  }
  // The same walk, keeping only the tokens that end in a state q with dist[q] <= k: the tokens that
  // still let the answer end within k more tokens (dist: fewest tokens to an accepting state).
  void state_mask_within(const Transitions& tr, int32_t s, const int32_t* dist, int32_t k, uint32_t* out,
                         int32_t* stack) const;
  // min over the tokens that walk from s of dist[end state] (INT32_MAX when none).
  int32_t min_successor(const Transitions& tr, int32_t s, const int32_t* dist, int32_t* stack) const;
  // The ids of the tokens whose bytes end at trie node `node`: [first, last).
  std::pair<const int32_t*, const int32_t*> node_tokens(int32_t node) const {
    return {trie_tok_.data() + trie_tok_off_[node], trie_tok_.data() + trie_tok_off_[node + 1]};
  }
  // Length of the longest token that s[0 .. n) starts with (0: none).
  int64_t longest_token(const uint8_t* s, int64_t n) const;
  // The tokens of s[0 .. n) cut into the longest token at each point (-1: a byte starts no token).
  int32_t longest_cut(const uint8_t* s, int64_t n) const;
  // Where the tokens of answer[0 .. n) (longest_cut's tokens) start, walked from s, and the state
  // the answer ends in: path[i] for token i, path[tokens] the end. Empty when a byte starts no
  // token, the walk leaves the automaton or the end does not accept. (tr: anything with
  // next(state, byte); accepting(state) -> bool.)
  template <class Tr, class Accepting>
  std::vector<int32_t> token_path(Tr&& tr, Accepting&& accepting, int32_t s, const uint8_t* answer,
                                  int64_t n) const {
    std::vector<int32_t> path{s};
    for (int64_t p = 0; p < n;) {
      const int64_t len = longest_token(answer + p, n - p);
      if (len == 0) return {};
      for (const int64_t end = p + len; p < end; ++p) {
        s = tr.next(s, answer[p]);
        if (s < 0) return {};
      }
      path.push_back(s);
    }
    if (!accepting(s)) return {};
    return path;
  }
  // Calls stop(q, node) with the end state q of the tokens that walk from s, once per trie node
  // where tokens end (their ids: node_tokens(node)), until it returns true. `stack` as for state_mask.
  // (tr: Transitions, or any automaton with next(state, byte))
  template <class Tr, class Stop>
  void each_successor(Tr&& tr, int32_t s, int32_t* stack, Stop&& stop) const {
    stack[0] = s;
    const int32_t n = static_cast<int32_t>(trie_byte_.size());
    for (int32_t i = 0; i < n;) {
      const int32_t d = trie_depth_[i];
      const int32_t cur = tr.next(stack[d - 1], trie_byte_[i]);
      if (cur < 0) {
        i = trie_end_[i];
        continue;
      }
      stack[d] = cur;
      if (trie_tok_off_[i + 1] > trie_tok_off_[i] && stop(cur, i)) return;
      ++i;
    }
  }

 private:
  // order: the ids of tokens with bytes, sorted by their bytes; lcp: prefix shared with the previous
  void build_trie(const std::vector<int32_t>& order, const std::vector<int32_t>& lcp);
  std::vector<int64_t> offsets_;
  std::vector<uint8_t> data_;
  std::vector<int32_t> eos_;
  std::vector<uint8_t> is_eos_;
  int64_t size_, words_, max_len_;
  // token trie, nodes in preorder: node i is entered by byte trie_byte_[i] from its parent, the
  // last node of depth trie_depth_[i] - 1 before it; trie_end_[i] is one past its subtree; the
  // tokens whose bytes end at node i are trie_tok_[trie_tok_off_[i] .. trie_tok_off_[i + 1]).
  std::vector<uint8_t> trie_byte_;
  std::vector<int32_t> trie_depth_, trie_end_, trie_tok_off_, trie_tok_;
};

// Fewest tokens from `start` to an accepting state of the automaton (S states), found by a
// breadth-first search over token steps from `start` alone: what a budget check needs, at the cost
// of the states nearer the start than the shortest answer, where the distances of every state
// (min_successor, round after round) cost a walk per state per round. tokens: the count, INT32_MAX
// when no accepting state is reachable, or -1 when `budget_ms` (> 0) ran out first; then every
// answer takes more than `explored` tokens.
struct FewestTokens {
  int32_t tokens;
  int32_t explored;
};
FewestTokens fewest_tokens(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t start,
                           int64_t budget_ms);
// The same search over any automaton a: a.next(state, byte) (-1: dead), a.accepting(state); states
// may be numbered as the search finds them (an automaton built as it is walked).
template <class Automaton>
FewestTokens fewest_tokens_in(const Vocab& v, Automaton& a, int32_t start, int64_t budget_ms) {
  if (a.accepting(start)) return {0, 0};
  // at most a day: a larger budget would overflow the clock's arithmetic
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::min<int64_t>(budget_ms, 86400000));
  std::vector<int32_t> stack(v.max_len() + 2);
  std::vector<uint8_t> seen(static_cast<size_t>(start) + 1, 0);
  std::vector<int32_t> frontier{start}, next;
  seen[start] = 1;
  for (int32_t level = 0; !frontier.empty(); ++level) {
    // every state in `frontier` is `level` tokens from the start, none fewer
    bool found = false;
    for (const int32_t s : frontier) {
      if (budget_ms > 0 && std::chrono::steady_clock::now() > deadline) return {-1, level};
      v.each_successor(a, s, stack.data(), [&](int32_t q, int32_t) {
        if (a.accepting(q)) return found = true;
        if (static_cast<size_t>(q) >= seen.size()) seen.resize(static_cast<size_t>(q) + 1, 0);
        if (!seen[q]) {
          seen[q] = 1;
          next.push_back(q);
        }
        return false;
      });
      if (found) return {level + 1, level};
    }
    frontier.swap(next);
    next.clear();
  }
  return {INT32_MAX, 0};
}

// Per state, the fewest steps over the bytes with usable[b] != 0 to an accepting state (INT32_MAX:
// none), into dist[S]: a breadth-first search backwards from the accepting states.
void byte_distances(const Transitions& tr, const uint8_t* accept, int64_t S, const uint8_t* usable, int32_t* dist);

// The bytes of one shortest answer from `start` into `out`: over the bytes that are tokens by
// themselves where those reach acceptance (so that every byte of it starts a token), else over any
// bytes. False when no accepting state is reachable.
bool shortest_answer(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t start,
                     std::vector<uint8_t>& out);

// The tokens of one answer from `start`, an upper bound of the fewest that costs about a search over
// bytes: shortest_answer cut into the longest token at each point. INT32_MAX when no accepting state
// is reachable; -1 when the cut reaches a byte that starts no token.
int32_t greedy_tokens(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t start);

}  // namespace llmserve
