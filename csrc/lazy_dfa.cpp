#include "lazy_dfa.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "grammar.h"

namespace llmserve {

LazyDfa::LazyDfa(const int32_t* ast, int64_t n, int64_t max_states, int64_t max_nfa_states, int64_t budget_ms,
                 int64_t max_bytes, int64_t call_ms)
    : budget_(budget_ms, max_bytes), max_states_(max_states), call_ms_(call_ms) {
  nfa_ = build_nfa(ast, n, max_nfa_states, budget_);
  view_ = nfa_.view();
  const int64_t n_states = view_.n;
  in_off_.assign(n_states + 1, 0);
  const int64_t eps = view_.eps_off[n_states], edges = view_.edge_off[n_states];
  for (int64_t k = 0; k < eps; ++k) ++in_off_[view_.eps[k] + 1];
  for (int64_t k = 0; k < edges; ++k) ++in_off_[view_.edges[3 * k + 2] + 1];
  for (int64_t q = 0; q < n_states; ++q) in_off_[q + 1] += in_off_[q];
  in_from_.resize(in_off_[n_states]);
  in_lo_.resize(in_off_[n_states]);
  in_hi_.resize(in_off_[n_states]);
  budget_.charge(static_cast<int64_t>(in_from_.size()) * 8);
  std::vector<int64_t> fill(in_off_.begin(), in_off_.end() - 1);
  for (int64_t q = 0; q < n_states; ++q) {
    for (int64_t k = view_.eps_off[q]; k < view_.eps_off[q + 1]; ++k) {
      const int64_t at = fill[view_.eps[k]]++;
      in_from_[at] = static_cast<int32_t>(q);
      in_lo_[at] = in_hi_[at] = -1;
    }
    for (int64_t k = view_.edge_off[q]; k < view_.edge_off[q + 1]; ++k) {
      const int64_t at = fill[view_.edges[3 * k + 2]]++;
      in_from_[at] = static_cast<int32_t>(q);
      in_lo_[at] = static_cast<int16_t>(view_.edges[3 * k]);
      in_hi_[at] = static_cast<int16_t>(view_.edges[3 * k + 1]);
    }
  }
  {
    uint8_t every[256];
    std::fill(every, every + 256, 1);
    const std::vector<int32_t> d = nfa_distances(every);
    live_.resize(n_states);
    for (int64_t q = 0; q < n_states; ++q) live_[q] = d[q] != INT32_MAX;
  }
  subsets_ = std::make_unique<SubsetConstruction>(view_, max_states, budget_, live_.data());
  if (subsets_->found() == 0) throw DfaError{"the constraint matches no string at all"};
  expanded_.assign(subsets_->found(), 0);
  found_.store(subsets_->found(), std::memory_order_release);
}

void LazyDfa::expand(int32_t s) {
  try {
    subsets_->expand(s);
  } catch (const DfaError& e) {
    // states found before the limit stopped the row exist: a later call may name them (s itself
    // stays unexpanded, built again by a later call if it can be). Whatever the limit, a grammar
    // over this automaton has ended the answers that reached s for good (its row or step is dead).
    expanded_.resize(subsets_->found(), 0);
    found_.store(subsets_->found(), std::memory_order_release);
    exhausted_.store(true, std::memory_order_release);
    if (e.message.find("time budget") == std::string::npos) full_.store(true, std::memory_order_release);
    throw;
  } catch (...) {
    expanded_.resize(subsets_->found(), 0);
    found_.store(subsets_->found(), std::memory_order_release);
    exhausted_.store(true, std::memory_order_release);
    full_.store(true, std::memory_order_release);
    throw;
  }
  expanded_.resize(subsets_->found(), 0);
  found_.store(subsets_->found(), std::memory_order_release);
  expanded_[s] = 1;
  ++expanded_count_;
}

std::vector<int32_t> LazyDfa::nfa_distances(const uint8_t* usable) const {
  int32_t below[257] = {};  // usable bytes below b
  for (int b = 0; b < 256; ++b) below[b + 1] = below[b] + (usable[b] ? 1 : 0);
  // a breadth-first search backwards where epsilon moves cost nothing: a deque, free moves in front
  std::vector<int32_t> dist(view_.n, INT32_MAX);
  std::deque<int32_t> todo{view_.final_state};
  dist[view_.final_state] = 0;
  while (!todo.empty()) {
    const int32_t q = todo.front();
    todo.pop_front();
    for (int64_t k = in_off_[q]; k < in_off_[q + 1]; ++k) {
      const bool free = in_lo_[k] < 0;
      if (!free && below[in_hi_[k] + 1] == below[in_lo_[k]]) continue;  // no usable byte on it
      const int32_t d = dist[q] + (free ? 0 : 1), p = in_from_[k];
      if (d >= dist[p]) continue;
      dist[p] = d;
      if (free)
        todo.push_front(p);
      else
        todo.push_back(p);
    }
  }
  return dist;
}

void LazyDfa::use_usable(const uint8_t* usable) {
  if (!dist_.empty() && std::memcmp(usable, dist_usable_, 256) == 0) return;
  dist_ = nfa_distances(usable);
  std::memcpy(dist_usable_, usable, 256);
  state_dist_.clear();
}

int32_t LazyDfa::state_distance(int32_t s) {
  if (static_cast<size_t>(s) >= state_dist_.size()) state_dist_.resize(found(), kUnknown);
  int32_t& cached = state_dist_[s];
  if (cached == kUnknown) {
    int32_t best = INT32_MAX;
    for (auto [q, end] = subsets_->members(s); q < end; ++q) best = std::min(best, dist_[*q]);
    cached = best;
  }
  return cached;
}

int32_t LazyDfa::byte_distance(int32_t s, const uint8_t* usable) {
  use_usable(usable);
  return state_distance(s);
}

int32_t LazyDfa::steering_distance(int32_t s, const uint8_t* usable) {
  use_usable(usable);
  return std::min(state_distance(s), recorded(s));
}

int32_t LazyDfa::max_steering_distance(const uint8_t* usable) {
  use_usable(usable);
  // a live NFA state the usable bytes cannot end from (a vocabulary without some single bytes): a
  // walk may reach a state no figure covers, so every step must be steered
  for (int64_t q = 0; q < view_.n; ++q)
    if (live_[q] && dist_[q] == INT32_MAX) return INT32_MAX - 1;
  return std::max(max_byte_distance(usable), recorded_most_);
}

int32_t LazyDfa::max_byte_distance(const uint8_t* usable) {
  use_usable(usable);
  int32_t most = 0;
  for (int64_t q = 0; q < view_.n; ++q)
    if (live_[q] && dist_[q] != INT32_MAX) most = std::max(most, dist_[q]);
  return most;
}

void LazyDfa::budget_row(const Vocab& v, int32_t s, const uint8_t* usable, int32_t k, uint32_t* out) {
  restart();
  use_usable(usable);
  std::memset(out, 0, v.words() * sizeof(uint32_t));
  v.each_successor(*this, s, walk_stack(v), [&](int32_t q, int32_t node) {
    if (std::min(state_distance(q), recorded(q)) <= k)
      for (auto [t, end] = v.node_tokens(node); t < end; ++t) out[*t >> 5] |= 1u << (*t & 31);
    return false;
  });
  if (accepting(s))
    for (int32_t e : v.eos()) out[e >> 5] |= 1u << (e & 31);
}

int32_t LazyDfa::greedy_tokens(const Vocab& v, int32_t s) {
  std::vector<uint8_t> answer;
  if (!shortest_answer(v, s, answer)) return INT32_MAX;
  return v.longest_cut(answer.data(), static_cast<int64_t>(answer.size()));
}

int32_t LazyDfa::add_answer(const Vocab& v, int32_t s, const uint8_t* answer, int64_t n) {
  restart();
  const std::vector<int32_t> path =
      v.token_path(*this, [this](int32_t q) { return accepting(q); }, s, answer, n);
  if (path.empty()) return -1;
  const int32_t tokens = static_cast<int32_t>(path.size() - 1);
  if (recorded_.size() < static_cast<size_t>(found())) recorded_.resize(found(), INT32_MAX);
  for (int32_t i = 0; i < tokens; ++i) recorded_[path[i]] = std::min(recorded_[path[i]], tokens - i);
  recorded_most_ = std::max(recorded_most_, tokens);
  return tokens;
}

bool LazyDfa::shortest_answer(const Vocab& v, int32_t s, std::vector<uint8_t>& answer) {
  restart();
  answer.clear();
  uint8_t usable[256];
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = static_cast<uint8_t>(b);
    usable[b] = v.longest_token(&byte, 1) == 1 ? 1 : 0;
  }
  int32_t d = byte_distance(s, usable);
  if (d == INT32_MAX) {  // single-byte tokens cannot end it: any bytes, the cut may then fail
    std::fill(usable, usable + 256, 1);
    d = byte_distance(s, usable);
    if (d == INT32_MAX) return false;
  }
  answer.reserve(d);
  for (; d > 0; --d) {  // a byte one step nearer acceptance: there is one at every state of the path
    int b = 0;
    for (; b < 256; ++b) {
      if (!usable[b]) continue;
      const int32_t q = next(s, static_cast<uint8_t>(b));
      if (q >= 0 && byte_distance(q, usable) == d - 1) {
        s = q;
        break;
      }
    }
    if (b == 256) throw DfaError{"shortest_answer: no byte one step nearer (a bug)"};  // distances are exact
    answer.push_back(static_cast<uint8_t>(b));
  }
  return true;
}

void LazyDfa::mask_row(const Vocab& v, int32_t s, uint32_t* out) {
  restart();
  v.walk_mask([this](int32_t q, uint8_t b) { return next(q, b); }, s, out, walk_stack(v));
  add_end_of_sequence(v, accepting(s), out);
}

void LazyDfa::find_useful() {
  // a move into a live state comes from a live one, so the search never needs to leave them
  useful_.assign(view_.n, 0);
  std::vector<int32_t> todo;
  auto visit = [&](int32_t t) {
    if (live_[t] && !useful_[t]) {
      useful_[t] = 1;
      todo.push_back(t);
    }
  };
  visit(view_.start);
  while (!todo.empty()) {
    const int32_t q = todo.back();
    todo.pop_back();
    for (int64_t k = view_.eps_off[q]; k < view_.eps_off[q + 1]; ++k) visit(view_.eps[k]);
    for (int64_t k = view_.edge_off[q]; k < view_.edge_off[q + 1]; ++k) visit(view_.edges[3 * k + 2]);
  }
}

std::vector<int8_t> LazyDfa::occurs(const std::vector<std::string>& texts, int64_t max_steps) {
  if (useful_.empty()) find_useful();
  const int64_t n = view_.n;
  std::vector<int8_t> found(texts.size(), -1);
  int64_t steps = 0;
  // a set of NFA states is a list; mark[q] == epoch: q is in the set being built
  std::vector<uint32_t> mark(n, 0);
  uint32_t epoch = 0;
  auto fresh_epoch = [&] {
    if (++epoch == 0) {  // wrapped: no set may keep a stale mark
      std::fill(mark.begin(), mark.end(), 0);
      epoch = 1;
    }
  };
  auto add = [&](std::vector<int32_t>& set, int32_t t) {
    if (useful_[t] && mark[t] != epoch) {
      mark[t] = epoch;
      set.push_back(t);
    }
  };
  auto close = [&](std::vector<int32_t>& set) {  // epsilon moves, within the states an answer passes
    for (size_t i = 0; i < set.size() && steps <= max_steps; ++i) {
      const int32_t q = set[i];
      steps += 1 + view_.eps_off[q + 1] - view_.eps_off[q];
      for (int64_t k = view_.eps_off[q]; k < view_.eps_off[q + 1]; ++k) add(set, view_.eps[k]);
    }
  };
  // the first byte from every state an answer passes through: one pass over the moves for all texts
  std::vector<uint8_t> firsts;
  for (const std::string& t : texts)
    if (!t.empty()) firsts.push_back(static_cast<uint8_t>(t[0]));
  std::sort(firsts.begin(), firsts.end());
  firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
  std::vector<std::vector<int32_t>> after_first(256);
  for (int64_t q = 0; q < n && steps <= max_steps; ++q) {
    if (!useful_[q]) continue;
    steps += view_.edge_off[q + 1] - view_.edge_off[q];
    for (int64_t k = view_.edge_off[q]; k < view_.edge_off[q + 1]; ++k) {
      const int32_t lo = view_.edges[3 * k], hi = view_.edges[3 * k + 1], t = view_.edges[3 * k + 2];
      if (!useful_[t]) continue;
      for (auto b = std::lower_bound(firsts.begin(), firsts.end(), lo); b != firsts.end() && *b <= hi; ++b) {
        after_first[*b].push_back(t);
        ++steps;
      }
    }
  }
  if (steps > max_steps) return found;
  // the texts by first byte: each first byte's set is closed when its texts are read, and let go after them
  std::vector<size_t> order(texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int x = texts[a].empty() ? -1 : static_cast<uint8_t>(texts[a][0]);
    const int y = texts[b].empty() ? -1 : static_cast<uint8_t>(texts[b][0]);
    return x < y;
  });
  std::vector<int32_t> first, cur, next;
  int last = -1;
  for (size_t at = 0; at < order.size() && steps <= max_steps; ++at) {
    const std::string& text = texts[order[at]];
    if (text.empty()) {
      found[order[at]] = 1;  // the empty string occurs everywhere
      continue;
    }
    const int b0 = static_cast<uint8_t>(text[0]);
    if (b0 != last) {
      if (last >= 0) std::vector<int32_t>().swap(after_first[last]);
      first.clear();
      fresh_epoch();
      for (int32_t t : after_first[b0]) add(first, t);
      close(first);
      last = b0;
    }
    cur = first;
    for (size_t j = 1; j < text.size() && !cur.empty() && steps <= max_steps; ++j) {
      const int32_t b = static_cast<uint8_t>(text[j]);
      next.clear();
      fresh_epoch();
      for (int32_t q : cur) {
        steps += 1 + view_.edge_off[q + 1] - view_.edge_off[q];
        for (int64_t k = view_.edge_off[q]; k < view_.edge_off[q + 1]; ++k)
          if (view_.edges[3 * k] <= b && b <= view_.edges[3 * k + 1]) add(next, view_.edges[3 * k + 2]);
      }
      close(next);
      cur.swap(next);
    }
    if (steps <= max_steps) found[order[at]] = cur.empty() ? 0 : 1;
  }
  return found;
}

}  // namespace llmserve
