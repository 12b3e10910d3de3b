// tree_facts (see tree_facts.h). Each count below mirrors a state() or move that NfaBuilder
// (dfa.cpp) makes for the same node; tests compare the two on random trees and real schemas.

#include "tree_facts.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ast_reader.h"

namespace llmserve {

namespace {

constexpr int64_t kMany = int64_t{1} << 60;  // counts saturate here: far past any state limit

int64_t add(int64_t a, int64_t b) { return std::min(a + b, kMany); }
int64_t mul(int64_t a, int64_t b) { return (a == 0 || b == 0) ? 0 : (a > kMany / b ? kMany : std::min(a * b, kMany)); }

struct OverCap {};  // the walk stops: the NFA would not fit

class FactsWalker : AstReader {
 public:
  FactsWalker(const int32_t* ast, int64_t n, const uint8_t* usable, int64_t cap, Budget& budget)
      : AstReader(ast, n, budget), cap_(std::min(cap, kMany - 1)) {  // counts saturate at kMany
    // first_[b]: the smallest usable byte >= b (256: none), so a byte range's usable byte is one look-up
    int next = 256;
    for (int b = 255; b >= 0; --b) {
      if (usable[b]) next = b;
      first_[b] = static_cast<int16_t>(next);
    }
  }

  TreeFacts run() {
    TreeFacts out;
    int64_t pos = 0;
    try {
      Node root = node(pos);
      if (pos != n_) throw std::invalid_argument("trailing data after the AST");
      out.states = root.states;
      out.moves = root.moves;
      out.answers = root.answers;
      out.answer = std::move(root.answer);
    } catch (const OverCap&) {
      out.states = cap_ + 1;
    }
    return out;
  }

 private:
  struct Node {
    int64_t states = 0, moves = 0;
    bool answers = true;
    std::string answer;
  };

  int usable_in(int lo, int hi) const { return first_[lo] <= hi ? first_[lo] : -1; }
  bool comma_usable() const { return first_[','] == ','; }  // the separator of members and lists

  // Past the cap the walk stops, checked as soon as a node's count grows, before its answer does:
  // an answer is never longer than twice its node's states, so the cap bounds every string here
  void over_cap(int64_t states) const {
    if (states > cap_) throw OverCap{};
  }

  Node node(int64_t& pos) {
    Depth depth(depth_);
    budget_.poll();
    const int32_t kind = at(pos++);
    Node out;
    switch (kind) {
      case 0: out = set(pos); break;
      case 1: case 2: out = sequence(pos, kind == 1); break;
      case 3: out = repetition(pos); break;
      case 4: out = automaton(pos); break;
      case 5: out = members(pos); break;
      case 6: out = comma_list(pos); break;
      default: throw std::invalid_argument("unknown AST node kind");
    }
    over_cap(out.states);
    return out;
  }

  // NfaBuilder: a start and an end state, and one state per distinct leading byte range from a state
  // (shared by the sequences that begin alike); an edge per such state and per sequence's last range
  Node set(int64_t& pos) {
    const int32_t count = count_at(pos, 2, "set");
    // the same sets recur all over a converted schema (a JSON string's characters, digits): their
    // facts are kept by their words, which stay in place for the walk
    const std::string_view words(reinterpret_cast<const char*>(ast_ + pos), 2 * sizeof(int32_t) * count);
    const auto known = sets_.find(words);
    if (known != sets_.end()) {
      pos += 2 * static_cast<int64_t>(count);
      return known->second;
    }
    Node out = new_set(pos, count);
    sets_.emplace(words, out);
    return out;
  }
  Node new_set(int64_t& pos, int32_t count) {
    Node out;
    out.states = 2;
    out.answers = false;
    std::map<std::tuple<int64_t, int, int>, int64_t> shared;  // (state, lo, hi) -> next, numbered here
    each_sequence(pos, count, [&](const std::vector<std::pair<int, int>>& seq) {
      int64_t cur = 0;
      for (size_t i = 0; i + 1 < seq.size(); ++i) {
        auto it = shared.find({cur, seq[i].first, seq[i].second});
        if (it == shared.end()) {
          it = shared.emplace(std::make_tuple(cur, seq[i].first, seq[i].second), out.states++).first;
          ++out.moves;
        }
        cur = it->second;
      }
      ++out.moves;
      if (out.answers && seq.size() >= out.answer.size()) return;
      std::string bytes;
      for (const auto& [blo, bhi] : seq) {
        const int b = usable_in(blo, bhi);
        if (b < 0) break;
        bytes.push_back(static_cast<char>(b));
      }
      if (bytes.size() == seq.size()) {
        out.answers = true;
        out.answer = std::move(bytes);
      }
    });
    return out;
  }

  // cat: a start state, an epsilon move into each child; alt: a start and an end, two moves a child
  Node sequence(int64_t& pos, bool cat) {
    const int32_t count = count_at(pos, 2, cat ? "cat" : "alt");
    Node out;
    out.states = cat ? 1 : 2;
    out.moves = cat ? count : 2 * static_cast<int64_t>(count);
    out.answers = cat;
    for (int32_t k = 0; k < count; ++k) {
      Node child = node(pos);
      out.states = add(out.states, child.states);
      out.moves = add(out.moves, child.moves);
      over_cap(out.states);  // before the answer grows: it is bounded by the states
      if (cat) {
        out.answers = out.answers && child.answers;
        if (out.answers) out.answer += child.answer;
      } else if (child.answers && (!out.answers || child.answer.size() < out.answer.size())) {
        out.answers = true;
        out.answer = std::move(child.answer);
      }
    }
    return out;
  }

  // lo copies, then either a loop over one more (a loop and an end state, four moves) or an end state
  // and hi - lo optional copies (two moves each); the child is not built when no copy is made
  Node repetition(int64_t& pos) {
    const auto [lo, hi] = bounds_at(pos, "repetition bounds");
    Node out;
    if (lo == 0 && hi == 0) {
      skip(pos);
      out.states = 2;
      out.moves = 1;
      return out;
    }
    const Node child = node(pos);
    const int64_t c = child.states, m = child.moves;
    if (hi < 0) {
      out.states = add(add(1, mul(lo, c)), add(c, 2));
      out.moves = add(mul(lo, m + 1), add(m, 4));
    } else {
      out.states = add(add(1, mul(lo, c)), add(1, mul(hi - lo, c)));
      out.moves = add(mul(lo, m + 1), add(1, mul(hi - lo, m + 2)));
    }
    over_cap(out.states);  // before the answer is repeated
    out.answers = lo == 0 || child.answers;
    if (lo > 0 && child.answers) {
      out.answer.reserve(child.answer.size() * lo);
      for (int32_t k = 0; k < lo; ++k) out.answer += child.answer;
    }
    return out;
  }

  // its states and an end state; an epsilon move from each accepting state to the end, its edges;
  // the shortest answer by a breadth-first search over its usable bytes
  Node automaton(int64_t& pos) {
    const auto [count, start] = dfa_size_at(pos);
    Node out;
    out.states = add(count, 1);
    over_cap(out.states);
    std::vector<uint8_t> accept(count);
    for (int32_t q = 0; q < count; ++q) {
      accept[q] = at(pos + q) != 0;
      out.moves += accept[q];
    }
    pos += count;
    std::vector<int64_t> off(static_cast<size_t>(count) + 1, 0);
    std::vector<std::array<int32_t, 3>> edges;
    for (int32_t q = 0; q < count; ++q) {
      budget_.poll();
      const int32_t ranges = count_at(pos, 3, "embedded DFA");
      for (int32_t k = 0; k < ranges; ++k) edges.push_back(dfa_edge_at(pos, count));
      off[q + 1] = static_cast<int64_t>(edges.size());
    }
    out.moves = add(out.moves, static_cast<int64_t>(edges.size()));
    std::vector<int32_t> from(count, -2);  // -2: not reached; the start: -1
    std::vector<uint8_t> by(count, 0);
    std::vector<int32_t> queue{start};
    from[start] = -1;
    int32_t found = accept[start] ? start : -1;
    for (size_t h = 0; h < queue.size() && found < 0; ++h) {
      const int32_t q = queue[h];
      for (int64_t k = off[q]; k < off[q + 1] && found < 0; ++k) {
        const auto [lo, hi, to] = edges[k];
        const int b = usable_in(lo, hi);
        if (b < 0 || from[to] != -2) continue;
        from[to] = q;
        by[to] = static_cast<uint8_t>(b);
        if (accept[to]) found = to;
        queue.push_back(to);
      }
    }
    out.answers = found >= 0;
    for (int32_t q = found; q >= 0 && from[q] >= 0; q = from[q]) out.answer.push_back(static_cast<char>(by[q]));
    std::reverse(out.answer.begin(), out.answer.end());
    return out;
  }

  // NfaBuilder::members: a start, an end and three states per member (before it, after a comma,
  // after it), and per member an entry and an after state; the answer is the required members in
  // order (or, when one is needed and none is required, the shortest optional one)
  Node members(int64_t& pos) {
    const auto [n, at_least_one] = members_at(pos);
    Node out;
    out.states = add(2, 3 * static_cast<int64_t>(n));
    over_cap(out.states);
    out.moves = at_least_one ? 0 : 1;
    bool required_any = false;
    std::string optional;
    bool optional_answers = false;
    for (int32_t i = 0; i < n; ++i) {
      const bool req = at(pos++) != 0;
      Node child = node(pos);
      const int64_t later = i + 1 < n ? 1 : 0;
      out.states = add(out.states, add(child.states, 2));
      out.moves = add(out.moves, add(child.moves, 5 + later + (req ? 0 : 2 + later)));
      over_cap(out.states);
      if (req) {
        if (required_any) out.answer.push_back(',');
        out.answers = out.answers && child.answers && (!required_any || comma_usable());
        required_any = true;
        if (out.answers) out.answer += child.answer;
      } else if (child.answers && (!optional_answers || child.answer.size() < optional.size())) {
        optional_answers = true;
        optional = std::move(child.answer);
      }
    }
    if (!required_any && at_least_one) {
      out.answers = optional_answers;
      out.answer = std::move(optional);
    }
    return out;
  }

  // NfaBuilder::comma_list: a start and an end, per copy its state after it; lo copies answer
  Node comma_list(int64_t& pos) {
    const auto [lo, hi] = bounds_at(pos, "list bounds");
    const int64_t copies = hi < 0 ? std::max(lo, 1) : hi;
    Node out;
    if (copies == 0) {
      skip(pos);
      out.states = 2;
      out.moves = 1;
      return out;
    }
    const Node child = node(pos);
    out.states = add(2, mul(copies, add(child.states, 1)));
    out.moves = add(add(lo == 0 ? 1 : 0, mul(copies, add(child.moves, 2))),
                    add(copies - std::max(lo - 1, 0), hi < 0 ? 1 : 0));
    over_cap(out.states);
    out.answers = lo == 0 || (child.answers && (lo == 1 || comma_usable()));
    if (lo > 0 && out.answers) {
      for (int32_t k = 0; k < lo; ++k) {
        if (k > 0) out.answer.push_back(',');
        out.answer += child.answer;
      }
    }
    return out;
  }

  int64_t cap_;
  int16_t first_[256];
  std::unordered_map<std::string_view, Node> sets_;
};

}  // namespace

TreeFacts tree_facts(const int32_t* ast, int64_t n, const uint8_t usable[256], int64_t cap, Budget& budget) {
  return FactsWalker(ast, n, usable, cap, budget).run();
}

}  // namespace llmserve
