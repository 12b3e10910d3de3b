// Byte-level DFA construction (see dfa.h). Sizes here are small (at most tens of thousands of states),
// so the aim is low constant cost: constraint compile time is dominated by this step and the first
// mask, and it runs on the request path when a new constraint arrives.

#include "dfa.h"

#include "ast_reader.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

namespace llmserve {

Budget::Budget(int64_t ms, int64_t max_bytes)
    : ms_(ms), max_bytes_(max_bytes), deadline_(std::chrono::steady_clock::now() + std::chrono::milliseconds(ms)) {}

void Budget::check_time() {
  if (ms_ > 0 && std::chrono::steady_clock::now() > deadline_)
    throw DfaError{"constraint compile time budget (" + std::to_string(ms_) + " ms) exceeded"};
}

void Budget::restart(int64_t ms) {
  ms_ = ms;
  deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  polls_ = 0;
}

void Budget::fail_memory() const {
  throw DfaError{"constraint compile memory budget (" + std::to_string(max_bytes_ >> 20) + " MiB) exceeded"};
}

namespace {

class Subsets {
 public:
  Subsets(const NfaView& nfa, Budget& budget, const uint8_t* live)
      : nfa_(nfa),
        budget_(budget),
        live_(live),
        closure1_(nfa.n),
        done1_(nfa.n, 0),
        mark_(nfa.n, 0),
        mark1_(nfa.n, 0) {}

  // Epsilon closure of qs[0 .. n), keeping only the states that matter for identity: those with
  // byte edges, and the final state, in no particular order. `hash` does not depend on the order
  // (a sum of mixed members), and until the next call marked(x) tells whether x is in the closure,
  // so a set can be compared with it without sorting either.
  void closure(const int32_t* qs, size_t n, std::vector<int32_t>& out, uint64_t& hash, bool& accepting) {
    ++gen_;
    out.clear();
    hash = 0;
    accepting = false;
    for (size_t i = 0; i < n; ++i) {
      budget_.poll();
      for (int32_t x : closure_of(qs[i])) {
        if (mark_[x] == gen_) continue;
        mark_[x] = gen_;
        out.push_back(x);
        hash += mix(static_cast<uint64_t>(x));
        accepting |= x == nfa_.final_state;
      }
    }
  }
  bool marked(int32_t x) const { return mark_[x] == gen_; }
  static uint64_t mix(uint64_t z) {  // splitmix64's finaliser
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  // the states reachable from q by epsilon moves (q included) that matter for identity (see
  // closure), cached per q
  const std::vector<int32_t>& closure_of(int32_t q) {
    if (done1_[q]) return closure1_[q];
    std::vector<int32_t>& c = closure1_[q];
    ++gen1_;
    todo_.assign(1, q);
    mark1_[q] = gen1_;
    if (keeps(q)) c.push_back(q);
    while (!todo_.empty()) {
      budget_.poll();
      int32_t x = todo_.back();
      todo_.pop_back();
      for (int64_t k = nfa_.eps_off[x]; k < nfa_.eps_off[x + 1]; ++k) {
        int32_t y = nfa_.eps[k];
        if (mark1_[y] != gen1_) {
          mark1_[y] = gen1_;
          if (keeps(y)) c.push_back(y);
          todo_.push_back(y);
        }
      }
    }
    done1_[q] = 1;
    // cached closures are the quadratic part of the construction's memory ((a?){n}: n closures of n)
    budget_.charge(static_cast<int64_t>(c.size() * sizeof(int32_t)));
    return c;
  }
  bool keeps(int32_t x) const {
    if (live_ != nullptr && !live_[x]) return false;
    return x == nfa_.final_state || nfa_.edge_off[x + 1] > nfa_.edge_off[x];
  }

  const NfaView& nfa_;
  Budget& budget_;
  const uint8_t* live_;  // null: every state
  std::vector<std::vector<int32_t>> closure1_;
  std::vector<uint8_t> done1_;
  std::vector<uint64_t> mark_, mark1_;
  std::vector<int32_t> todo_;
  uint64_t gen_ = 0, gen1_ = 0;
};

}  // namespace

void utf8_sequences(int32_t lo, int32_t hi, std::vector<std::vector<std::pair<int, int>>>& out) {
  auto encode = [](int32_t c, uint8_t* b) -> int {
    if (c < 0x80) { b[0] = static_cast<uint8_t>(c); return 1; }
    if (c < 0x800) { b[0] = 0xC0 | (c >> 6); b[1] = 0x80 | (c & 0x3F); return 2; }
    if (c < 0x10000) { b[0] = 0xE0 | (c >> 12); b[1] = 0x80 | ((c >> 6) & 0x3F); b[2] = 0x80 | (c & 0x3F); return 3; }
    b[0] = 0xF0 | (c >> 18); b[1] = 0x80 | ((c >> 12) & 0x3F); b[2] = 0x80 | ((c >> 6) & 0x3F); b[3] = 0x80 | (c & 0x3F);
    return 4;
  };
  std::vector<std::pair<int32_t, int32_t>> stack{{lo, hi}};
  while (!stack.empty()) {
    auto [a, b] = stack.back();
    stack.pop_back();
    if (a > b) continue;
    if (a <= 0xDFFF && b >= 0xD800) {  // surrogates are not characters
      stack.emplace_back(0xE000, b);
      stack.emplace_back(a, 0xD7FF);
      continue;
    }
    bool split = false;
    for (int32_t bound : {0x7F, 0x7FF, 0xFFFF})
      if (a <= bound && bound < b) {
        stack.emplace_back(bound + 1, b);
        stack.emplace_back(a, bound);
        split = true;
        break;
      }
    if (split) continue;
    if (b <= 0x7F) {
      out.push_back({{a, b}});
      continue;
    }
    uint8_t ea[4], eb[4];
    const int n = encode(a, ea);
    for (int i = 1; i < n && !split; ++i) {
      const int32_t m = (1 << (6 * i)) - 1;
      if ((a & ~m) != (b & ~m)) {
        if (a & m) {
          stack.emplace_back((a | m) + 1, b);
          stack.emplace_back(a, a | m);
          split = true;
        } else if ((b & m) != m) {
          stack.emplace_back(b & ~m, b);
          stack.emplace_back(a, (b & ~m) - 1);
          split = true;
        }
      }
    }
    if (split) continue;
    encode(b, eb);
    std::vector<std::pair<int, int>> seq;
    for (int i = 0; i < n; ++i) seq.emplace_back(ea[i], eb[i]);
    out.push_back(std::move(seq));
  }
}

namespace {

class NfaBuilder : AstReader {
 public:
  NfaBuilder(const int32_t* ast, int64_t n, int64_t limit, Budget& budget) : AstReader(ast, n, budget), limit_(limit) {}

  Nfa build() {
    int64_t pos = 0;
    auto [s, e] = node(pos);
    if (pos != n_) throw std::invalid_argument("trailing data after the AST");
    nfa_.start = s;
    nfa_.final_state = e;
    return std::move(nfa_);
  }

 private:
  int32_t state() {
    if (nfa_.states >= limit_)
      throw DfaError{"constraint too large: more than " + std::to_string(limit_) + " automaton states"};
    budget_.poll();
    budget_.charge(64);  // a state and its first few moves
    return static_cast<int32_t>(nfa_.states++);
  }
  void eps(int32_t from, int32_t to) { nfa_.eps_list.emplace_back(from, to); }
  void edge(int32_t from, int lo, int hi, int32_t to) {
    nfa_.edge_list.push_back({from, lo, hi, to});
  }
  // the subtree at `pos` (advanced past it) may be built several times (counted repetition)
  std::pair<int32_t, int32_t> node(int64_t& pos) {
    Depth depth(depth_);
    const int32_t kind = at(pos++);
    if (kind == 0) {  // set
      const int32_t count = count_at(pos, 2, "set");
      // the same sets recur all over a converted schema (a JSON string's characters, digits): each
      // is built once, by its words (which stay in place for the build), then copied
      const std::string_view words(reinterpret_cast<const char*>(ast_ + pos), 2 * sizeof(int32_t) * count);
      const auto known = sets_.find(words);
      if (known != sets_.end()) {
        pos += 2 * static_cast<int64_t>(count);
        return copy(known->second);
      }
      Fragment f = started();
      f.ends = set(pos, count);
      finish(f);
      sets_.emplace(words, f);
      return f.ends;
    }
    if (kind == 1) {  // cat
      const int32_t count = count_at(pos, 2, "cat");  // a node takes 2 words at least
      const int32_t s = state();
      int32_t e = s;
      for (int32_t k = 0; k < count; ++k) {
        auto [cs, ce] = node(pos);
        eps(e, cs);
        e = ce;
      }
      return {s, e};
    }
    if (kind == 2) {  // alt
      const int32_t count = count_at(pos, 2, "alt");
      const int32_t s = state(), e = state();
      for (int32_t k = 0; k < count; ++k) {
        auto [cs, ce] = node(pos);
        eps(s, cs);
        eps(ce, e);
      }
      return {s, e};
    }
    if (kind == 3) {  // rep
      // each copy of the child takes one state at least: the copies are bounded by the state limit
      const auto [lo, hi] = bounds_at(pos, "repetition bounds");
      const int64_t child = pos;
      std::optional<Fragment> built;
      auto again = [&]() { return build_or_copy(child, built, pos); };
      const int32_t s = state();
      int32_t e = s;
      for (int32_t k = 0; k < lo; ++k) {
        auto [cs, ce] = again();
        eps(e, cs);
        e = ce;
      }
      if (hi < 0) {
        auto [cs, ce] = again();
        const int32_t loop = state();
        eps(e, loop);
        eps(loop, cs);
        eps(ce, loop);
        const int32_t end = state();
        eps(loop, end);
        return {s, end};
      }
      const int32_t end = state();
      eps(e, end);
      for (int32_t k = 0; k < hi - lo; ++k) {
        auto [cs, ce] = again();
        eps(e, cs);
        eps(ce, end);
        e = ce;
      }
      if (lo == 0 && hi == 0) skip(pos);  // the child was never built: step over it
      return {s, end};
    }
    if (kind == 4) {  // an automaton over bytes, embedded as it is (an intersection built in Python)
      const auto [count, start] = dfa_size_at(pos);
      // grown state by state, so that a large count stops at the state limit, not after allocating
      std::vector<int32_t> ids;
      ids.reserve(static_cast<size_t>(std::min<int64_t>(count, limit_ - nfa_.states)));
      for (int32_t q = 0; q < count; ++q) ids.push_back(state());
      const int32_t e = state();
      for (int32_t q = 0; q < count; ++q)
        if (at(pos + q)) eps(ids[q], e);
      pos += count;
      for (int32_t q = 0; q < count; ++q) {
        budget_.poll();
        const int32_t ranges = count_at(pos, 3, "embedded DFA");
        for (int32_t k = 0; k < ranges; ++k) {
          const auto [lo, hi, to] = dfa_edge_at(pos, count);
          edge(ids[q], lo, hi, ids[to]);
        }
      }
      return {ids[start], e};
    }
    if (kind == 5) return members(pos);
    if (kind == 6) return comma_list(pos);
    throw std::invalid_argument("unknown AST node kind");
  }
  // What building one subtree made: its states [first, first + states), its epsilon moves and byte
  // edges (ranges of the builder's lists, all between its own states), its start and end, and the
  // position after it in the AST.
  struct Fragment {
    int32_t first = 0, states = 0;
    size_t eps_at = 0, eps_n = 0, edges_at = 0, edges_n = 0;
    std::pair<int32_t, int32_t> ends;
    int64_t end = 0;
  };
  // A set's ranges as UTF-8 byte-range sequences from one start to one end state, sharing common
  // leading ranges.
  std::pair<int32_t, int32_t> set(int64_t& pos, int32_t count) {
    const int32_t s = state(), e = state();
    std::map<std::tuple<int32_t, int, int>, int32_t> shared;  // (state, lo, hi) -> next: common leading ranges
    each_sequence(pos, count, [&](const std::vector<std::pair<int, int>>& seq) {
      int32_t cur = s;
      for (size_t i = 0; i < seq.size(); ++i) {
        if (i + 1 == seq.size()) {
          edge(cur, seq[i].first, seq[i].second, e);
        } else {
          auto key = std::make_tuple(cur, seq[i].first, seq[i].second);
          auto it = shared.find(key);
          if (it == shared.end()) {
            const int32_t nxt = state();
            it = shared.emplace(key, nxt).first;
            edge(cur, seq[i].first, seq[i].second, nxt);
          }
          cur = it->second;
        }
      }
    });
    return {s, e};
  }
  // The subtree at `child` built (the first time, recorded in `built`) or copied from what the first
  // build made, its states renumbered: a repetition's copies (a string's characters up to maxLength,
  // thousands of them) are not parsed and split into UTF-8 sequences again for each. The same NFA,
  // state for state, as building each copy would give. `pos` is set past the subtree.
  std::pair<int32_t, int32_t> build_or_copy(int64_t child, std::optional<Fragment>& built, int64_t& pos) {
    if (!built) {
      Fragment f = started();
      int64_t p = child;
      f.ends = node(p);
      f.end = pos = p;
      finish(f);
      built = f;
      return f.ends;
    }
    pos = built->end;
    return copy(*built);
  }
  // A fragment begun where the lists end now, and its counts once its build is done: what it made
  // is then the lists' last entries, which copy() appends again
  Fragment started() const {
    Fragment f;
    f.first = static_cast<int32_t>(nfa_.states);
    f.eps_at = nfa_.eps_list.size();
    f.edges_at = nfa_.edge_list.size();
    return f;
  }
  void finish(Fragment& f) const {
    f.states = static_cast<int32_t>(nfa_.states - f.first);
    f.eps_n = nfa_.eps_list.size() - f.eps_at;
    f.edges_n = nfa_.edge_list.size() - f.edges_at;
  }
  std::pair<int32_t, int32_t> copy(const Fragment& f) {
    const int32_t first = static_cast<int32_t>(nfa_.states);
    for (int32_t q = 0; q < f.states; ++q) state();  // each counted, charged and timed as when built
    const int32_t shift = first - f.first;
    auto& eps_list = nfa_.eps_list;
    for (size_t k = f.eps_at; k < f.eps_at + f.eps_n; ++k) {
      const auto [from, to] = eps_list[k];
      eps_list.emplace_back(from + shift, to + shift);
    }
    auto& edge_list = nfa_.edge_list;
    for (size_t k = f.edges_at; k < f.edges_at + f.edges_n; ++k) {
      const auto e = edge_list[k];
      edge_list.push_back({e[0] + shift, e[1], e[2], e[3] + shift});
    }
    return {f.ends.first + shift, f.ends.second + shift};
  }
  // JSON object members, each built once (see regex.py, _NFA.members, which this mirrors state for
  // state): a[i] no member before i, p[i] after a comma (member i or a later one), after member i
  // one state that takes the comma or ends, so the subset after a member holds one state, not one
  // per later optional member.
  std::pair<int32_t, int32_t> members(int64_t& pos) {
    const auto [n, at_least_one] = members_at(pos);
    const int32_t s = state(), end = state();
    std::vector<int32_t> a{s}, p, e;
    for (int32_t i = 0; i < n; ++i) a.push_back(state());
    for (int32_t i = 0; i < n; ++i) p.push_back(state());
    for (int32_t i = 0; i < n; ++i) e.push_back(state());
    e.push_back(end);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t req = at(pos++);
      auto [cs, ce] = node(pos);
      const int32_t entry = state();
      eps(entry, cs);
      eps(a[i], entry);
      eps(p[i], entry);
      const int32_t after = state();
      eps(ce, after);
      if (i + 1 < n) edge(after, 0x2C, 0x2C, p[i + 1]);
      eps(after, e[i + 1]);
      if (!req) {
        eps(a[i], a[i + 1]);
        if (i + 1 < n) eps(p[i], p[i + 1]);
        eps(e[i], e[i + 1]);
      }
    }
    if (!at_least_one) eps(a[n], end);
    return {s, end};
  }
  // child lo..hi times, comma-separated; unbounded: max(lo, 1) copies, the last looping back
  std::pair<int32_t, int32_t> comma_list(int64_t& pos) {
    const auto [lo, hi] = bounds_at(pos, "list bounds");  // copies bounded by the state limit, as a repetition's
    const int64_t child = pos;
    const int32_t s = state(), end = state();
    if (lo == 0) eps(s, end);
    const int32_t copies = hi < 0 ? std::max(lo, 1) : hi;
    int32_t cur = s;
    std::optional<Fragment> built;
    for (int32_t k = 0; k < copies; ++k) {
      auto [cs, ce] = build_or_copy(child, built, pos);
      if (k == 0) eps(cur, cs);
      else edge(cur, 0x2C, 0x2C, cs);
      cur = state();
      eps(ce, cur);
      if (k + 1 >= lo) eps(cur, end);
      if (hi < 0 && k + 1 == copies) edge(cur, 0x2C, 0x2C, cs);
    }
    if (copies == 0) skip(pos);
    return {s, end};
  }

  int64_t limit_;
  Nfa nfa_;
  std::unordered_map<std::string_view, Fragment> sets_;
};

}  // namespace

NfaView Nfa::view() {
  // compressed rows by a stable counting sort on the source state: each state's moves keep the
  // order in which they were added
  const int64_t n = states;
  eps_off.assign(n + 1, 0);
  edge_off.assign(n + 1, 0);
  for (const auto& [from, to] : eps_list) ++eps_off[from + 1];
  for (const auto& e : edge_list) ++edge_off[e[0] + 1];
  for (int64_t q = 0; q < n; ++q) {
    eps_off[q + 1] += eps_off[q];
    edge_off[q + 1] += edge_off[q];
  }
  eps_flat.resize(eps_list.size());
  edges_flat.resize(3 * edge_list.size());
  {
    std::vector<int64_t> fill(eps_off.begin(), eps_off.end() - 1);
    for (const auto& [from, to] : eps_list) eps_flat[fill[from]++] = to;
    fill.assign(edge_off.begin(), edge_off.end() - 1);
    for (const auto& e : edge_list) {
      int32_t* f = edges_flat.data() + 3 * fill[e[0]]++;
      f[0] = e[1];
      f[1] = e[2];
      f[2] = e[3];
    }
  }
  std::vector<std::pair<int32_t, int32_t>>().swap(eps_list);
  std::vector<std::array<int32_t, 4>>().swap(edge_list);
  NfaView v;
  v.n = n;
  v.eps_off = eps_off.data();
  v.eps = eps_flat.data();
  v.edge_off = edge_off.data();
  v.edges = edges_flat.data();
  v.start = start;
  v.final_state = final_state;
  return v;
}

Nfa build_nfa(const int32_t* ast, int64_t n, int64_t max_nfa_states, Budget& budget) {
  return NfaBuilder(ast, n, max_nfa_states, budget).build();
}

void Dfa::expand(int32_t* out) const {
  const int64_t n = states();
  for (int64_t s = 0; s < n; ++s) {
    const int32_t* row = table.data() + s * letters;
    int32_t* o = out + s * 256;
    for (int b = 0; b < 256; ++b) o[b] = row[letter_of[b]];
  }
}

struct SubsetConstruction::Impl {
  Impl(const NfaView& nfa, int64_t max_states, Budget& budget, const uint8_t* live)
      : nfa(nfa), max_states(max_states), budget(budget), sub(nfa, budget, live), count(1) {
    // byte classes: the intervals between the bounds of the NFA's edges, numbered in byte order
    uint8_t cut[257] = {};
    const int64_t edges = nfa.edge_off[nfa.n];
    for (int64_t k = 0; k < edges; ++k) {
      cut[nfa.edges[3 * k]] = 1;
      cut[nfa.edges[3 * k + 1] + 1] = 1;
    }
    int c = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[b]) ++c;
      out.letter_of[b] = static_cast<uint8_t>(c);
    }
    out.letters = c + 1;
    count.assign(out.letters + 2, 0);
    uint64_t h;
    bool acc;
    sub.closure(&nfa.start, 1, nxt, h, acc);
    if (!nxt.empty()) find_or_add(h, acc);
  }

  // the id of the subset in `nxt` (the last closure), added if new
  int32_t find_or_add(uint64_t h, bool accepting) {
    uint64_t i = h & hmask;
    for (;; i = (i + 1) & hmask) {
      const int32_t id = slots[i];
      if (id < 0) break;
      if (hashes[id] != h || off[id + 1] - off[id] != static_cast<int64_t>(nxt.size())) continue;
      bool same = true;
      for (int64_t k = off[id]; k < off[id + 1] && same; ++k) same = sub.marked(pool[k]);
      if (same) return id;
    }
    const int64_t found = static_cast<int64_t>(hashes.size());
    if (found >= max_states)
      throw DfaError{"constraint too large: more than " + std::to_string(max_states) + " automaton states"};
    const int32_t id = static_cast<int32_t>(found);
    slots[i] = id;
    hashes.push_back(h);
    pool.insert(pool.end(), nxt.begin(), nxt.end());
    off.push_back(static_cast<int64_t>(pool.size()));
    out.accept.push_back(accepting ? 1 : 0);
    out.table.resize(out.table.size() + out.letters, -1);
    if (static_cast<uint64_t>(hashes.size()) * 2 > slots.size()) {  // grow: at most half full
      slots.assign(slots.size() * 2, -1);
      hmask = slots.size() - 1;
      for (int32_t j = 0; j <= id; ++j) {
        uint64_t p = hashes[j] & hmask;
        while (slots[p] >= 0) p = (p + 1) & hmask;
        slots[p] = j;
      }
    }
    return id;
  }

  void expand(int32_t i) {
    const int64_t L = out.letters;
    const uint8_t* cls = out.letter_of;
    cur.assign(pool.begin() + off[i], pool.begin() + off[i + 1]);  // copy: `pool` grows below
    events.clear();
    for (int32_t q : cur)
      for (int64_t k = nfa.edge_off[q]; k < nfa.edge_off[q + 1]; ++k) {
        const int32_t t = nfa.edges[3 * k + 2];
        events.push_back({cls[nfa.edges[3 * k]], t, 1});
        events.push_back({cls[nfa.edges[3 * k + 1]] + 1, t, 0});
      }
    if (events.empty()) return;
    budget.charge(L * static_cast<int64_t>(sizeof(int32_t)) + static_cast<int64_t>(cur.size() * sizeof(int32_t)));
    // sorted by class: where there are more events than classes, by counting
    if (static_cast<int64_t>(events.size()) > L) {
      std::fill(count.begin(), count.end(), 0);
      for (const Event& ev : events) ++count[ev.pos + 1];
      for (int64_t c = 0; c <= L; ++c) count[c + 1] += count[c];
      sorted.resize(events.size());
      for (const Event& ev : events) sorted[count[ev.pos]++] = ev;
      events.swap(sorted);
    } else {
      std::sort(events.begin(), events.end(), [](const Event& x, const Event& y) { return x.pos < y.pos; });
    }
    active.clear();
    for (size_t e = 0; e < events.size();) {
      budget.poll();
      const int32_t a = events[e].pos;
      for (; e < events.size() && events[e].pos == a; ++e) {
        if (events[e].enters) {
          active.push_back(events[e].target);
        } else {
          auto it = std::find(active.begin(), active.end(), events[e].target);
          *it = active.back();
          active.pop_back();
        }
      }
      if (active.empty() || e == events.size()) continue;
      const int32_t b = events[e].pos;
      uint64_t h;
      bool acc;
      sub.closure(active.data(), active.size(), nxt, h, acc);
      if (nxt.empty()) continue;  // every target is outside `live`: dead
      const int32_t j = find_or_add(h, acc);
      int32_t* row = out.table.data() + i * L;  // after find_or_add: the table may have grown
      for (int32_t x = a; x < b; ++x) row[x] = j;
    }
  }

  // per state, a sweep over its edges' class bounds: (class, target, +1 enters / 0 leaves)
  struct Event {
    int32_t pos, target, enters;
  };
  const NfaView& nfa;
  const int64_t max_states;
  Budget& budget;
  Subsets sub;
  Dfa out;
  // the subsets found so far, flat: subset i is pool[off[i] .. off[i + 1]), hashed in an
  // open-addressing table of ids (-1 empty)
  std::vector<int32_t> pool, cur, nxt, active;
  std::vector<int64_t> off{0};
  std::vector<uint64_t> hashes;
  std::vector<int32_t> slots = std::vector<int32_t>(1024, -1);
  uint64_t hmask = 1023;
  std::vector<Event> events, sorted;
  std::vector<int32_t> count;
};

SubsetConstruction::SubsetConstruction(const NfaView& nfa, int64_t max_states, Budget& budget, const uint8_t* live)
    : impl_(std::make_unique<Impl>(nfa, max_states, budget, live)) {}
SubsetConstruction::~SubsetConstruction() = default;
const Dfa& SubsetConstruction::dfa() const { return impl_->out; }
Dfa SubsetConstruction::take() { return std::move(impl_->out); }
int64_t SubsetConstruction::found() const { return static_cast<int64_t>(impl_->hashes.size()); }
void SubsetConstruction::expand(int32_t i) { impl_->expand(i); }
std::pair<const int32_t*, const int32_t*> SubsetConstruction::members(int32_t i) const {
  const int32_t* pool = impl_->pool.data();
  return {pool + impl_->off[i], pool + impl_->off[i + 1]};
}

Dfa determinize(const NfaView& nfa, int64_t max_states, Budget& budget) {
  SubsetConstruction sc(nfa, max_states, budget);
  for (int64_t i = 0; i < sc.found(); ++i) sc.expand(static_cast<int32_t>(i));
  return sc.take();
}

Dfa minimize(const Dfa& raw, Budget& budget) {
  // Hopcroft's partition refinement on the completed automaton: a sink state `n` takes every
  // missing transition. States that cannot reach acceptance end up in the sink's block, which
  // both trims and minimises; blocks are then numbered canonically.
  const int64_t n = raw.states(), N = n + 1, sink = n, C = raw.letters;
  const int32_t* table = raw.table.data();
  const uint8_t* accept = raw.accept.data();
  // A smaller alphabet: the input's letters whose columns agree in every row.
  std::vector<int32_t> letter_of_class(C), first_class;
  {
    std::vector<uint64_t> h(C, 1469598103934665603ull);
    for (int64_t s = 0; s < n; ++s) {
      const int32_t* row = table + s * C;
      for (int64_t c = 0; c < C; ++c) h[c] = (h[c] ^ static_cast<uint32_t>(row[c])) * 1099511628211ull;
    }
    // classes with equal hashes are taken to agree, then checked in one pass over the rows; if
    // any pair differs after all (a collision), every class stays a letter of its own
    for (int64_t c = 0; c < C; ++c) {
      int32_t found = -1;
      for (size_t l = 0; l < first_class.size() && found < 0; ++l)
        if (h[first_class[l]] == h[c]) found = static_cast<int32_t>(l);
      if (found < 0) {
        found = static_cast<int32_t>(first_class.size());
        first_class.push_back(static_cast<int32_t>(c));
      }
      letter_of_class[c] = found;
    }
    std::vector<int32_t> rc(C);  // the first class of each class's letter
    for (int64_t c = 0; c < C; ++c) rc[c] = first_class[letter_of_class[c]];
    bool agree = true;
    for (int64_t s = 0; s < n && agree; ++s) {
      const int32_t* row = table + s * C;
      for (int64_t c = 0; c < C; ++c) agree &= row[c] == row[rc[c]];
    }
    if (!agree) {
      first_class.resize(C);
      for (int64_t c = 0; c < C; ++c) first_class[c] = letter_of_class[c] = static_cast<int32_t>(c);
    }
  }
  const int64_t L = static_cast<int64_t>(first_class.size());
  // the transition of s (< n) on letter l, the sink for a missing one
  auto next = [&](int64_t s, int64_t l) -> int32_t {
    const int32_t d = table[s * C + first_class[l]];
    return d < 0 ? static_cast<int32_t>(sink) : d;
  };
  // inverse transitions in compressed rows, per target: the transitions into d are
  // (inv_s[k], inv_l[k]) for k in [inv_off[d], inv_off[d + 1]), sources and letters. One row per
  // state, not per (letter, state), keeps this small enough to stay in cache (most states are
  // entered on one or two letters). Those into the sink are left out: the sink's block is never a
  // splitter (below), so they are never read; the sink's own transitions (to itself) likewise.
  // `enters`: the letters on which some transition enters each state.
  std::vector<int64_t> inv_off(N + 1, 0);
  std::vector<std::bitset<256>> enters(N);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t l = 0; l < L; ++l) {
      const int32_t d = next(s, l);
      if (d != sink) {
        enters[d].set(l);
        ++inv_off[d + 1];
      }
    }
  for (int64_t l = 0; l < L; ++l) enters[sink].set(l);  // the sink's own transitions, on every letter
  for (int64_t d = 0; d < N; ++d) inv_off[d + 1] += inv_off[d];
  std::vector<int32_t> inv_s(static_cast<size_t>(inv_off[N]));
  std::vector<uint8_t> inv_l(static_cast<size_t>(inv_off[N]));
  {
    std::vector<int64_t> fill(inv_off.begin(), inv_off.end() - 1);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t l = 0; l < L; ++l) {
        const int32_t d = next(s, l);
        if (d != sink) {
          inv_s[fill[d]] = static_cast<int32_t>(s);
          inv_l[fill[d]++] = static_cast<uint8_t>(l);
        }
      }
    // Each row sorted by letter (sources increasing within one), so that a splitter reads only
    // its letter's stretch: a state of a string's body is entered on dozens of letters and met
    // once per letter, and scanning its whole row each time was most of this minimisation's reads
    // (17.6M for 0.7M used, at 57k states). Rows are filled in source order, so sorting a short
    // one by insertion (most hold one or two) keeps sources increasing; a long one is sorted whole.
    std::vector<std::pair<uint8_t, int32_t>> long_row;
    for (int64_t d = 0; d < n; ++d) {
      const int64_t lo = inv_off[d], hi = inv_off[d + 1];
      if (hi - lo > 32) {
        long_row.clear();
        for (int64_t i = lo; i < hi; ++i) long_row.emplace_back(inv_l[i], inv_s[i]);
        std::sort(long_row.begin(), long_row.end());
        for (int64_t i = lo; i < hi; ++i) std::tie(inv_l[i], inv_s[i]) = long_row[i - lo];
        continue;
      }
      for (int64_t i = lo + 1; i < hi; ++i) {
        const uint8_t li = inv_l[i];
        const int32_t si = inv_s[i];
        int64_t j = i;
        for (; j > lo && inv_l[j - 1] > li; --j) {
          inv_l[j] = inv_l[j - 1];
          inv_s[j] = inv_s[j - 1];
        }
        inv_l[j] = li;
        inv_s[j] = si;
      }
    }
  }
  // partition: elems holds the states block by block; block b is elems[first[b] .. last[b])
  std::vector<int32_t> elems(N), loc(N), block(N), first, last, marked;
  {
    int64_t k = 0;
    for (int pass = 1; pass >= 0; --pass) {  // accepting states first, then the rest (with the sink)
      int64_t b0 = k;
      for (int64_t s = 0; s < N; ++s)
        if ((s < n && accept[s] ? 1 : 0) == pass) {
          elems[k] = static_cast<int32_t>(s);
          loc[s] = static_cast<int32_t>(k++);
        }
      if (k > b0) {
        for (int64_t i = b0; i < k; ++i) block[elems[i]] = static_cast<int32_t>(first.size());
        first.push_back(static_cast<int32_t>(b0));
        last.push_back(static_cast<int32_t>(k));
        marked.push_back(0);
      }
    }
  }
  std::vector<uint8_t> in_work;  // [block * L + letter]
  std::vector<int32_t> queued;  // [block]: how many of its letters are in the work list
  std::vector<std::pair<int32_t, int32_t>> work;
  auto push = [&](int32_t b, int64_t l) {
    if (static_cast<int64_t>(in_work.size()) < (b + 1) * L) in_work.resize((b + 1) * L, 0);
    if (static_cast<int64_t>(queued.size()) <= b) queued.resize(b + 1, 0);
    if (!in_work[b * L + l]) {
      in_work[b * L + l] = 1;
      ++queued[b];
      work.emplace_back(b, static_cast<int32_t>(l));
    }
  };
  // letters on which some transition enters each state: a block that nothing enters on a letter
  // cannot split anything on it, so it is never queued for that letter (most blocks of a
  // constraint automaton are entered on one or two letters out of dozens)
  auto block_enters = [&](int32_t b) {
    std::bitset<256> in;
    for (int32_t i = first[b]; i < last[b]; ++i) in |= enters[elems[i]];
    return in;
  };
  // The block that holds the sink is never a splitter: every missing transition enters the sink,
  // so its predecessor lists cover most states on most letters and scanning them made this
  // minimisation quadratic in practice (seconds at 50k states). Hopcroft's argument allows it:
  // initially one of the two blocks suffices (the other is the whole minus it), and after a split
  // of a block not queued, either half does (the other is the parent minus it). Where neither half
  // holds the sink, the smaller one is queued, as usual.
  for (int32_t b = 0; b < static_cast<int32_t>(first.size()); ++b) {
    if (b == block[sink]) continue;
    const auto in = block_enters(b);
    for (int64_t l = 0; l < L; ++l)
      if (in[l]) push(b, l);
  }
  std::vector<int32_t> splitter, touched;
  while (!work.empty()) {
    budget.poll();
    auto [a, l] = work.back();
    work.pop_back();
    in_work[a * L + l] = 0;
    --queued[a];
    splitter.assign(elems.begin() + first[a], elems.begin() + last[a]);
    touched.clear();
    const uint8_t letter = static_cast<uint8_t>(l);
    const uint8_t* letters_in = inv_l.data();
    for (int32_t d : splitter) {
      budget.poll();
      int64_t k = inv_off[d];
      const int64_t end = inv_off[d + 1];
      if (end - k > 16)
        k = std::lower_bound(letters_in + k, letters_in + end, letter) - letters_in;
      else
        while (k < end && letters_in[k] < letter) ++k;
      for (; k < end && letters_in[k] == letter; ++k) {
        const int32_t s = inv_s[k];
        const int32_t b = block[s];
        const int32_t pos = first[b] + marked[b];
        if (loc[s] < pos) continue;  // already marked
        if (marked[b] == 0) touched.push_back(b);
        // move s to the marked front of its block
        const int32_t other = elems[pos];
        elems[loc[s]] = other;
        loc[other] = loc[s];
        elems[pos] = s;
        loc[s] = pos;
        ++marked[b];
      }
    }
    for (int32_t b : touched) {
      const int32_t m = marked[b];
      marked[b] = 0;
      if (m == last[b] - first[b]) continue;  // every state of b moves alike: no split
      // the marked front becomes a new block
      const int32_t nb = static_cast<int32_t>(first.size());
      first.push_back(first[b]);
      last.push_back(first[b] + m);
      marked.push_back(0);
      first[b] += m;
      for (int32_t i = first[nb]; i < last[nb]; ++i) block[elems[i]] = nb;
      const bool new_smaller = block[sink] == b   ? true  // queue nb: the half without the sink, else the smaller
                               : block[sink] == nb ? false
                                                   : (last[nb] - first[nb]) <= (last[b] - first[b]);
      // only the smaller side's letters are needed, except where b was queued already
      const bool b_queued = static_cast<int64_t>(queued.size()) > b && queued[b] > 0;
      const auto in_new = (new_smaller || b_queued) ? block_enters(nb) : std::bitset<256>();
      const auto in_small = new_smaller ? in_new : block_enters(b);
      for (int64_t ll = 0; ll < L; ++ll) {
        if (static_cast<int64_t>(in_work.size()) > b * L + ll && in_work[b * L + ll]) {
          if (in_new[ll]) push(nb, ll);
        } else if (in_small[ll]) {
          push(new_smaller ? nb : b, ll);
        }
      }
    }
  }
  if (n == 0 || block[0] == block[sink]) throw DfaError{"the constraint matches no string at all"};

  // canonical numbering: breadth-first from the start state's block, bytes in increasing order
  const int64_t nblocks = static_cast<int64_t>(first.size());
  std::vector<int32_t> rep(nblocks);
  for (int64_t b = 0; b < nblocks; ++b) rep[b] = elems[first[b]];
  const int32_t dead = block[sink];
  std::vector<int32_t> number(nblocks, -1), queue{block[0]};
  number[block[0]] = 0;
  // The input's letters are byte intervals in increasing order, so walking them walks the bytes;
  // and the first class of each output letter comes before its others (first_class increases),
  // so walking the output letters in order discovers the targets in the same order. One pass
  // numbers the blocks and writes the rows.
  Dfa out;
  out.letters = static_cast<int32_t>(L);
  for (int b = 0; b < 256; ++b) out.letter_of[b] = static_cast<uint8_t>(letter_of_class[raw.letter_of[b]]);
  out.table.reserve(nblocks * L);
  out.accept.reserve(nblocks);
  for (size_t qi = 0; qi < queue.size(); ++qi) {
    const int32_t* row = table + static_cast<int64_t>(rep[queue[qi]]) * C;
    out.table.resize(out.table.size() + L);
    int32_t* o = out.table.data() + qi * L;
    for (int64_t l = 0; l < L; ++l) {
      const int32_t d = row[first_class[l]];
      const int32_t t = d < 0 ? dead : block[d];
      if (t == dead) {
        o[l] = -1;
        continue;
      }
      if (number[t] < 0) {
        number[t] = static_cast<int32_t>(queue.size());
        queue.push_back(t);
      }
      o[l] = number[t];
    }
    out.accept.push_back(accept[rep[queue[qi]]]);
  }
  return out;
}

Dfa intersect(const std::vector<ByteTableView>& inputs, int64_t max_product_states, Budget& budget) {
  const size_t k = inputs.size();
  // letters: the byte intervals between the places where some input's row changes
  std::bitset<256> cut;
  cut.set(0);
  for (const auto& in : inputs)
    for (int64_t s = 0; s < in.states; ++s) {
      budget.poll();
      const int32_t* row = in.table + s * 256;
      for (int b = 1; b < 256; ++b)
        if (row[b] != row[b - 1]) cut.set(b);
    }
  Dfa raw;
  std::vector<int> first_byte;
  for (int b = 0; b < 256; ++b) {
    if (cut[b]) first_byte.push_back(b);
    raw.letter_of[b] = static_cast<uint8_t>(first_byte.size() - 1);
  }
  const int64_t L = static_cast<int64_t>(first_byte.size());
  raw.letters = static_cast<int32_t>(L);
  // product states: their tuples (k states each), found by hash; numbered as the search meets them
  std::vector<int32_t> tuples, chain;
  std::unordered_map<uint64_t, int32_t> head;
  const int64_t per_state = static_cast<int64_t>(k * sizeof(int32_t) + L * sizeof(int32_t) + 2 * sizeof(int32_t) + 24);
  auto find_or_add = [&](const int32_t* q) -> int32_t {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < k; ++i) h = (h ^ static_cast<uint32_t>(q[i])) * 1099511628211ull;
    auto it = head.try_emplace(h, -1).first;
    for (int32_t id = it->second; id >= 0; id = chain[id])
      if (std::equal(q, q + k, tuples.data() + static_cast<int64_t>(id) * k)) return id;
    const auto id = static_cast<int32_t>(chain.size());
    if (id >= max_product_states)
      throw DfaError{"constraint too large: more than " + std::to_string(max_product_states) + " automaton states"};
    budget.charge(per_state);
    tuples.insert(tuples.end(), q, q + k);
    chain.push_back(it->second);
    it->second = id;
    return id;
  };
  std::vector<int32_t> at(k), next(k);
  for (size_t i = 0; i < k; ++i) at[i] = inputs[i].start;
  find_or_add(at.data());
  for (int64_t s = 0; s < static_cast<int64_t>(chain.size()); ++s) {
    budget.poll();
    std::copy(tuples.begin() + s * k, tuples.begin() + (s + 1) * k, at.begin());
    bool accepts = true;
    for (size_t i = 0; i < k; ++i) accepts &= inputs[i].accept[at[i]] != 0;
    raw.accept.push_back(accepts ? 1 : 0);
    raw.table.resize(static_cast<size_t>((s + 1) * L), -1);
    for (int64_t l = 0; l < L; ++l) {
      bool live = true;
      for (size_t i = 0; i < k && live; ++i) {
        next[i] = inputs[i].table[static_cast<int64_t>(at[i]) * 256 + first_byte[l]];
        live = next[i] >= 0;
      }
      if (live) {
        const int32_t target = find_or_add(next.data());
        raw.table[s * L + l] = target;
      }
    }
  }
  budget.check_time();
  return minimize(raw, budget);
}

}  // namespace llmserve
