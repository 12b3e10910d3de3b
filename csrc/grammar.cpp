#include "grammar.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "lazy_dfa.h"
#include "thread_pool.h"

namespace llmserve {

namespace {
int32_t* stack_for(const Vocab& v) {
  thread_local std::vector<int32_t> st;
  if (st.size() < static_cast<size_t>(v.max_len() + 2)) st.resize(v.max_len() + 2);
  return st.data();
}

void state_row(const Vocab& v, const Transitions& tr, const uint8_t* accept, int64_t S, int64_t s, uint32_t* m) {
  const int64_t W = v.words();
  if (s == S) {  // the dead row: end of sequence only
    std::memset(m, 0, W * sizeof(uint32_t));
  } else {
    v.state_mask(tr, static_cast<int32_t>(s), m, stack_for(v));
    add_end_of_sequence(v, accept[s] != 0, m);
    return;
  }
  for (int32_t e : v.eos()) m[e >> 5] |= 1u << (e & 31);
}
}  // namespace

int32_t* walk_stack(const Vocab& v) { return stack_for(v); }

void add_end_of_sequence(const Vocab& v, bool accepting, uint32_t* row) {
  bool any = false;
  for (int64_t w = 0; w < v.words() && !any; ++w) any = row[w] != 0;
  if (accepting || !any)
    for (int32_t e : v.eos()) row[e >> 5] |= 1u << (e & 31);
}

void compile_masks(const Vocab& v, const int32_t* table, const uint8_t* accept, int64_t S, uint32_t* out,
                   int nthreads) {
  ThreadPool::global().parallel_for(
      S + 1, [&, tr = Transitions::dense(table)](int64_t s) { state_row(v, tr, accept, S, s, out + s * v.words()); },
      nthreads);
}

void Grammar::init(bool ready) {
  status.reset(new std::atomic<uint8_t>[S + 1]);
  for (int64_t r = 0; r <= S; ++r) status[r].store(ready ? 2 : 0, std::memory_order_relaxed);
  ready_count.store(ready ? S + 1 : 0, std::memory_order_relaxed);
  if (!ready) ensure(S);
}

Grammar::~Grammar() {
  if (blocks)
    for (int64_t b = 0; b <= S / kRowBlock; ++b) delete[] blocks[b].load(std::memory_order_relaxed);
}

std::shared_ptr<Grammar> Grammar::over_lazy(std::shared_ptr<Vocab> v, std::shared_ptr<LazyDfa> lazy,
                                            std::shared_ptr<std::mutex> lock, int64_t max_states) {
  auto g = std::make_shared<Grammar>();
  g->vocab = std::move(v);
  g->lazy = std::move(lazy);
  g->lazy_lock = std::move(lock);
  g->S = max_states;
  g->start = 0;
  g->blocks.reset(new std::atomic<uint32_t*>[max_states / kRowBlock + 1]);
  for (int64_t b = 0; b <= max_states / kRowBlock; ++b) g->blocks[b].store(nullptr, std::memory_order_relaxed);
  g->init(false);
  return g;
}

uint32_t* Grammar::row_ptr(int64_t r) const {
  const int64_t W = vocab->words();
  if (!lazy) return masks + r * W;
  std::atomic<uint32_t*>& slot = blocks[r / kRowBlock];
  uint32_t* block = slot.load(std::memory_order_acquire);
  if (block == nullptr) {
    // uninitialised: a row is written whole before it is marked ready (the pages of rows never
    // computed are never touched)
    auto* fresh = new uint32_t[kRowBlock * W];
    if (slot.compare_exchange_strong(block, fresh, std::memory_order_acq_rel)) {
      block = fresh;
    } else {
      delete[] fresh;  // another thread's block is in place: `block` holds it
    }
  }
  return block + (r % kRowBlock) * W;
}

int64_t Grammar::states() const { return lazy ? lazy->found() : S; }

void Grammar::compute(int64_t r) const {
  uint32_t* out = row_ptr(r);
  if (!lazy || r == S) {
    state_row(*vocab, tr, accept, S, r, out);  // (the dead row reads no automaton)
    return;
  }
  std::lock_guard<std::mutex> hold(*lazy_lock);
  try {
    lazy->mask_row(*vocab, static_cast<int32_t>(r), out);
  } catch (const DfaError&) {  // past the automaton's limits: the answer ends here
    state_row(*vocab, tr, accept, S, S, out);
  }
}

void Grammar::ensure(int64_t r) const {
  std::atomic<uint8_t>& st = status[r];
  uint8_t seen = st.load(std::memory_order_acquire);
  if (seen == 2) return;
  // A row being computed is marked with the process generation of the thread computing it (an odd
  // number: 2 is ready). A mark of another generation was left by a thread of the process this one
  // was forked from, which does not exist here: the row is taken over instead of waited for forever.
  const uint8_t mine = static_cast<uint8_t>(1 + 2 * (fork_generation() % 127));
  for (;;) {
    if (seen == 2) return;
    if (seen != mine) {  // missing (0), or left mid-way by a thread that is not in this process
      if (st.compare_exchange_weak(seen, mine, std::memory_order_acq_rel)) {
        try {
          compute(r);
        } catch (...) {  // (an allocation failure) the row is missing again, not claimed forever
          st.store(0, std::memory_order_release);
          throw;
        }
        st.store(2, std::memory_order_release);
        ready_count.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      continue;  // `seen` holds the status now
    }
    std::this_thread::yield();  // another thread of this process computes it
    seen = st.load(std::memory_order_acquire);
  }
}

void Grammar::complete(int nthreads) const {
  if (lazy) throw std::invalid_argument("a grammar over a lazy automaton has no complete set of rows");
  if (nthreads == 1) {
    for (int64_t r = 0; r <= S; ++r) ensure(r);
    return;
  }
  ThreadPool::global().parallel_for(S + 1, [&](int64_t r) { ensure(r); }, nthreads);
}

int64_t Grammar::ready_rows() const { return ready_count.load(std::memory_order_relaxed); }

void Grammar::row_words(int64_t r, int64_t w0, int64_t w1, uint32_t* out) const {
  if (compact) {
    rows.expand(r, w0, w1, out);
  } else {
    std::memcpy(out, row_ptr(r) + w0, (w1 - w0) * sizeof(uint32_t));
  }
}

void CompactRows::expand_row(int64_t r, int64_t w0, int64_t w1, uint32_t* out) const {
  expand_span(kind[r], data + off[r], off[r + 1] - off[r], w0, w1, out);
}

void CompactRows::expand_span(uint8_t how, const uint32_t* d, int64_t n, int64_t w0, int64_t w1, uint32_t* out) const {
  const int64_t len = w1 - w0;
  switch (how) {
    case kWords: {
      const int64_t nb = (W + 31) / 32;
      const uint32_t* bm = d;
      const int64_t p = d[nb];
      const uint32_t* idx = d + nb + 1;
      const uint32_t* words = idx + p;
      // 32 words per bitmap word: whole runs of refused or allowed words are one memset
      for (int64_t w = w0; w < w1;) {
        const uint32_t b = bm[w >> 5];
        if ((w & 31) == 0 && w + 32 <= w1 && (b == 0 || b == ~0u)) {
          std::memset(out + (w - w0), b ? 0xFF : 0, 32 * sizeof(uint32_t));
          w += 32;
          continue;
        }
        // the rest of this bitmap word's block, branch-free
        const int64_t end = std::min(w1, (w | 31) + 1);
        for (uint32_t bits = b >> (w & 31); w < end; ++w, bits >>= 1) out[w - w0] = 0u - (bits & 1u);
      }
      for (const uint32_t* k = std::lower_bound(idx, idx + p, static_cast<uint32_t>(w0)); k < idx + p && *k < w1; ++k)
        out[*k - w0] = words[k - idx];
      break;
    }
    case kDense:
      std::memcpy(out, d + w0, len * sizeof(uint32_t));
      break;
    case kAllowed:
    case kRefused: {
      const bool allowed = how == kAllowed;
      std::memset(out, allowed ? 0 : 0xFF, len * sizeof(uint32_t));
      const uint32_t lo = static_cast<uint32_t>(w0 * 32), hi = static_cast<uint32_t>(w1 * 32);
      // a word's bits gathered in a register and written once: ids of one word are adjacent, and a
      // read-modify-write per id would chain each store into the next load
      uint32_t cur = ~0u, acc = 0;
      for (const uint32_t* k = std::lower_bound(d, d + n, lo); k < d + n && *k < hi; ++k) {
        const uint32_t w = *k >> 5;
        if (w != cur) {
          if (cur != ~0u) out[cur - w0] = allowed ? acc : ~acc;
          cur = w;
          acc = 0;
        }
        acc |= 1u << (*k & 31);
      }
      if (cur != ~0u) out[cur - w0] = allowed ? acc : ~acc;
      break;
    }
    case kDelta: {
      expand_row(d[0], w0, w1, out);  // a base is never a delta row (check): one level
      const int64_t p = d[1];
      const uint32_t* idx = d + 2;
      const uint32_t* words = idx + p;
      for (const uint32_t* k = std::lower_bound(idx, idx + p, static_cast<uint32_t>(w0)); k < idx + p && *k < w1; ++k)
        out[*k - w0] = words[k - idx];
      break;
    }
    case kShared: {
      const Shared& row = shared[d[0]];
      expand_span(row.kind, row.data, row.n, w0, w1, out);  // never shared again (check): one level
      break;
    }
  }
}

void CompactRows::check(int64_t rows, int64_t ndata) const {
  auto fail = [](const std::string& why) { throw std::invalid_argument("compressed mask rows: " + why); };
  if (W <= 0 || W >= (int64_t(1) << 26)) fail("bad row width");
  for (int64_t s = 0; s < rows; ++s)
    if (row_of[s] < 0 || row_of[s] >= R) fail("row index out of range");
  if (R > 0 && off[0] != 0) fail("offsets must start at 0");
  if (off[R] != ndata) fail("offsets must end at the data's length");
  for (int64_t i = 0; i < n_shared; ++i) {
    if (shared[i].kind != kWords && shared[i].kind != kDense) fail("a shared row's kind");
    check_span(shared[i].kind, shared[i].data, shared[i].n, -1);
  }
  for (int64_t r = 0; r < R; ++r) {
    if (off[r + 1] < off[r]) fail("offsets must not decrease");
    // an offset past the data that a later one brings back down would pass the two checks above
    if (off[r + 1] > ndata) fail("offsets past the data");
    check_span(kind[r], data + off[r], off[r + 1] - off[r], r);
  }
}

// row r's kind and words (r = -1: a shared row, which names no other row)
void CompactRows::check_span(uint8_t how, const uint32_t* d, int64_t n, int64_t r) const {
  auto fail = [](const std::string& why) { throw std::invalid_argument("compressed mask rows: " + why); };
  const int64_t nb = (W + 31) / 32;
  const uint32_t ids = static_cast<uint32_t>(W * 32);
  if (how == kWords) {
    if (n < nb + 1 || n != nb + 1 + 2 * static_cast<int64_t>(d[nb])) fail("a word row's length");
    const int64_t p = d[nb];
    for (int64_t i = 0; i < p; ++i)
      if (d[nb + 1 + i] >= W || (i > 0 && d[nb + 1 + i] <= d[nb + i])) fail("word indices");
    if (W % 32 && (d[nb - 1] >> (W % 32))) fail("bitmap past the row");
  } else if (how == kDense) {
    if (n != W) fail("a dense row's length");
  } else if (how == kAllowed || how == kRefused) {
    for (int64_t i = 0; i < n; ++i)
      if (d[i] >= ids || (i > 0 && d[i] <= d[i - 1])) fail("token ids");
  } else if (how == kDelta && r >= 0) {
    // the base an earlier row of another kind: expansion is one level deep and never cycles
    if (n < 2 || n != 2 + 2 * static_cast<int64_t>(d[1])) fail("a delta row's length");
    if (d[0] >= r || kind[d[0]] == kDelta) fail("a delta row's base");
    const int64_t p = d[1];
    for (int64_t i = 0; i < p; ++i)
      if (d[2 + i] >= W || (i > 0 && d[2 + i] <= d[1 + i])) fail("word indices");
  } else if (how == kShared && r >= 0) {
    if (n != 1 || d[0] >= n_shared) fail("a shared row's index");
  } else {
    fail("unknown row kind");
  }
}

namespace {
// row s's W words: where they stay until the end (a table's row), or written into `scratch`
// (overwritten by the next call)
using RowSource = std::function<const uint32_t*(int64_t s, uint32_t* scratch)>;

uint64_t row_hash(const uint32_t* m, int64_t W) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int64_t w = 0; w < W; ++w) h = (h ^ m[w]) * 0x100000001B3ull + (h >> 29);
  return h;
}

// The large rows a later row may be stored as a delta of, and the search for the nearest: each row
// hashed per block of words, so that a candidate base is compared word by word only where its
// blocks differ (rows of 3,000 words, hundreds of them in a schema with free values).
class DeltaBases {
 public:
  static constexpr int64_t kMinSize = 256;  // words stored: smaller rows are not worth a search
  static constexpr int64_t kBlock = 64;
  static constexpr size_t kMaxBases = 512;  // bounds a row's search at 512 bases' block hashes

  explicit DeltaBases(int64_t W) : W_(W), blocks_((W + kBlock - 1) / kBlock) {}

  // distinct row `row`, words `m`: `stable` where they stay put until the end, else copied
  void add(int32_t row, const uint32_t* m, bool stable) {
    if (rows_.size() >= kMaxBases) return;
    if (!stable) {
      copies_.emplace_back(m, m + W_);
      m = copies_.back().data();
    }
    rows_.push_back({row, m});
    const std::vector<uint64_t> h = hashes(m);
    hashes_.insert(hashes_.end(), h.begin(), h.end());
  }

  // [base, p, p word indices, p words] for the base that differs from row `m` in the fewest words,
  // if that delta stores at most `budget` words; else empty
  std::vector<uint32_t> nearest(const uint32_t* m, int64_t budget) const {
    if (rows_.empty() || budget < 4) return {};
    const std::vector<uint64_t> h = hashes(m);
    const int64_t max_words = (budget - 2) / 2;  // differing words a delta within budget may hold
    int64_t best = max_words + 1;
    size_t best_base = rows_.size();
    for (size_t b = 0; b < rows_.size(); ++b) {
      const uint64_t* hb = hashes_.data() + b * blocks_;
      const uint32_t* base = rows_[b].words;
      int64_t blocks = 0;  // each differing block differs in at least one word
      for (int64_t k = 0; k < blocks_ && blocks < best; ++k) blocks += h[k] != hb[k];
      if (blocks >= best) continue;
      int64_t words = 0;
      for (int64_t k = 0; k < blocks_ && words < best; ++k) {
        if (h[k] == hb[k]) continue;  // a hash collision only makes the delta miss a smaller one
        for (int64_t w = k * kBlock, e = std::min(W_, w + kBlock); w < e; ++w) words += m[w] != base[w];
      }
      if (words < best) best = words, best_base = b;
    }
    if (best_base == rows_.size()) return {};
    const uint32_t* base = rows_[best_base].words;
    std::vector<uint32_t> idx, words;
    for (int64_t w = 0; w < W_; ++w)
      if (m[w] != base[w]) idx.push_back(static_cast<uint32_t>(w)), words.push_back(m[w]);
    // the hashes skipped equal-hash blocks: the exact count may exceed what was estimated
    if (2 + 2 * static_cast<int64_t>(idx.size()) > budget) return {};
    std::vector<uint32_t> out{static_cast<uint32_t>(rows_[best_base].row), static_cast<uint32_t>(idx.size())};
    out.insert(out.end(), idx.begin(), idx.end());
    out.insert(out.end(), words.begin(), words.end());
    return out;
  }

 private:
  struct Base {
    int32_t row;            // distinct row index
    const uint32_t* words;  // its words: in the caller's table, or in copies_
  };
  std::vector<uint64_t> hashes(const uint32_t* m) const {
    std::vector<uint64_t> h(blocks_);
    for (int64_t k = 0; k < blocks_; ++k) h[k] = row_hash(m + k * kBlock, std::min(W_, (k + 1) * kBlock) - k * kBlock);
    return h;
  }
  int64_t W_, blocks_;
  std::vector<Base> rows_;
  std::deque<std::vector<uint32_t>> copies_;  // a deque: adding a copy moves none of the others
  std::vector<uint64_t> hashes_;              // [bases, blocks]
};

// Row `m` (W words) as distinct row r of `out`, in its smallest form (or as a delta of a base).
void store_row(const uint32_t* m, bool stable, int64_t W, DeltaBases& bases, CompactArrays& out) {
  const int64_t nb = (W + 31) / 32;
  const auto r = static_cast<int32_t>(out.kind.size());
  int64_t allowed = 0, partial = 0;
  for (int64_t w = 0; w < W; ++w) {
    allowed += __builtin_popcount(m[w]);
    partial += m[w] != 0 && m[w] != ~0u;
  }
  const int64_t as_words = nb + 1 + 2 * partial, as_allowed = allowed, as_refused = 32 * W - allowed;
  const size_t at = out.data.size();
  // the stored size of the form chosen below, without a delta
  const int64_t size = std::min({as_allowed, as_refused, W, as_words});
  if (size >= DeltaBases::kMinSize) {
    const std::vector<uint32_t> diff = bases.nearest(m, size / 4);
    if (!diff.empty()) {
      out.kind.push_back(CompactRows::kDelta);
      out.data.insert(out.data.end(), diff.begin(), diff.end());
      out.off.push_back(static_cast<int64_t>(out.data.size()));
      return;
    }
    bases.add(r, m, stable);
  }
  // ids cost a fill about twice what their words cost (a write per word they touch, words in
  // between cleared or set), so they are taken only at half the size of the alternatives; word
  // rows expand a word at a time where a bitmap word is mixed, so they are taken over plain words
  // only at a quarter of their size (rows of few partial words among long runs)
  const int64_t other = std::min(as_words, W);
  const bool words_pay = 4 * as_words <= W;
  if (2 * as_allowed < other && as_allowed <= as_refused) {
    out.kind.push_back(CompactRows::kAllowed);
    for (int64_t w = 0; w < W; ++w)
      for (uint32_t b = m[w]; b; b &= b - 1) out.data.push_back(static_cast<uint32_t>(w * 32 + __builtin_ctz(b)));
  } else if (2 * as_refused < other) {
    out.kind.push_back(CompactRows::kRefused);
    for (int64_t w = 0; w < W; ++w)
      for (uint32_t b = ~m[w]; b; b &= b - 1) out.data.push_back(static_cast<uint32_t>(w * 32 + __builtin_ctz(b)));
  } else if (!words_pay) {
    out.kind.push_back(CompactRows::kDense);
    out.data.insert(out.data.end(), m, m + W);
  } else {
    out.kind.push_back(CompactRows::kWords);
    out.data.resize(at + as_words, 0);
    uint32_t* d = out.data.data() + at;
    d[nb] = static_cast<uint32_t>(partial);
    int64_t k = 0;
    for (int64_t w = 0; w < W; ++w) {
      if (m[w] == ~0u) d[w >> 5] |= 1u << (w & 31);
      if (m[w] != 0 && m[w] != ~0u) {
        d[nb + 1 + k] = static_cast<uint32_t>(w);
        d[nb + 1 + partial + k] = m[w];
        ++k;
      }
    }
  }
  out.off.push_back(static_cast<int64_t>(out.data.size()));
}

int64_t compact_bytes(const CompactArrays& a) {
  // capacities, not sizes: what the vectors hold while they grow (up to twice their contents)
  return static_cast<int64_t>(a.row_of.capacity() * sizeof(int32_t) + a.off.capacity() * sizeof(int64_t) +
                              a.kind.capacity() + a.data.capacity() * sizeof(uint32_t));
}

// compact_rows over rows given in order; `hashes` (nullable) the rows' row_hash, computed beforehand
bool compact_in_order(int64_t rows, int64_t W, const RowSource& row, const uint64_t* hashes, int64_t max_bytes,
                      CompactArrays& out) {
  out = CompactArrays{};
  out.row_of.reserve(rows);
  out.off.push_back(0);
  // per distinct row, its words where they stay put (null: compared by expanding the stored row)
  std::vector<const uint32_t*> words;
  std::unordered_map<uint64_t, std::vector<int32_t>> seen;
  DeltaBases bases(W);
  std::vector<uint32_t> scratch(W), expanded(W);
  for (int64_t s = 0; s < rows; ++s) {
    const uint32_t* m = row(s, scratch.data());
    const bool stable = m != scratch.data();
    auto& same = seen[hashes != nullptr ? hashes[s] : row_hash(m, W)];
    int32_t found = -1;
    for (int32_t r : same) {
      const uint32_t* known = words[r];
      if (known == nullptr) {
        const CompactRows view{nullptr, out.off.data(), out.kind.data(), out.data.data(), 0, W};
        view.expand_row(r, 0, W, expanded.data());
        known = expanded.data();
      }
      if (std::memcmp(known, m, W * sizeof(uint32_t)) == 0) {
        found = r;
        break;
      }
    }
    if (found < 0) {
      found = static_cast<int32_t>(words.size());
      words.push_back(stable ? m : nullptr);
      same.push_back(found);
      store_row(m, stable, W, bases, out);
    }
    out.row_of.push_back(found);
    // checked as rows are added, so a form over the cap costs no more than the cap to find out
    if (compact_bytes(out) > max_bytes) return false;
  }
  // what the form keeps is its contents, not the vectors' growth room (the caller hands them on)
  out.off.shrink_to_fit();
  out.kind.shrink_to_fit();
  out.data.shrink_to_fit();
  return true;
}
}  // namespace

CompactArrays compact_rows(const uint32_t* masks, int64_t rows, int64_t W, int nthreads) {
  std::vector<uint64_t> hash(rows);
  ThreadPool::global().parallel_for(rows, [&](int64_t s) { hash[s] = row_hash(masks + s * W, W); }, nthreads);
  CompactArrays out;
  compact_in_order(
      rows, W, [&](int64_t s, uint32_t*) { return masks + s * W; }, hash.data(), INT64_MAX, out);
  return out;
}

bool Grammar::compact_all(int64_t max_bytes, CompactArrays& out) const {
  if (lazy) throw std::invalid_argument("a grammar over a lazy automaton has no complete set of rows");
  if (compact) throw std::invalid_argument("compact_all: the grammar is compressed already");
  return compact_in_order(
      S + 1, vocab->words(),
      [&](int64_t r, uint32_t* scratch) -> const uint32_t* {
        if (ready(r)) return row_ptr(r);  // a ready row is never written again
        state_row(*vocab, tr, accept, S, r, scratch);
        return scratch;
      },
      nullptr, max_bytes, out);
}

int32_t Grammar::step(int32_t state, int64_t token) const {
  if (state < 0) return -1;
  if (token < 0 || token >= vocab->size()) return -1;
  const int64_t n = vocab->len(token);
  const uint8_t* p = vocab->ptr(token);
  if (lazy) {
    std::lock_guard<std::mutex> hold(*lazy_lock);
    if (vocab->is_eos(token)) return lazy->accepting(state) ? state : -1;
    if (n == 0) return -1;
    try {
      lazy->restart();
      for (int64_t i = 0; i < n && state >= 0; ++i) state = lazy->next(state, p[i]);
    } catch (const DfaError&) {  // past the automaton's limits: the answer ends here
      return -1;
    }
    return state;
  }
  if (vocab->is_eos(token)) return accept[state] ? state : -1;
  if (n == 0) return -1;
  for (int64_t i = 0; i < n && state >= 0; ++i) state = tr.next(state, p[i]);
  return state;
}

}  // namespace llmserve
