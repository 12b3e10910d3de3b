// A byte DFA built as it is walked. The whole automaton of a JSON schema has thousands of states and
// its construction and minimisation are about half of a new constraint's compile time, while the
// start state's mask row reaches two or three of them: here each state of the subset construction is
// expanded the first time a walk leaves it, so a constraint costs its NFA and the states its
// answers actually pass through.
//
// States are numbered as found (start 0) and are not minimal: two of them may be equivalent, which
// only costs a mask row more. Every state reaches acceptance: the NFA states that cannot reach the
// final state never enter a subset, so a walk never enters a dead end and a mask never allows a
// token after which the answer cannot be completed (what minimize's trimming gives the whole
// automaton). Not thread-safe: one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dfa.h"
#include "vocab_trie.h"

namespace llmserve {

class LazyDfa {
 public:
  // ast: as for build_nfa. The NFA is built now, within budget_ms and max_nfa_states; states are
  // built as walks reach them, at most max_states of them, within max_bytes of memory in all (the
  // NFA included) and call_ms per call of mask_row or between restarts (<= 0: no limit; a DfaError
  // beyond). A language with no string is refused here.
  //
  // The lock its users share (bindings, Grammar::over_lazy) is a plain mutex: a process forked while
  // another thread held it must not use this automaton (build another from the same AST).
  LazyDfa(const int32_t* ast, int64_t n, int64_t max_states, int64_t max_nfa_states, int64_t budget_ms,
          int64_t max_bytes, int64_t call_ms);
  LazyDfa(const LazyDfa&) = delete;  // the construction points into the NFA
  LazyDfa& operator=(const LazyDfa&) = delete;

  // Counts the time budget again from now: before each walk a caller makes (mask_row does).
  void restart() { budget_.restart(call_ms_); }
  int32_t next(int32_t s, uint8_t byte) {
    if (!expanded_[s]) expand(s);
    const Dfa& d = subsets_->dfa();
    return d.table[static_cast<int64_t>(s) * d.letters + d.letter_of[byte]];
  }
  bool accepting(int32_t s) const { return subsets_->dfa().accept[s] != 0; }
  // states numbered so far; readable without the lock (a state below it exists)
  int64_t found() const { return found_.load(std::memory_order_acquire); }
  int64_t expanded() const { return expanded_count_; }  // states whose moves are built
  // a state could not be built within a limit (states, memory, or a call's time): a grammar over
  // this automaton ends the answers that reach it, so new answers need a new automaton; readable
  // without the lock
  bool exhausted() const { return exhausted_.load(std::memory_order_acquire); }
  // a state could not be built for the state or memory limit: no later call will build one either
  // (past a call's time alone, a later call, timed afresh, may)
  bool full() const { return full_.load(std::memory_order_acquire); }
  int64_t bytes() const { return budget_.used(); }  // memory charged: the NFA and the states built
  int32_t letters() const { return subsets_->dfa().letters; }
  int64_t max_states() const { return max_states_; }
  std::pair<int64_t, int64_t> nfa_size() const {  // states, moves (epsilon and byte)
    return {view_.n, view_.eps_off[view_.n] + view_.edge_off[view_.n]};
  }
  // The fewest bytes from s to acceptance over the bytes with usable[b] != 0 (INT32_MAX: none): the
  // whole automaton's byte_distances (vocab_trie.h) for this state, read off the NFA (one search
  // backwards from its final state per set of usable bytes) without building any state.
  int32_t byte_distance(int32_t s, const uint8_t* usable);
  // An upper bound of byte_distance(q, usable) over every state q this automaton can build whose
  // distance is finite (0: none is): the largest finite distance of a live NFA state. A state's
  // distance is the least of its members', so a state whose far members always come with a near one
  // ("[ab]*|a{50}": every state holds the loop, at distance 0) lies below it. Builds no state.
  int32_t max_byte_distance(const uint8_t* usable);
  // Grammar::budget_row over this automaton with dist[q] = steering_distance(q, usable): out = the
  // tokens whose bytes walk from s to a state that can end within k tokens by that figure, plus every
  // end-of-sequence id when s accepts. out: vocab.words() words.
  void budget_row(const Vocab& v, int32_t s, const uint8_t* usable, int32_t k, uint32_t* out);
  // The bytes of one shortest answer from s into out, at the cost of the states along it: over the
  // vocabulary's single-byte tokens where they reach acceptance, so that every byte starts a token,
  // else over any bytes. False: no answer.
  bool shortest_answer(const Vocab& v, int32_t s, std::vector<uint8_t>& out);
  // As greedy_tokens (vocab_trie.h) over this automaton: shortest_answer cut into the longest token
  // at each point, an upper bound of the fewest tokens. INT32_MAX: no answer; -1: the cut reached a
  // byte that starts no token.
  int32_t greedy_tokens(const Vocab& v, int32_t s);
  // Records an answer from s (answer[0 .. n), cut into the longest tokens) for steering: each state
  // where one of its tokens starts can end within the tokens left of it. Returns its tokens; -1 when
  // it is not an answer from s (nothing recorded).
  int32_t add_answer(const Vocab& v, int32_t s, const uint8_t* answer, int64_t n);
  // The figure steering reads: the least of byte_distance(s, usable) and the tokens left of an answer
  // recorded through s (add_answer). Both are achievable and each comes with a next token one nearer
  // (a usable byte; the recorded answer's next token), so steering by their least never strands an
  // answer that met it.
  int32_t steering_distance(int32_t s, const uint8_t* usable);
  // max_byte_distance(usable), or the most tokens of a recorded answer when that is more: an upper
  // bound of every finite steering_distance. INT32_MAX - 1 when a live NFA state cannot end over the
  // usable bytes (some single bytes are not tokens): a state a walk reaches may have no finite
  // figure, so a row must be steered at every step, never left to walk there.
  int32_t max_steering_distance(const uint8_t* usable);
  // The mask row of state s, as Grammar computes a row: the tokens whose bytes walk from s, plus end
  // of sequence where the rule in grammar.h allows it. out: vocab.words() words.
  void mask_row(const Vocab& v, int32_t s, uint32_t* out);
  // Per text, whether its bytes occur somewhere inside an answer (a factor of a string of the language:
  // what a stop string or stop token must not be, or it would cut an answer short): 1 yes, 0 no, -1 not
  // decided within max_steps NFA moves read in all (a bound on what hostile texts cost). Read off the NFA
  // (every state an answer passes through, stepped over the text's bytes): builds no state. The first
  // bytes of all the texts are stepped in one pass over the NFA's moves; texts with one first byte share its
  // closed set, built when they are read and let go after them; the rest text by text.
  std::vector<int8_t> occurs(const std::vector<std::string>& texts, int64_t max_steps);

 private:
  void expand(int32_t s);

  Nfa nfa_;
  NfaView view_;
  // the NFA's moves reversed, in compressed rows: move k in [in_off_[q], in_off_[q + 1]) enters q
  // from in_from_[k], on bytes in_lo_[k] .. in_hi_[k] (in_lo_ -1: an epsilon move)
  std::vector<int64_t> in_off_;
  std::vector<int32_t> in_from_;
  std::vector<int16_t> in_lo_, in_hi_;
  // per NFA state, the fewest bytes to the final state over the usable bytes (INT32_MAX: none)
  std::vector<int32_t> nfa_distances(const uint8_t* usable) const;
  std::vector<uint8_t> live_;  // per NFA state: the final state is reachable from it
  // per NFA state: live and reachable from the start (an answer can pass through it); built by the
  // first occurs() (a byte a state, not charged to the memory budget, as state_dist_)
  std::vector<uint8_t> useful_;
  void find_useful();
  std::vector<int32_t> dist_;  // nfa_distances(dist_usable_), kept for byte_distance and budget_row
  uint8_t dist_usable_[256] = {};
  // per state found, its byte_distance over dist_usable_ (kUnknown: not read yet): a budget row asks
  // for the end state of every trie node where tokens end (~100k at a 128k vocabulary), mostly the
  // same few states, and a state's members never change once it is found (4 bytes a state beside
  // its row of letters() entries: not counted against max_bytes)
  static constexpr int32_t kUnknown = -1;
  std::vector<int32_t> state_dist_;
  void use_usable(const uint8_t* usable);  // dist_ and state_dist_ for this set of usable bytes
  int32_t state_distance(int32_t s);
  // per state found, the fewest tokens left of an answer recorded through it (add_answer; INT32_MAX:
  // none), sized as states are found (4 bytes a state, as state_dist_); and the most of them
  std::vector<int32_t> recorded_;
  int32_t recorded_most_ = 0;
  int32_t recorded(int32_t s) const {
    return static_cast<size_t>(s) < recorded_.size() ? recorded_[s] : INT32_MAX;
  }
  Budget budget_;              // the NFA's, then restarted per call: states are built long after
  std::unique_ptr<SubsetConstruction> subsets_;
  std::vector<uint8_t> expanded_;
  int64_t expanded_count_ = 0;
  int64_t max_states_, call_ms_;
  std::atomic<int64_t> found_{0};
  std::atomic<bool> exhausted_{false}, full_{false};
};

}  // namespace llmserve
