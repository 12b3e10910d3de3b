// Byte-level DFA construction for the constraint core: subset construction over a Thompson NFA,
// trimming of dead ends and minimisation, with states numbered canonically (breadth-first from the
// start state, bytes in increasing order). Python's reference (llmserve/constraints/regex.py) gives
// the same table for the same NFA; tests compare them.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace llmserve {

// Rows are over letters, not bytes: bytes that every transition treats alike share a letter
// (letter_of), so a row holds `letters` entries (at most 256) and expand() gives the byte table.
struct Dfa {
  std::vector<int32_t> table;  // [S * letters], -1 dead
  std::vector<uint8_t> accept;  // [S]
  int32_t letters = 0;
  uint8_t letter_of[256] = {};  // byte -> letter
  int64_t states() const { return static_cast<int64_t>(accept.size()); }
  void expand(int32_t* out) const;  // the byte table, [S * 256]
};

// NFA in compressed rows: state q has epsilon targets eps[eps_off[q] .. eps_off[q+1]) and byte-range
// edges edges[3k .. 3k+2] = (lo, hi, target) for k in [edge_off[q], edge_off[q+1]).
struct NfaView {
  int64_t n = 0;
  const int64_t* eps_off = nullptr;
  const int32_t* eps = nullptr;
  const int64_t* edge_off = nullptr;
  const int32_t* edges = nullptr;
  int32_t start = 0;
  int32_t final_state = 0;
};

// A Thompson NFA that owns its arrays (see NfaView).
struct Nfa {
  int64_t states = 0;
  std::vector<std::pair<int32_t, int32_t>> eps_list;  // (from, to), in the order added
  std::vector<std::array<int32_t, 4>> edge_list;      // (from, lo, hi, to), in the order added
  std::vector<int64_t> eps_off, edge_off;
  std::vector<int32_t> eps_flat, edges_flat;
  int32_t start = 0, final_state = 0;
  NfaView view();  // compresses the rows (and drops the lists); call once, after building
};

// Build the NFA of a regular-expression AST over code points, serialised in prefix order as int32:
//   set: 0, n, lo_1, hi_1, ..., lo_n, hi_n  (inclusive code-point ranges, sorted and merged)
//   cat: 1, n, child_1 ... child_n          alt: 2, n, child_1 ... child_n
//   rep: 3, lo, hi (-1: unbounded), child
//   dfa: 4, S, start, accept_1 ... accept_S, then per state: n, (lo, hi, target) x n  (byte ranges,
//        no UTF-8 step: an automaton over bytes built elsewhere, e.g. an intersection, used as it is)
//   members: 5, n, at_least_one, then per member: required, child  (comma-separated, in order, each
//        optional unless required: a JSON object's properties, each built once)
//   list: 6, lo, hi (-1: unbounded), child  (child lo..hi times, comma-separated: a JSON array)
// Code-point ranges become UTF-8 byte-range sequences (surrogates excluded), so the automaton runs
// over bytes. Mirrors the Python reference (regex.py) state for state.
// Thrown with a message fit for the user (too many states, empty language, a budget exceeded).
struct DfaError {
  std::string message;
};

// What one construction may cost: wall-clock time and memory. A request's constraint is compiled
// while the client waits and while other requests share the machine, so every loop below that can
// grow with the input polls it (cheaply: the clock is read once per 256 polls) and gives up with a
// DfaError naming the limit instead of running for minutes or exhausting memory.
class Budget {
 public:
  // ms <= 0: no time limit; max_bytes <= 0: no memory limit
  Budget(int64_t ms, int64_t max_bytes);
  void poll() {
    if (ms_ > 0 && (++polls_ & 255) == 0) check_time();
  }
  void charge(int64_t bytes) {
    used_ += bytes;
    if (max_bytes_ > 0 && used_ > max_bytes_) fail_memory();
  }
  void check_time();
  int64_t used() const { return used_; }  // bytes charged so far
  // the time limit, ms (<= 0: none), counted again from now (memory stays charged): for work done
  // call by call
  void restart(int64_t ms);

 private:
  [[noreturn]] void fail_memory() const;
  int64_t ms_, max_bytes_, used_ = 0;
  uint64_t polls_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

// UTF-8 byte-range sequences whose concatenations are exactly the encodings of the code points
// [lo, hi] (surrogates excluded), appended to `out`.
void utf8_sequences(int32_t lo, int32_t hi, std::vector<std::vector<std::pair<int, int>>>& out);

// Nesting of the AST, bounded because the builder recurses: deeper input would overflow the stack.
constexpr int kMaxAstDepth = 2000;

Nfa build_nfa(const int32_t* ast, int64_t n, int64_t max_nfa_states, Budget& budget);
// Subset construction over the NFA's byte classes (the intervals between its edges' bounds, which
// are contiguous and in byte order): letters are those classes. States are found as rows are
// expanded, in any order: determinize() expands every one in turn; a lazy automaton (lazy_dfa.h)
// expands a state when a walk first leaves it. With `live` ([nfa.n], kept by the caller), NFA states
// it leaves out never enter a subset, and a move to an empty subset is dead (-1): when `live` marks
// the states that reach the final one, every state found reaches acceptance. Without it, a subset
// may be dead end (minimize trims those).
class SubsetConstruction {
 public:
  SubsetConstruction(const NfaView& nfa, int64_t max_states, Budget& budget, const uint8_t* live = nullptr);
  ~SubsetConstruction();
  SubsetConstruction(const SubsetConstruction&) = delete;
  SubsetConstruction& operator=(const SubsetConstruction&) = delete;
  // every state found so far (accept), rows of -1 until expanded (table); no state when the start's
  // subset is empty
  const Dfa& dfa() const;
  Dfa take();
  int64_t found() const;
  void expand(int32_t state);  // once per state
  // the NFA states that make a state's identity: those of its subset with byte edges, and the final
  // state if it is one
  std::pair<const int32_t*, const int32_t*> members(int32_t state) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
Dfa determinize(const NfaView& nfa, int64_t max_states, Budget& budget);
// Trim states that cannot reach acceptance, merge equivalent states, renumber canonically (start 0).
// The input's letters must be contiguous byte intervals in increasing order (as determinize gives);
// the output's letters are the input's classes of identical columns.
Dfa minimize(const Dfa& raw, Budget& budget);

// One input of intersect(): a byte table [states * 256] (-1: dead), its accept flags, its start.
struct ByteTableView {
  const int32_t* table = nullptr;
  const uint8_t* accept = nullptr;
  int64_t states = 0;
  int32_t start = 0;
};
// The automaton of the strings every input accepts, minimal: the product of the inputs (the tuples of
// their states reachable from the starts, over the byte intervals where no input's row changes),
// then minimize(). DfaError past max_product_states tuples, past the budget, or when no string is
// accepted by all. JSON Schema puts several conditions on one value (pattern, format, length).
Dfa intersect(const std::vector<ByteTableView>& inputs, int64_t max_product_states, Budget& budget);

}  // namespace llmserve
