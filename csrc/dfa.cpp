// Byte-level DFA construction (see dfa.h). Sizes here are small (at most tens of thousands of states),
// so the aim is low constant cost: constraint compile time is dominated by this step and the first
// mask, and it runs on the request path when a new constraint arrives.

#include "dfa.h"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace llmserve {

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
  explicit Subsets(const NfaView& nfa) : nfa_(nfa), closure1_(nfa.n), done1_(nfa.n, 0), mark_(nfa.n, 0), mark1_(nfa.n, 0) {}

  // Epsilon closure of `qs`, keeping only the states that matter for identity: those with byte
  // edges, and the final state. Sorted, so that equal sets compare equal.
  std::vector<int32_t> closure(const std::vector<int32_t>& qs) {
    ++gen_;
    std::vector<int32_t> out;
    for (int32_t q : qs)
      for (int32_t x : closure_of(q)) {
        if (mark_[x] == gen_) continue;
        mark_[x] = gen_;
        if (x == nfa_.final_state || nfa_.edge_off[x + 1] > nfa_.edge_off[x]) out.push_back(x);
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
    return c;
  }

  const NfaView& nfa_;
  std::vector<std::vector<int32_t>> closure1_;
  std::vector<uint8_t> done1_;
  std::vector<uint64_t> mark_, mark1_;
  uint64_t gen_ = 0, gen1_ = 0;
};

}  // namespace

Dfa determinize(const NfaView& nfa, int64_t max_states) {
  Subsets sub(nfa);
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
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
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

Dfa minimize(const int32_t* table, const uint8_t* accept, int64_t n) {
  // Hopcroft's partition refinement on the completed automaton: a sink state `n` takes every
  // missing transition. States that cannot reach acceptance end up in the sink's block, which
  // both trims and minimises; blocks are then numbered canonically.
  const int64_t N = n + 1, sink = n;
  // bytes that every state treats alike form one letter of a smaller alphabet
  std::vector<int> letters;  // a representative byte per letter
  {
    std::vector<uint64_t> h(256, 1469598103934665603ull);
    for (int64_t s = 0; s < n; ++s)
      for (int b = 0; b < 256; ++b) h[b] = (h[b] ^ static_cast<uint32_t>(table[s * 256 + b])) * 1099511628211ull;
    auto same_column = [&](int a, int b) {
      for (int64_t s = 0; s < n; ++s)
        if (table[s * 256 + a] != table[s * 256 + b]) return false;
      return true;
    };
    std::unordered_map<uint64_t, std::vector<int>> by_hash;  // hash -> representatives
    for (int b = 0; b < 256; ++b) {
      auto& reps = by_hash[h[b]];
      bool found = false;
      for (int r : reps) found = found || same_column(r, b);
      if (!found) {
        reps.push_back(b);
        letters.push_back(b);
      }
    }
  }
  const int64_t L = static_cast<int64_t>(letters.size());
  auto delta = [&](int64_t s, int64_t l) -> int64_t {
    if (s == sink) return sink;
    const int32_t d = table[s * 256 + letters[l]];
    return d < 0 ? sink : d;
  };
  // inverse transitions per letter, compressed rows: inv_off[l * (N + 1) + d] ...
  std::vector<int64_t> inv_off(L * (N + 1) + 1, 0);
  std::vector<int32_t> inv(L * N);
  for (int64_t l = 0; l < L; ++l) {
    int64_t* off = inv_off.data() + l * (N + 1);
    std::vector<int64_t> count(N + 1, 0);
    for (int64_t s = 0; s < N; ++s) ++count[delta(s, l) + 1];
    for (int64_t d = 0; d < N; ++d) count[d + 1] += count[d];
    for (int64_t d = 0; d <= N; ++d) off[d] = l * N + count[d];
    std::vector<int64_t> fillpos(count.begin(), count.end() - 1);
    for (int64_t s = 0; s < N; ++s) inv[l * N + fillpos[delta(s, l)]++] = static_cast<int32_t>(s);
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
  for (int32_t b = 0; b < static_cast<int32_t>(first.size()); ++b)
    for (int64_t l = 0; l < L; ++l) push(b, l);
  std::vector<int32_t> splitter, touched;
  while (!work.empty()) {
    auto [a, l] = work.back();
    work.pop_back();
    in_work[a * L + l] = 0;
    splitter.assign(elems.begin() + first[a], elems.begin() + last[a]);
    touched.clear();
    const int64_t* off = inv_off.data() + l * (N + 1);
    for (int32_t d : splitter)
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
      const bool new_smaller = (last[nb] - first[nb]) <= (last[b] - first[b]);
      for (int64_t ll = 0; ll < L; ++ll) {
        if (static_cast<int64_t>(in_work.size()) > b * L + ll && in_work[b * L + ll])
          push(nb, ll);
        else
          push(new_smaller ? nb : b, ll);
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
