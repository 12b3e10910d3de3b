"""Answers that end within max_tokens (issue #17, item 3), on random automata and vocabularies: the
per-state token distances are exact, and the steered walk (only tokens after which the answer can
still end in time) always ends in an accepting state with end of sequence within its budget."""

from __future__ import annotations

import random
import threading
import time
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmserve.constraints import ConstraintError, Vocab, compile_dfa, compile_regex
from llmserve.constraints.budget import UNREACHABLE, BudgetError, check_fits
from llmserve.constraints.regex import _trim_and_minimize

ALPHABET = b"abcd"


@st.composite
def automata(draw):
    n = draw(st.integers(1, 12))
    table = [[-1] * 256 for _ in range(n)]
    for s in range(n):
        for b in ALPHABET:
            if draw(st.booleans()):
                table[s][b] = draw(st.integers(0, n - 1))
    accept = [draw(st.booleans()) for _ in range(n)]
    return table, accept


@st.composite
def vocabularies(draw):
    words = draw(st.lists(st.binary(min_size=1, max_size=3), min_size=1, max_size=20))
    words = [bytes(ALPHABET[x % 4] for x in w) for w in words]
    return Vocab([*dict.fromkeys(words), None], eos_ids=(len(dict.fromkeys(words)),))


def true_distances(compiled) -> list[int]:
    """Fewest tokens to an accepting state, by breadth-first search over token steps."""
    n = compiled.num_states
    succ = [set() for _ in range(n)]
    for s in range(n):
        for t, data in enumerate(compiled.vocab.tokens):
            if data is not None:
                e = compiled.step(s, t)
                if e >= 0:
                    succ[s].add(e)
    dist = [int(UNREACHABLE)] * n
    todo = deque(s for s in range(n) if compiled.accept[s])
    for s in todo:
        dist[s] = 0
    preds = [[] for _ in range(n)]
    for s in range(n):
        for e in succ[s]:
            preds[e].append(s)
    while todo:
        e = todo.popleft()
        for s in preds[e]:
            if dist[s] == UNREACHABLE:
                dist[s] = dist[e] + 1
                todo.append(s)
    return dist


def compiled_of(automaton, vocab):
    table, accept = automaton
    try:
        dfa = _trim_and_minimize(table, accept)
    except ConstraintError:
        assume(False)
    return compile_dfa(dfa, vocab)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(automata(), vocabularies())
def test_token_distances_are_exact(automaton, vocab):
    compiled = compiled_of(automaton, vocab)
    assert compiled.distances.tolist() == true_distances(compiled)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(automata(), vocabularies(), st.integers(0, 8), st.integers(0, 2**32 - 1))
def test_the_steered_walk_ends_accepted_within_the_budget(automaton, vocab, slack, seed):
    compiled = compiled_of(automaton, vocab)
    shortest = int(compiled.distances[compiled.start])
    assume(shortest != UNREACHABLE)
    budget = shortest + 1 + slack  # end of sequence counts as a token
    rng = random.Random(seed)
    row = np.zeros(vocab.words, dtype=np.uint32)
    state, used = compiled.start, 0
    eos = vocab.eos_ids[0]
    while True:
        left = budget - used
        assert left >= 1
        compiled.native.budget_row(state, compiled.distances, left - 2, row)
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size])
        assert allowed.size, "steering never leaves a row without a token"
        assert set(allowed.tolist()) <= set(np.flatnonzero(compiled.allowed(state)).tolist())
        tok = int(rng.choice(allowed))
        used += 1
        if tok == eos:
            break
        state = compiled.step(state, tok)
    assert compiled.is_accepting(state)
    assert used <= budget


def test_a_budget_below_the_shortest_answer_is_refused_with_the_count():
    check_fits(4, 5)
    with pytest.raises(BudgetError, match="needs 6 tokens"):
        check_fits(5, 5)
    with pytest.raises(BudgetError, match="no number of"):
        check_fits(int(UNREACHABLE), 100)


def test_budget_rows_are_kept_per_state_and_bounded():
    vocab = Vocab([b"a", b"b", b"ab", None], (3,), 4)
    compiled = compile_dfa(compile_regex("(ab){1,3}"), vocab)
    state = compiled.walk([0])  # after "a"
    _ = compiled.distances  # exact ones known: steering uses them (else the single-byte bound first)
    row = compiled.budget_row(state, 0)
    expected = np.zeros(vocab.words, np.uint32)
    compiled.native.budget_row(state, compiled.distances, 0, expected)
    assert row is not None
    np.testing.assert_array_equal(row, expected)
    assert compiled.budget_row(state, 0) is row
    for k in range(compiled.BUDGET_ROWS_KEPT + 5):
        compiled.budget_row(compiled.start, k)
    assert len(compiled._budget_rows) <= compiled.BUDGET_ROWS_KEPT


def test_steering_never_waits_for_the_exact_distances(monkeypatch):
    """The exact distances walk the vocabulary per state (0.3 s on a large schema): the decode loop
    steers by the single-byte bound until a background thread has them, then switches."""
    from llmserve.constraints import budget
    from llmserve.constraints import compiled as compiled_mod

    release = threading.Event()
    exact_of = compiled_mod.token_distances

    def slow(*args):
        assert release.wait(10)
        return exact_of(*args)

    vocab = Vocab([b"a", b"b", b"ab", None], (3,), 4)
    compiled = compile_dfa(compile_regex("(ab){1,3}"), vocab)
    monkeypatch.setattr(compiled_mod, "token_distances", slow)
    bound = compiled.steering_distances()  # at once, while the exact ones wait
    assert bound.tolist() == budget.distances(compiled.table, compiled.accept, vocab.single_bytes).tolist()
    assert bound[compiled.start] == 2  # "a", "b" one byte a step
    assert compiled.max_distance == int(bound[bound != UNREACHABLE].max())
    kept = compiled.budget_row(compiled.start, 1)
    assert kept is not None and compiled.budget_row(compiled.start, 1) is kept
    release.set()
    deadline = time.monotonic() + 10
    while compiled.steering_distances() is bound and time.monotonic() < deadline:
        time.sleep(0.01)
    exact = compiled.steering_distances()
    assert exact[compiled.start] == 1  # the token "ab"
    assert (exact <= bound).all()
    row = compiled.budget_row(compiled.start, 1)  # recomputed with the exact figure, not the kept one
    assert row is not kept
    np.testing.assert_array_equal(row, kept)  # "a" and "ab" both still end in time
