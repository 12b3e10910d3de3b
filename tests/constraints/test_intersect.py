"""The core's intersection of byte automata (``dfa_ops.intersect`` -> ``intersect_dfas``, csrc/dfa.h)
against a product written here in Python, byte by byte, minimised the way every automaton is: the same
minimal tables on random automata and on real patterns, and the refusals named."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from llmserve.constraints.dfa_ops import intersect
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.native import native
from llmserve.constraints.regex import ByteDFA, compile_ast, compile_regex


def _random_dfa(rng, states: int) -> ByteDFA:
    steps = rng.integers(-1, states, size=(states, 8)).astype(np.int32)
    table = np.ascontiguousarray(steps[:, rng.integers(0, 8, size=256)])
    return ByteDFA(table, rng.integers(0, 2, size=states).astype(np.uint8), int(rng.integers(0, states)))


def _reference(dfas: list[ByteDFA]) -> ByteDFA:
    """The product by tuples of states, one byte at a time, then trimmed and minimised by the core."""
    start = tuple(int(d.start) for d in dfas)
    index, order, rows, accept = {start: 0}, [start], [], []
    for cur in order:
        accept.append(all(d.accept[q] for d, q in zip(dfas, cur, strict=True)))
        row = []
        for b in range(256):
            nxt = tuple(int(d.table[q, b]) for d, q in zip(dfas, cur, strict=True))
            if min(nxt) < 0:
                row.append(-1)
                continue
            if nxt not in index:
                index[nxt] = len(order)
                order.append(nxt)
            row.append(index[nxt])
        rows.append(row)
    product = ByteDFA(np.array(rows, dtype=np.int32), np.array(accept, dtype=np.uint8), 0)
    return compile_ast(("dfa", product))


def _same(a: ByteDFA, b: ByteDFA) -> bool:
    return np.array_equal(a.table, b.table) and np.array_equal(a.accept, b.accept) and a.start == b.start


def test_random_automata_intersect_as_the_reference_does():
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(150):
        dfas = [_random_dfa(rng, int(rng.integers(1, 12))) for _ in range(int(rng.integers(2, 4)))]
        try:
            expected = _reference(dfas)
        except ConstraintError as exc:
            assert "matches no string" in exc.message
            with pytest.raises(ConstraintError, match="no string satisfies all of the conditions"):
                intersect(dfas)
            continue
        assert _same(intersect(dfas), expected)
        checked += 1
    assert checked > 50


def test_patterns_intersect_as_the_reference_does():
    patterns = ["[a-z]+", "[a-z0-9]{0,63}", "(ab|cd)*x", ".*foo.*", "\\d{4}-\\d{2}", ".{3,50}", "[^x]*é.*"]
    for p, q in itertools.product(patterns, repeat=2):
        dfas = [compile_regex(p), compile_regex(q)]
        try:
            expected = _reference(dfas)
        except ConstraintError:
            with pytest.raises(ConstraintError, match="no string satisfies"):
                intersect(dfas)
            continue
        got = intersect(dfas)
        assert _same(got, expected), (p, q)
    three = [compile_regex(".*a.*"), compile_regex(".*b.*"), compile_regex("[abc]{2,6}")]
    assert _same(intersect(three), _reference(three))
    assert intersect(three).matches(b"cab") and not intersect(three).matches(b"aa")


def test_the_state_limit_and_the_time_budget_are_named(monkeypatch):
    dfas = [compile_regex(".{0,300}"), compile_regex("[a-z]*q[a-z]*")]
    with pytest.raises(ConstraintError, match="more than 10 automaton states"):
        intersect(dfas, max_states=10)
    with pytest.raises(ConstraintError, match="time budget"):
        intersect(dfas, started=time.monotonic() - 3600)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t, a, s: ([t[:, :255]], [a], s), "int32\\[S, 256\\]"),
        (lambda t, a, s: ([t], [a[:-1]], s), "int32\\[S, 256\\]"),
        (lambda t, a, s: ([t], [a], [len(a)]), "start out of range"),
        (lambda t, a, s: ([np.where(t >= 0, len(a), t).astype(np.int32)], [a], s), "transition out of range"),
        (lambda t, a, s: ([t, t], [a], s), "one table, accept array and start per automaton"),
        (lambda t, a, s: ([t.astype(np.int64)], [a], s), "wrong dtype"),
    ],
)
def test_the_core_refuses_malformed_automata(change, match):
    d = compile_regex("[a-c]+x")
    tables, accepts, starts = change(np.ascontiguousarray(d.table), np.asarray(d.accept), [d.start])
    with pytest.raises(ValueError, match=match):
        native.intersect_dfas(tables, accepts, starts, 1000)
