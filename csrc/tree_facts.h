// What build_nfa (dfa.h) would make of a serialised AST, found without making it. A frontend checks
// each new constraint before the engine (another process) builds its automaton; with these facts it
// leaves the NFA to the engine: whether the NFA fits the state limit, what memory it would take,
// whether the language is empty, and a shortest answer for the budget check.
#pragma once

#include <cstdint>
#include <string>

#include "dfa.h"

namespace llmserve {

struct TreeFacts {
  // build_nfa's states and moves (epsilon moves and byte edges), counted as it makes them; past
  // `cap` states the walk stops: states is then cap + 1 and the rest is unset
  int64_t states = 0, moves = 0;
  bool answers = false;  // the language has a string over the usable bytes
  std::string answer;    // one shortest such string (in bytes)
};

// One walk over the AST, linear in its words (a repetition's child is counted once and scaled),
// within `budget`'s time. Malformed input is refused as build_nfa refuses it (std::invalid_argument).
TreeFacts tree_facts(const int32_t* ast, int64_t n, const uint8_t usable[256], int64_t cap, Budget& budget);

}  // namespace llmserve
