"""A constraint served from its automaton built as it is walked, while its complete form is built.

A new constraint's complete form (``compiled.py``) needs the whole automaton first: its subset
construction and minimisation are about half of a new JSON schema's compile time, while the first
mask row reaches two or three of its thousands of states (``benchmarks/constraints``, "An automaton
built as it is walked"). ``LazyConstraint`` serves batch rows from the NFA and the states walks
reach (``csrc/lazy_dfa.h``, through ``_core.Grammar.over_lazy``), so a new constraint costs its
conversion (and the frontend's check of its tree) and its NFA on the request path;
``compiler.serving_form`` builds the complete form in the
background and serves later requests from it (rows already served from this form stay on it: its
states are numbered as found, not as the complete form's).

Steering towards an answer that ends within max_tokens uses the single-byte figure (the fewest bytes
to an accepting state, read off the NFA): an achievable upper bound on the fewest tokens, so steering
by it keeps the answer finishable, only earlier than the exact figure would. Where a request's budget
is below that figure, one shortest answer cut into the longest tokens is recorded in the automaton
(``add_answer``: each state along it can end within the tokens left of it), and steering reads the
least of the two figures, which keeps the answer finishable too (``budget.steerable_from``). A
request that neither fits is served from the complete form, with exact distances
(``steerable_within``, ``compiler.serving_form``).

Limits: an automaton's states are shared by every answer served from it, and built within the
compile limits (states, memory, and the time of each call that builds some). A state that cannot
be built ends the answers that reach it (the grammar's dead row: end of sequence only), and the
automaton is retired for new requests (``LazyDfa.exhausted``; ``compiler.serving_form`` builds
another). Constraints that meet these limits in practice are those whose whole automaton is over
the time budget too, and those are checked whole once the background build has shown it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints.budget import steerable_from
from llmserve.constraints.native import native as core
from llmserve.constraints.native import native_vocab, require_native
from llmserve.constraints.vocab import Vocab


class LazyConstraint:
    """A constraint over ``vocab`` served from ``lazy`` (a ``_core.LazyDfa``, start state 0): what
    the batch processor reads of a compiled form (``native``, ``start``, ``max_distance``,
    ``budget_row``), and what the memory cache counts (``nbytes``). ``key``: the compiled form's
    cache key. A process forked from this one builds its own (``pid``): the automaton's lock may
    have been held by another thread at the fork."""

    # Budget rows kept (each is one mask row: 16 KB at a 128k vocabulary), as the complete form keeps.
    BUDGET_ROWS_KEPT = 32

    def __init__(self, vocab: Vocab, lazy: core.LazyDfa, key: str = ""):
        require_native()
        self.vocab = vocab
        self.lazy = lazy
        self.key = key
        self.start = 0
        self.pid = os.getpid()
        self.native = core.Grammar.over_lazy(native_vocab(vocab), lazy)
        self._usable = vocab.single_bytes.view(np.uint8)  # the bytes single tokens are, as flags
        self._max_distance: int | None = None
        self._budget_rows: dict[tuple[int, int], NDArray[np.uint32] | None] = {}

    @property
    def nbytes(self) -> int:
        """What this form holds now: its automaton as charged to its memory budget (the NFA and the
        states built), the mask rows computed, and the grammar's per-row status and block index,
        sized by the automaton's state limit, and the budget rows kept. (Row blocks are allocated 64
        rows at a time but their pages are backed only as rows are written.)"""
        limit = int(self.native.num_states) + 1
        status = limit + (limit // 64 + 1) * 8
        rows = int(self.native.ready_rows) + len(self._budget_rows)
        return int(self.lazy.nbytes) + rows * self.vocab.words * 4 + status

    def steering_bound(self, state: int | None = None) -> int:
        """The steering figure of ``state`` (default the start): the fewest tokens to an accepting
        state using single-byte tokens only, or fewer along an answer recorded through it
        (``add_answer``); ``budget.UNREACHABLE`` when neither gets there."""
        return int(self.lazy.steering_distance(self.start if state is None else state, self._usable))

    def shortest_from(self, state: int) -> bytes | None:
        """One shortest answer in bytes from ``state`` (None: none, or past the automaton's limits)."""
        try:
            return self.lazy.shortest_answer(native_vocab(self.vocab), state)
        except ValueError:
            return None

    def add_answer(self, answer: bytes, state: int | None = None) -> int:
        """Steer by ``answer`` from ``state`` (default the start), cut into the longest tokens, too:
        each state where one of its tokens starts can end within the tokens left of it. Its tokens;
        -1 when it is not an answer from there (or the automaton's limits stop the walk)."""
        try:
            tokens = int(self.lazy.add_answer(native_vocab(self.vocab), self.start if state is None else state, answer))
        except ValueError:
            return -1
        if tokens >= 0:
            self._max_distance = None
            self._budget_rows.clear()
        return tokens

    def steerable_within(self, tokens: int, output: Sequence[int] = ()) -> bool:
        """Whether steering can end an answer within ``tokens`` more tokens after ``output`` (its
        tokens so far), recording one shortest answer from there if the figure does not fit
        (``budget.steerable_from``). An answer already ended or refused by its output has nothing
        to steer."""
        state = self.walk(output)
        if state < 0:  # refused by the constraint (nothing to steer), or past the automaton's limits
            return not self.lazy.exhausted
        return steerable_from(self, state, tokens)

    @property
    def max_distance(self) -> int:
        """An upper bound on every finite steering figure: a row with more tokens left than this
        needs no steering. Read off the NFA (and the answers recorded) once per answer recorded."""
        if self._max_distance is None:
            self._max_distance = int(self.lazy.max_steering_distance(self._usable))
        return self._max_distance

    def budget_row(self, state: int, k: int) -> NDArray[np.uint32] | None:
        """The tokens allowed in ``state`` after which the answer can still end within ``k`` more
        tokens by the steering figure, plus end of sequence when ``state`` accepts; None when no
        token qualifies, or when the automaton's limits stop the walk (the grammar's next step then
        ends the answer anyway). The latest rows are kept, as the complete form keeps them."""
        key = (int(state), int(k))
        if key in self._budget_rows:
            return self._budget_rows[key]
        row = np.zeros(self.vocab.words, dtype=np.uint32)
        try:
            self.lazy.budget_row(native_vocab(self.vocab), state, self._usable, k, row)
        except ValueError:
            row[:] = 0  # kept: walking again would cost the same time to fail again
        found = row if row.any() else None
        if len(self._budget_rows) >= self.BUDGET_ROWS_KEPT:
            self._budget_rows.pop(next(iter(self._budget_rows)), None)
        self._budget_rows[key] = found
        return found

    def step(self, state: int, token: int) -> int:
        """Next state after ``token`` (-1: not allowed, or past the automaton's limits)."""
        return int(self.native.step(state, token))

    def walk(self, tokens, state: int | None = None) -> int:
        s = self.start if state is None else state
        for t in tokens:
            if s < 0:
                return s
            s = self.step(s, t)
        return s

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.lazy.accepting(state))
