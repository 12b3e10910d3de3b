#include "lazy_dfa.h"

#include "grammar.h"

namespace llmserve {

namespace {

// Per NFA state, whether the final state is reachable from it (by any moves): a search backwards.
std::vector<uint8_t> reaching_final(const NfaView& nfa) {
  const int64_t n = nfa.n;
  // the moves reversed, in compressed rows: into[in_off[q] .. in_off[q + 1]) enter q
  std::vector<int64_t> in_off(n + 1, 0);
  const int64_t eps = nfa.eps_off[n], edges = nfa.edge_off[n];
  for (int64_t k = 0; k < eps; ++k) ++in_off[nfa.eps[k] + 1];
  for (int64_t k = 0; k < edges; ++k) ++in_off[nfa.edges[3 * k + 2] + 1];
  for (int64_t q = 0; q < n; ++q) in_off[q + 1] += in_off[q];
  std::vector<int32_t> into(in_off[n]);
  std::vector<int64_t> fill(in_off.begin(), in_off.end() - 1);
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t k = nfa.eps_off[q]; k < nfa.eps_off[q + 1]; ++k) into[fill[nfa.eps[k]]++] = static_cast<int32_t>(q);
    for (int64_t k = nfa.edge_off[q]; k < nfa.edge_off[q + 1]; ++k)
      into[fill[nfa.edges[3 * k + 2]]++] = static_cast<int32_t>(q);
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> todo{nfa.final_state};
  live[nfa.final_state] = 1;
  while (!todo.empty()) {
    const int32_t q = todo.back();
    todo.pop_back();
    for (int64_t k = in_off[q]; k < in_off[q + 1]; ++k)
      if (!live[into[k]]) {
        live[into[k]] = 1;
        todo.push_back(into[k]);
      }
  }
  return live;
}

}  // namespace

LazyDfa::LazyDfa(const int32_t* ast, int64_t n, int64_t max_states, int64_t max_nfa_states, int64_t budget_ms,
                 int64_t max_bytes)
    : budget_(budget_ms, max_bytes) {
  nfa_ = build_nfa(ast, n, max_nfa_states, budget_);
  view_ = nfa_.view();
  live_ = reaching_final(view_);
  subsets_ = std::make_unique<SubsetConstruction>(view_, max_states, budget_, live_.data());
  if (subsets_->found() == 0) throw DfaError{"the constraint matches no string at all"};
  expanded_.assign(subsets_->found(), 0);
}

void LazyDfa::expand(int32_t s) {
  try {
    subsets_->expand(s);
  } catch (...) {
    // states found before the limit stopped the row exist: a later call may name them (s itself
    // stays unexpanded, its row built again in full next time)
    expanded_.resize(subsets_->found(), 0);
    throw;
  }
  expanded_.resize(subsets_->found(), 0);
  expanded_[s] = 1;
  ++expanded_count_;
}

void LazyDfa::mask_row(const Vocab& v, int32_t s, uint32_t* out) {
  restart();
  v.walk_mask([this](int32_t q, uint8_t b) { return next(q, b); }, s, out, walk_stack(v));
  add_end_of_sequence(v, accepting(s), out);
}

}  // namespace llmserve
