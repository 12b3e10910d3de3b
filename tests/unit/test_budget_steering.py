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
from llmserve.constraints.budget import UNREACHABLE, BudgetError, Shortest, check_fits, fewest_tokens
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(automata(), vocabularies())
def test_the_search_from_one_state_finds_its_exact_distance(automaton, vocab):
    """What the budget check reads (a search forward from one state) is, from every state, the
    figure steering reads (every state's distance, searched backwards)."""
    compiled = compiled_of(automaton, vocab)
    truth = true_distances(compiled)
    for s in range(compiled.num_states):
        assert fewest_tokens(compiled.table, compiled.accept, s, vocab) == Shortest(truth[s])
        # enough to let a budget through: an answer of at most `within` tokens, or the exact figure
        for within in (0, 2, 1000):
            found = fewest_tokens(compiled.table, compiled.accept, s, vocab, within=within)
            if found.bound == "at most":
                assert truth[s] <= found.tokens <= within
            else:
                assert found == Shortest(truth[s])


@settings(max_examples=150, deadline=None)
@given(automata(), st.lists(st.sampled_from(list(ALPHABET)), max_size=4), st.booleans())
def test_the_core_byte_distances_are_the_reference(automaton, usable_bytes, as_classes):
    from llmserve.constraints.budget import _distances_numpy, distances

    table = np.array(automaton[0], np.int32)
    accept = np.array(automaton[1], np.uint8)
    usable = np.zeros(256, bool)
    usable[usable_bytes] = True
    classes = None
    if as_classes:  # one class per letter, one for every other byte
        classes = np.zeros(256, np.uint8)
        classes[list(ALPHABET)] = [1, 2, 3, 4]
        table = np.concatenate([np.full((len(table), 1), -1, np.int32), table[:, list(ALPHABET)]], axis=1)
    want = _distances_numpy(table, accept, usable, classes)
    np.testing.assert_array_equal(distances(table, accept, usable, classes), want)


def test_an_answer_cut_into_the_longest_tokens_is_enough_within_the_budget():
    vocab = Vocab([b"a", b"b", b"c", b"ab", b"abca", None], (5,), 6)
    compiled = compile_dfa(compile_regex("(ab|c)(ab|c)(ab|c)"), vocab)
    table, accept, start = compiled.table, compiled.accept, compiled.start
    # the shortest answer in bytes is "ccc": three tokens, where "abca" + "b" takes two
    assert fewest_tokens(table, accept, start, vocab) == Shortest(2)
    assert fewest_tokens(table, accept, start, vocab, within=3) == Shortest(3, "at most")
    assert fewest_tokens(table, accept, start, vocab, within=2) == Shortest(2)
    # the cut walks a byte of each class that is a token by itself: "a", not "\x01", below
    aaa = Vocab([b"a", b"aaa", None], (2,), 3)
    three = compile_dfa(compile_regex("[\x01a]{3}"), aaa)
    assert fewest_tokens(three.table, three.accept, three.start, aaa, within=1) == Shortest(1, "at most")
    nothing = Vocab([b"a", None], (1,), 2)  # "c" starts no token: no cut, the search decides
    assert fewest_tokens(table, accept, start, nothing, within=9) == Shortest(int(UNREACHABLE))


def test_a_search_out_of_time_gives_a_lower_bound():
    # a chain of 200,000 bytes over one-byte tokens: 200,000 levels, far more than 1 ms of search
    n = 200_001
    classes = np.zeros(256, np.uint8)
    classes[ord("a")] = 1  # class 0: every other byte, dead everywhere
    table = np.full((n, 2), -1, np.int32)
    table[:-1, 1] = np.arange(1, n)
    accept = np.zeros(n, np.uint8)
    accept[-1] = 1
    vocab = Vocab([b"a", None], (1,), 2)
    found = fewest_tokens(table, accept, 0, vocab, classes, budget_ms=1)
    assert found.bound == "at least"
    assert 1 <= found.tokens < n - 1
    assert fewest_tokens(table, accept, 0, vocab, classes) == Shortest(n - 1)


def test_a_budget_below_the_shortest_answer_is_refused_with_the_count():
    check_fits(4, 5)
    with pytest.raises(BudgetError, match="needs 6 tokens"):
        check_fits(5, 5)
    with pytest.raises(BudgetError, match="no number of"):
        check_fits(int(UNREACHABLE), 100)
    # a search that ran out of time: only its lower bound refuses, and says so
    check_fits(Shortest(4, "at least"), 5)
    with pytest.raises(BudgetError, match="needs at least 6 tokens"):
        check_fits(Shortest(5, "at least"), 5)
    check_fits(Shortest(4, "at most"), 5)
    # where the figure is not the client's max_tokens, the refusal says what it is
    with pytest.raises(BudgetError, match=r"^max_tokens=5 is too small"):
        check_fits(5, 5)
    with pytest.raises(BudgetError, match=r"^a budget of 5 tokens \(cut\) is too small.*needs 6 tokens"):
        check_fits(5, 5, "a budget of 5 tokens (cut)")


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


def test_one_constraint_computes_its_exact_distances_at_a_time(monkeypatch):
    """A burst of new constraints must not take every core from decoding: their background searches
    run one after another, and each form still gets its own."""
    from llmserve.constraints import compiled as compiled_mod

    exact_of = compiled_mod.token_distances
    running, most = [0], [0]
    lock = threading.Lock()

    def counted(*args):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return exact_of(*args)

    monkeypatch.setattr(compiled_mod, "token_distances", counted)
    vocab = Vocab([b"a", b"b", b"ab", None], (3,), 4)
    forms = [compile_dfa(compile_regex(f"(ab){{1,{n}}}"), vocab) for n in range(2, 8)]
    for form in forms:
        form.steering_distances()
    deadline = time.monotonic() + 20
    while any(f.known_distances is None for f in forms):
        assert time.monotonic() < deadline, "a form never got its exact distances"
        time.sleep(0.01)
    assert most[0] == 1
    for form in forms:
        np.testing.assert_array_equal(form.known_distances, exact_of(form.table, form.accept, vocab))
