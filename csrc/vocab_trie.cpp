#include "vocab_trie.h"

#include <algorithm>
#include <array>
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
    const int32_t cur = tr.next(stack[d - 1], byte[i]);
    if (cur < 0) {
      i = end[i];
      continue;
    }
    stack[d] = cur;
    for (int32_t k = off[i]; k < off[i + 1]; ++k) out[tok[k] >> 5] |= 1u << (tok[k] & 31);
    ++i;
  }
}

void Vocab::state_mask_within(const Transitions& tr, int32_t s, const int32_t* dist, int32_t k, uint32_t* out,
                              int32_t* stack) const {
  std::memset(out, 0, words_ * sizeof(uint32_t));
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
    if (dist[cur] <= k)
      for (int32_t j = trie_tok_off_[i]; j < trie_tok_off_[i + 1]; ++j)
        out[trie_tok_[j] >> 5] |= 1u << (trie_tok_[j] & 31);
    ++i;
  }
}

int32_t Vocab::min_successor(const Transitions& tr, int32_t s, const int32_t* dist, int32_t* stack) const {
  int32_t best = INT32_MAX;
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
    if (trie_tok_off_[i + 1] > trie_tok_off_[i] && dist[cur] < best) best = dist[cur];
    ++i;
  }
  return best;
}

}  // namespace llmserve
