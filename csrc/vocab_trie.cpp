#include "vocab_trie.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>

namespace llmserve {

Vocab::Vocab(std::vector<int64_t> offsets, std::vector<uint8_t> data, std::vector<int32_t> eos, int64_t size)
    : offsets_(std::move(offsets)), data_(std::move(data)), eos_(std::move(eos)), size_(size) {
  words_ = (size_ + 31) / 32;
  is_eos_.assign(size_, 0);
  for (int32_t e : eos_)
    if (e >= 0 && e < size_) is_eos_[e] = 1;
  std::vector<int32_t> order;  // ids of the tokens with bytes, sorted by their bytes: the trie's preorder
  for (int64_t i = 0; i < size_; ++i)
    if (len(i) > 0) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [this](int32_t a, int32_t b) {
    const uint8_t *pa = ptr(a), *pb = ptr(b);
    int64_t la = len(a), lb = len(b);
    int c = std::memcmp(pa, pb, std::min(la, lb));
    if (c != 0) return c < 0;
    if (la != lb) return la < lb;
    return a < b;
  });
  std::vector<int32_t> lcp(order.size(), 0);  // common prefix length with the previous token in order
  for (size_t k = 1; k < order.size(); ++k) {
    int32_t a = order[k - 1], b = order[k];
    int64_t n = std::min(len(a), len(b)), l = 0;
    const uint8_t *pa = ptr(a), *pb = ptr(b);
    while (l < n && pa[l] == pb[l]) ++l;
    lcp[k] = static_cast<int32_t>(l);
  }
  max_len_ = 0;
  for (int64_t i = 0; i < size_; ++i) max_len_ = std::max(max_len_, len(i));
  build_trie(order, lcp);
}

void Vocab::build_trie(const std::vector<int32_t>& order, const std::vector<int32_t>& lcp) {
  // order is sorted by bytes, which is the trie's preorder: each token opens nodes for its bytes
  // past the prefix it shares with the previous token, closing the deeper nodes of that one.
  std::vector<int32_t> path;  // path[d] = open node at depth d + 1
  std::vector<int32_t> tok_node;
  for (size_t k = 0; k < order.size(); ++k) {
    const int32_t t = order[k];
    const int64_t n = len(t), l = k ? lcp[k] : 0;
    while (static_cast<int64_t>(path.size()) > l) {
      trie_end_[path.back()] = static_cast<int32_t>(trie_byte_.size());
      path.pop_back();
    }
    const uint8_t* p = ptr(t);
    for (int64_t d = l; d < n; ++d) {
      path.push_back(static_cast<int32_t>(trie_byte_.size()));
      trie_byte_.push_back(p[d]);
      trie_depth_.push_back(static_cast<int32_t>(d + 1));
      trie_end_.push_back(0);
    }
    tok_node.push_back(path.back());  // l == n only for a duplicate of the previous token's bytes
    trie_tok_.push_back(t);
  }
  while (!path.empty()) {
    trie_end_[path.back()] = static_cast<int32_t>(trie_byte_.size());
    path.pop_back();
  }
  trie_tok_off_.assign(trie_byte_.size() + 1, 0);
  for (int32_t node : tok_node) ++trie_tok_off_[node + 1];
  for (size_t i = 0; i < trie_byte_.size(); ++i) trie_tok_off_[i + 1] += trie_tok_off_[i];
}

Transitions Transitions::dense(const int32_t* table) {
  static const auto identity = [] {
    std::array<uint8_t, 256> a{};
    for (int b = 0; b < 256; ++b) a[b] = static_cast<uint8_t>(b);
    return a;
  }();
  return Transitions{table, identity.data(), 256};
}

std::vector<int32_t> byte_classes(const Transitions& tr, int64_t S, uint8_t* cls, int64_t& C) {
  std::vector<int> first;  // per class, its first byte
  uint64_t hash[256];
  for (int b = 0; b < 256; ++b) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t s = 0; s < S; ++s)
      h = (h ^ static_cast<uint32_t>(tr.next(static_cast<int32_t>(s), static_cast<uint8_t>(b)))) * 0x100000001B3ull + (h >> 29);
    hash[b] = h;
  }
  for (int b = 0; b < 256; ++b) {
    int found = -1;
    for (size_t c = 0; c < first.size() && found < 0; ++c) {
      if (hash[first[c]] != hash[b]) continue;
      const uint8_t x = static_cast<uint8_t>(b), y = static_cast<uint8_t>(first[c]);
      bool same = true;
      if (tr.cls[x] != tr.cls[y])  // else one input column: equal in every row
        for (int64_t s = 0; s < S && same; ++s)
          same = tr.next(static_cast<int32_t>(s), x) == tr.next(static_cast<int32_t>(s), y);
      if (same) found = static_cast<int>(c);
    }
    if (found < 0) {
      found = static_cast<int>(first.size());
      first.push_back(b);
    }
    cls[b] = static_cast<uint8_t>(found);
  }
  C = static_cast<int64_t>(first.size());
  std::vector<int32_t> out(S * C);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) out[s * C + c] = tr.next(static_cast<int32_t>(s), static_cast<uint8_t>(first[c]));
  return out;
}

void Vocab::state_mask(const Transitions& tr, int32_t s, uint32_t* out, int32_t* stack) const {
  tr.visit([&](const auto& view) {
    walk_mask([&view](int32_t q, uint8_t b) { return view.next(q, b); }, s, out, stack);
  });
}

void Vocab::state_mask_within(const Transitions& tr, int32_t s, const int32_t* dist, int32_t k, uint32_t* out,
                              int32_t* stack) const {
  std::memset(out, 0, words_ * sizeof(uint32_t));
  tr.visit([&](const auto& view) {
    each_successor(view, s, stack, [&](int32_t q, int32_t node) {
      if (dist[q] <= k)
        for (auto [t, end] = node_tokens(node); t < end; ++t) out[*t >> 5] |= 1u << (*t & 31);
      return false;
    });
  });
}

int32_t Vocab::min_successor(const Transitions& tr, int32_t s, const int32_t* dist, int32_t* stack) const {
  int32_t best = INT32_MAX;
  tr.visit([&](const auto& view) {
    each_successor(view, s, stack, [&](int32_t q, int32_t) {
      best = std::min(best, dist[q]);
      return false;
    });
  });
  return best;
}

int32_t Vocab::longest_cut(const uint8_t* s, int64_t n) const {
  int32_t tokens = 0;
  for (int64_t p = 0; p < n; ++tokens) {
    const int64_t len = longest_token(s + p, n - p);
    if (len == 0) return -1;
    p += len;
  }
  return tokens;
}

int64_t Vocab::longest_token(const uint8_t* s, int64_t n) const {
  int64_t best = 0;
  // the children of a node are the nodes after it, each next one past the previous one's subtree
  int32_t lo = 0, hi = static_cast<int32_t>(trie_byte_.size());
  for (int64_t d = 0; d < n; ++d) {
    int32_t i = lo;
    while (i < hi && trie_byte_[i] != s[d]) i = trie_end_[i];
    if (i >= hi) break;
    if (trie_tok_off_[i + 1] > trie_tok_off_[i]) best = d + 1;
    lo = i + 1;
    hi = trie_end_[i];
  }
  return best;
}

void byte_distances(const Transitions& tr, const uint8_t* accept, int64_t S, const uint8_t* usable, int32_t* dist) {
  std::vector<uint8_t> reps;  // one usable byte per class that has one
  std::vector<uint8_t> have(256, 0);
  for (int b = 0; b < 256; ++b)
    if (usable[b] && !have[tr.cls[b]]) {
      have[tr.cls[b]] = 1;
      reps.push_back(static_cast<uint8_t>(b));
    }
  // predecessors in compressed rows: pred[off[q] .. off[q + 1]) are the states with a step into q
  std::vector<int64_t> off(S + 1, 0);
  for (int64_t s = 0; s < S; ++s)
    for (const uint8_t b : reps) {
      const int32_t q = tr.next(static_cast<int32_t>(s), b);
      if (q >= 0) ++off[q + 1];
    }
  for (int64_t q = 0; q < S; ++q) off[q + 1] += off[q];
  std::vector<int32_t> pred(off[S]);
  std::vector<int64_t> fill(off.begin(), off.end() - 1);
  for (int64_t s = 0; s < S; ++s)
    for (const uint8_t b : reps) {
      const int32_t q = tr.next(static_cast<int32_t>(s), b);
      if (q >= 0) pred[fill[q]++] = static_cast<int32_t>(s);
    }
  std::vector<int32_t> queue;
  for (int64_t s = 0; s < S; ++s) {
    dist[s] = accept[s] ? 0 : INT32_MAX;
    if (accept[s]) queue.push_back(static_cast<int32_t>(s));
  }
  for (size_t k = 0; k < queue.size(); ++k) {
    const int32_t q = queue[k];
    for (int64_t i = off[q]; i < off[q + 1]; ++i) {
      const int32_t p = pred[i];
      if (dist[p] == INT32_MAX) {
        dist[p] = dist[q] + 1;
        queue.push_back(p);
      }
    }
  }
}

bool shortest_answer(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t start,
                     std::vector<uint8_t>& out) {
  // one byte of each class (every byte of a class leads to the same state): first only bytes that
  // are tokens by themselves, so that the cut finds a token at every byte (LazyDfa::shortest_answer
  // searches the same way: a check and an engine holding either automaton find answers alike), then
  // any byte of every class
  std::vector<uint8_t> reps;
  std::vector<uint8_t> have(256, 0);
  std::vector<int32_t> parent(S), queue;
  std::vector<uint8_t> via(S, 0);
  out.clear();
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      const uint8_t byte = static_cast<uint8_t>(b);
      if (!have[tr.cls[b]] && (pass == 1 || v.longest_token(&byte, 1) == 1)) {
        have[tr.cls[b]] = 1;
        reps.push_back(byte);
      }
    }
    std::fill(parent.begin(), parent.end(), -2);  // -2: not reached; the start's parent is -1
    queue.assign(1, start);
    parent[start] = -1;
    int32_t end = accept[start] ? start : -1;
    for (size_t k = 0; k < queue.size() && end < 0; ++k) {
      const int32_t s = queue[k];
      for (const uint8_t b : reps) {
        const int32_t q = tr.next(s, b);
        if (q < 0 || parent[q] != -2) continue;
        parent[q] = s;
        via[q] = b;
        if (accept[q]) {
          end = q;
          break;
        }
        queue.push_back(q);
      }
    }
    if (end >= 0) {
      for (int32_t q = end; parent[q] >= 0; q = parent[q]) out.push_back(via[q]);
      std::reverse(out.begin(), out.end());
      return true;
    }
  }
  return false;
}

int32_t greedy_tokens(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t start) {
  std::vector<uint8_t> answer;
  if (!shortest_answer(v, tr, accept, S, start, answer)) return INT32_MAX;
  return v.longest_cut(answer.data(), static_cast<int64_t>(answer.size()));
}

FewestTokens fewest_tokens(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int32_t start,
                           int64_t budget_ms) {
  return tr.visit([&](const auto& view) {
    using View = std::decay_t<decltype(view)>;
    struct Table {
      View view;
      const uint8_t* accept;
      int32_t next(int32_t s, uint8_t b) const { return view.next(s, b); }
      bool accepting(int32_t s) const { return accept[s] != 0; }
    } table{view, accept};
    return fewest_tokens_in(v, table, start, budget_ms);
  });
}

}  // namespace llmserve
