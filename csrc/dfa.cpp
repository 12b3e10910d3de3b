// Byte-level DFA construction (see dfa.h). Sizes here are small (at most tens of thousands of states),
// so the aim is low constant cost: constraint compile time is dominated by this step and the first
// mask, and it runs on the request path when a new constraint arrives.

#include "dfa.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <stdexcept>
#include <tuple>
#include <string>
#include <unordered_map>

namespace llmserve {

Budget::Budget(int64_t ms, int64_t max_bytes)
    : ms_(ms), max_bytes_(max_bytes), deadline_(std::chrono::steady_clock::now() + std::chrono::milliseconds(ms)) {}

void Budget::check_time() {
  if (ms_ > 0 && std::chrono::steady_clock::now() > deadline_)
    throw DfaError{"constraint compile time budget (" + std::to_string(ms_) + " ms) exceeded"};
}

void Budget::fail_memory() const {
  throw DfaError{"constraint compile memory budget (" + std::to_string(max_bytes_ >> 20) + " MiB) exceeded"};
}

namespace {

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) {
      h ^= static_cast<uint32_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

class Subsets {
 public:
  Subsets(const NfaView& nfa, Budget& budget)
      : nfa_(nfa), budget_(budget), closure1_(nfa.n), done1_(nfa.n, 0), mark_(nfa.n, 0), mark1_(nfa.n, 0) {}

  // Epsilon closure of `qs`, keeping only the states that matter for identity: those with byte
  // edges, and the final state. Sorted, so that equal sets compare equal.
  std::vector<int32_t> closure(const std::vector<int32_t>& qs) {
    ++gen_;
    std::vector<int32_t> out;
    for (int32_t q : qs) {
      budget_.poll();
      for (int32_t x : closure_of(q)) {
        if (mark_[x] == gen_) continue;
        mark_[x] = gen_;
        if (x == nfa_.final_state || nfa_.edge_off[x + 1] > nfa_.edge_off[x]) out.push_back(x);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  const std::vector<int32_t>& closure_of(int32_t q) {
    if (done1_[q]) return closure1_[q];
    std::vector<int32_t>& c = closure1_[q];
    ++gen1_;
    std::vector<int32_t> todo{q};
    c.push_back(q);
    mark1_[q] = gen1_;
    while (!todo.empty()) {
      budget_.poll();
      int32_t x = todo.back();
      todo.pop_back();
      for (int64_t k = nfa_.eps_off[x]; k < nfa_.eps_off[x + 1]; ++k) {
        int32_t y = nfa_.eps[k];
        if (mark1_[y] != gen1_) {
          mark1_[y] = gen1_;
          c.push_back(y);
          todo.push_back(y);
        }
      }
    }
    done1_[q] = 1;
    // cached closures are the quadratic part of the construction's memory ((a?){n}: n closures of n)
    budget_.charge(static_cast<int64_t>(c.size() * sizeof(int32_t)));
    return c;
  }

  const NfaView& nfa_;
  Budget& budget_;
  std::vector<std::vector<int32_t>> closure1_;
  std::vector<uint8_t> done1_;
  std::vector<uint64_t> mark_, mark1_;
  uint64_t gen_ = 0, gen1_ = 0;
};

// UTF-8 byte-range sequences whose concatenations are exactly the encodings of [lo, hi].
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

class NfaBuilder {
 public:
  NfaBuilder(const int32_t* ast, int64_t n, int64_t limit, Budget& budget)
      : ast_(ast), n_(n), limit_(limit), budget_(budget) {}

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
    if (static_cast<int64_t>(nfa_.eps.size()) >= limit_)
      throw DfaError{"constraint too large: more than " + std::to_string(limit_) + " automaton states"};
    budget_.poll();
    budget_.charge(64);  // two empty vectors and their first few entries
    nfa_.eps.emplace_back();
    nfa_.edges.emplace_back();
    return static_cast<int32_t>(nfa_.eps.size() - 1);
  }
  int32_t at(int64_t i) const {
    if (i >= n_) throw std::invalid_argument("truncated AST");
    return ast_[i];
  }
  void edge(int32_t from, int lo, int hi, int32_t to) {
    auto& e = nfa_.edges[from];
    e.push_back(lo);
    e.push_back(hi);
    e.push_back(to);
  }
  // the subtree at `pos` (advanced past it) may be built several times (counted repetition)
  std::pair<int32_t, int32_t> node(int64_t& pos) {
    struct Depth {  // the recursion's depth, bounded (a deep AST would overflow the stack)
      int& d;
      explicit Depth(int& d_) : d(d_) {
        if (++d > kMaxAstDepth) throw std::invalid_argument("AST nested deeper than " + std::to_string(kMaxAstDepth));
      }
      ~Depth() { --d; }
    } depth(depth_);
    const int32_t kind = at(pos++);
    if (kind == 0) {  // set
      const int32_t count = at(pos++);
      const int32_t s = state(), e = state();
      std::map<std::tuple<int32_t, int, int>, int32_t> shared;  // (state, lo, hi) -> next: common leading ranges
      std::vector<std::vector<std::pair<int, int>>> seqs;
      for (int32_t k = 0; k < count; ++k) {
        const int32_t lo = at(pos), hi = at(pos + 1);
        pos += 2;
        if (lo < 0 || hi > 0x10FFFF || lo > hi) throw std::invalid_argument("code-point range out of bounds");
        seqs.clear();
        utf8_sequences(lo, hi, seqs);
        for (const auto& seq : seqs) {
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
        }
      }
      return {s, e};
    }
    if (kind == 1) {  // cat
      const int32_t count = at(pos++);
      const int32_t s = state();
      int32_t e = s;
      for (int32_t k = 0; k < count; ++k) {
        auto [cs, ce] = node(pos);
        nfa_.eps[e].push_back(cs);
        e = ce;
      }
      return {s, e};
    }
    if (kind == 2) {  // alt
      const int32_t count = at(pos++);
      const int32_t s = state(), e = state();
      for (int32_t k = 0; k < count; ++k) {
        auto [cs, ce] = node(pos);
        nfa_.eps[s].push_back(cs);
        nfa_.eps[ce].push_back(e);
      }
      return {s, e};
    }
    if (kind == 3) {  // rep
      const int32_t lo = at(pos), hi = at(pos + 1);
      pos += 2;
      if (lo < 0 || (hi >= 0 && hi < lo)) throw std::invalid_argument("repetition bounds");
      const int64_t child = pos;
      auto again = [&]() {
        int64_t p = child;
        auto r = node(p);
        pos = p;
        return r;
      };
      const int32_t s = state();
      int32_t e = s;
      for (int32_t k = 0; k < lo; ++k) {
        auto [cs, ce] = again();
        nfa_.eps[e].push_back(cs);
        e = ce;
      }
      if (hi < 0) {
        auto [cs, ce] = again();
        const int32_t loop = state();
        nfa_.eps[e].push_back(loop);
        nfa_.eps[loop].push_back(cs);
        nfa_.eps[ce].push_back(loop);
        const int32_t end = state();
        nfa_.eps[loop].push_back(end);
        return {s, end};
      }
      const int32_t end = state();
      nfa_.eps[e].push_back(end);
      for (int32_t k = 0; k < hi - lo; ++k) {
        auto [cs, ce] = again();
        nfa_.eps[e].push_back(cs);
        nfa_.eps[ce].push_back(end);
        e = ce;
      }
      if (lo == 0 && hi == 0) skip(pos);  // the child was never built: step over it
      return {s, end};
    }
    if (kind == 4) {  // an automaton over bytes, embedded as it is (an intersection built in Python)
      const int32_t count = at(pos), start = at(pos + 1);
      pos += 2;
      if (count <= 0 || start < 0 || start >= count) throw std::invalid_argument("embedded DFA: bad size or start");
      std::vector<int32_t> ids(count);
      for (int32_t q = 0; q < count; ++q) ids[q] = state();
      const int32_t e = state();
      for (int32_t q = 0; q < count; ++q)
        if (at(pos + q)) nfa_.eps[ids[q]].push_back(e);
      pos += count;
      for (int32_t q = 0; q < count; ++q) {
        const int32_t ranges = at(pos++);
        for (int32_t k = 0; k < ranges; ++k) {
          const int32_t lo = at(pos), hi = at(pos + 1), to = at(pos + 2);
          pos += 3;
          if (lo < 0 || hi > 255 || lo > hi || to < 0 || to >= count)
            throw std::invalid_argument("embedded DFA: bad edge");
          edge(ids[q], lo, hi, ids[to]);
        }
      }
      return {ids[start], e};
    }
    if (kind == 5) return members(pos);
    if (kind == 6) return comma_list(pos);
    throw std::invalid_argument("unknown AST node kind");
  }
  // JSON object members, each built once (see regex.py, _NFA.members, which this mirrors state for
  // state): a[i] no member before i, p[i] after a comma (member i or a later one), after member i
  // one state that takes the comma or ends, so the subset after a member holds one state, not one
  // per later optional member.
  std::pair<int32_t, int32_t> members(int64_t& pos) {
    const int32_t n = at(pos), at_least_one = at(pos + 1);
    pos += 2;
    if (n < 0) throw std::invalid_argument("members: bad count");
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
      nfa_.eps[entry].push_back(cs);
      nfa_.eps[a[i]].push_back(entry);
      nfa_.eps[p[i]].push_back(entry);
      const int32_t after = state();
      nfa_.eps[ce].push_back(after);
      if (i + 1 < n) edge(after, 0x2C, 0x2C, p[i + 1]);
      nfa_.eps[after].push_back(e[i + 1]);
      if (!req) {
        nfa_.eps[a[i]].push_back(a[i + 1]);
        if (i + 1 < n) nfa_.eps[p[i]].push_back(p[i + 1]);
        nfa_.eps[e[i]].push_back(e[i + 1]);
      }
    }
    if (!at_least_one) nfa_.eps[a[n]].push_back(end);
    return {s, end};
  }
  // child lo..hi times, comma-separated; unbounded: max(lo, 1) copies, the last looping back
  std::pair<int32_t, int32_t> comma_list(int64_t& pos) {
    const int32_t lo = at(pos), hi = at(pos + 1);
    pos += 2;
    if (lo < 0 || (hi >= 0 && hi < lo)) throw std::invalid_argument("list bounds");
    const int64_t child = pos;
    const int32_t s = state(), end = state();
    if (lo == 0) nfa_.eps[s].push_back(end);
    const int32_t copies = hi < 0 ? std::max(lo, 1) : hi;
    int32_t cur = s;
    for (int32_t k = 0; k < copies; ++k) {
      int64_t q = child;
      auto [cs, ce] = node(q);
      pos = q;
      if (k == 0) nfa_.eps[cur].push_back(cs);
      else edge(cur, 0x2C, 0x2C, cs);
      cur = state();
      nfa_.eps[ce].push_back(cur);
      if (k + 1 >= lo) nfa_.eps[cur].push_back(end);
      if (hi < 0 && k + 1 == copies) edge(cur, 0x2C, 0x2C, cs);
    }
    if (copies == 0) skip(pos);
    return {s, end};
  }
  void skip(int64_t& pos) {
    if (++skip_depth_ > kMaxAstDepth) throw std::invalid_argument("AST nested deeper than " + std::to_string(kMaxAstDepth));
    const int32_t kind = at(pos++);
    if (kind == 0) {
      pos += 2 * static_cast<int64_t>(at(pos)) + 1;
    } else if (kind == 1 || kind == 2) {
      const int32_t count = at(pos++);
      for (int32_t k = 0; k < count; ++k) skip(pos);
    } else if (kind == 3) {
      pos += 2;
      skip(pos);
    } else if (kind == 4) {
      const int32_t count = at(pos);
      pos += 2 + static_cast<int64_t>(count);
      for (int32_t q = 0; q < count; ++q) pos += 3 * static_cast<int64_t>(at(pos)) + 1;
    } else if (kind == 5) {
      const int32_t count = at(pos);
      pos += 2;
      for (int32_t k = 0; k < count; ++k) {
        ++pos;  // the member's required flag
        skip(pos);
      }
    } else if (kind == 6) {
      pos += 2;
      skip(pos);
    } else {
      throw std::invalid_argument("unknown AST node kind");
    }
    --skip_depth_;
  }

  const int32_t* ast_;
  int64_t n_, limit_;
  Budget& budget_;
  int depth_ = 0, skip_depth_ = 0;
  Nfa nfa_;
};

}  // namespace

NfaView Nfa::view() {
  const int64_t n = static_cast<int64_t>(eps.size());
  eps_off.assign(n + 1, 0);
  edge_off.assign(n + 1, 0);
  eps_flat.clear();
  edges_flat.clear();
  for (int64_t q = 0; q < n; ++q) {
    eps_flat.insert(eps_flat.end(), eps[q].begin(), eps[q].end());
    edges_flat.insert(edges_flat.end(), edges[q].begin(), edges[q].end());
    eps_off[q + 1] = static_cast<int64_t>(eps_flat.size());
    edge_off[q + 1] = static_cast<int64_t>(edges_flat.size() / 3);
  }
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

Dfa determinize(const NfaView& nfa, int64_t max_states, Budget& budget) {
  Subsets sub(nfa, budget);
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> index;
  std::vector<std::vector<int32_t>> order;
  order.push_back(sub.closure({nfa.start}));
  index.emplace(order[0], 0);
  Dfa out;
  std::vector<int32_t> cuts, tgts;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int32_t> cur = order[i];  // copy: `order` grows below
    out.accept.push_back(std::binary_search(cur.begin(), cur.end(), nfa.final_state) ? 1 : 0);
    out.table.resize(out.table.size() + 256, -1);
    int32_t* row = out.table.data() + i * 256;
    cuts.clear();
    for (int32_t q : cur)
      for (int64_t k = nfa.edge_off[q]; k < nfa.edge_off[q + 1]; ++k) {
        cuts.push_back(nfa.edges[3 * k]);
        cuts.push_back(nfa.edges[3 * k + 1] + 1);
      }
    if (cuts.empty()) continue;
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    budget.charge(256 * sizeof(int32_t) + static_cast<int64_t>(cur.size() * sizeof(int32_t)));
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      budget.poll();
      const int32_t a = cuts[c], b = cuts[c + 1];
      tgts.clear();
      for (int32_t q : cur)
        for (int64_t k = nfa.edge_off[q]; k < nfa.edge_off[q + 1]; ++k)
          if (nfa.edges[3 * k] <= a && b - 1 <= nfa.edges[3 * k + 1]) tgts.push_back(nfa.edges[3 * k + 2]);
      if (tgts.empty()) continue;
      std::vector<int32_t> nxt = sub.closure(tgts);
      auto it = index.find(nxt);
      int32_t j;
      if (it == index.end()) {
        if (static_cast<int64_t>(order.size()) >= max_states)
          throw DfaError{"constraint too large: more than " + std::to_string(max_states) + " automaton states"};
        j = static_cast<int32_t>(order.size());
        index.emplace(nxt, j);
        order.push_back(std::move(nxt));
      } else {
        j = it->second;
      }
      for (int32_t x = a; x < b; ++x) row[x] = j;
    }
  }
  return out;
}

Dfa minimize(const int32_t* table, const uint8_t* accept, int64_t n, Budget& budget) {
  // Hopcroft's partition refinement on the completed automaton: a sink state `n` takes every
  // missing transition. States that cannot reach acceptance end up in the sink's block, which
  // both trims and minimises; blocks are then numbered canonically.
  const int64_t N = n + 1, sink = n;
  // bytes that every state treats alike form one letter of a smaller alphabet
  // A smaller alphabet: the byte intervals over which no state's row changes (cheaper to find than
  // full column equivalence, and only ever finer).
  std::vector<int> letters{0};  // the first byte of each letter
  {
    std::vector<uint8_t> cut(256, 0);
    for (int64_t s = 0; s < n; ++s) {
      const int32_t* row = table + s * 256;
      for (int b = 1; b < 256; ++b) cut[b] |= row[b] != row[b - 1];
    }
    for (int b = 1; b < 256; ++b)
      if (cut[b]) letters.push_back(b);
  }
  const int64_t L = static_cast<int64_t>(letters.size());
  // transitions over letters, the sink included: next[s * L + l]
  std::vector<int32_t> next(N * L, static_cast<int32_t>(sink));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t l = 0; l < L; ++l) {
      const int32_t d = table[s * 256 + letters[l]];
      if (d >= 0) next[s * L + l] = d;
    }
  // inverse transitions per letter in compressed rows: the predecessors of d on l are
  // inv[inv_off[l * (N + 1) + d] .. inv_off[l * (N + 1) + d + 1])
  std::vector<int64_t> inv_off(L * (N + 1) + 1, 0);
  std::vector<int32_t> inv(L * N);
  for (int64_t s = 0; s < N; ++s)
    for (int64_t l = 0; l < L; ++l) ++inv_off[l * (N + 1) + next[s * L + l] + 1];
  for (int64_t l = 0; l < L; ++l) {
    int64_t* off = inv_off.data() + l * (N + 1);
    off[0] = l * N;
    for (int64_t d = 0; d < N; ++d) off[d + 1] += off[d];
  }
  {
    std::vector<int64_t> fill(inv_off.begin(), inv_off.end());
    for (int64_t s = 0; s < N; ++s)
      for (int64_t l = 0; l < L; ++l) inv[fill[l * (N + 1) + next[s * L + l]]++] = static_cast<int32_t>(s);
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
  std::vector<std::pair<int32_t, int32_t>> work;
  auto push = [&](int32_t b, int64_t l) {
    if (static_cast<int64_t>(in_work.size()) < (b + 1) * L) in_work.resize((b + 1) * L, 0);
    if (!in_work[b * L + l]) {
      in_work[b * L + l] = 1;
      work.emplace_back(b, static_cast<int32_t>(l));
    }
  };
  // letters on which some transition enters each state: a block that nothing enters on a letter
  // cannot split anything on it, so it is never queued for that letter (most blocks of a
  // constraint automaton are entered on one or two letters out of dozens)
  std::vector<std::bitset<256>> enters(N);
  for (int64_t s = 0; s < N; ++s)
    for (int64_t l = 0; l < L; ++l) enters[next[s * L + l]].set(l);
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
    splitter.assign(elems.begin() + first[a], elems.begin() + last[a]);
    touched.clear();
    const int64_t* off = inv_off.data() + l * (N + 1);
    for (int32_t d : splitter) {
      budget.poll();
      for (int64_t k = off[d]; k < off[d + 1]; ++k) {
        const int32_t s = inv[k];
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
      bool b_queued = false;
      for (int64_t ll = 0; ll < L && !b_queued; ++ll)
        b_queued = static_cast<int64_t>(in_work.size()) > b * L + ll && in_work[b * L + ll];
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
  auto target = [&](int32_t s, int b) -> int32_t {
    const int32_t d = table[static_cast<int64_t>(s) * 256 + b];
    return d < 0 ? dead : block[d];
  };
  for (size_t qi = 0; qi < queue.size(); ++qi) {
    const int32_t s = rep[queue[qi]];
    for (int b = 0; b < 256; ++b) {
      const int32_t c = target(s, b);
      if (c != dead && number[c] < 0) {
        number[c] = static_cast<int32_t>(queue.size());
        queue.push_back(c);
      }
    }
  }
  Dfa out;
  const int64_t m = static_cast<int64_t>(queue.size());
  out.table.assign(m * 256, -1);
  out.accept.assign(m, 0);
  for (int64_t i = 0; i < m; ++i) {
    const int32_t s = rep[queue[i]];
    for (int b = 0; b < 256; ++b) {
      const int32_t c = target(s, b);
      out.table[i * 256 + b] = c == dead ? -1 : number[c];
    }
    out.accept[i] = accept[s];
  }
  return out;
}

}  // namespace llmserve
