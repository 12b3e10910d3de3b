"""Random answers of a constraint's byte automaton, for tests that check every answer against its schema."""

from __future__ import annotations

import random

from llmserve.constraints.budget import distances


def steered_walk(dfa, rng: random.Random, budget: int, stop: float = 0.1) -> bytes:
    """A random accepted text of at most ``budget`` bytes: random live bytes while the distance to an
    accepting state leaves room, then only bytes that keep it (the steered walk). At an accepting state
    the walk ends with probability ``stop`` (always where no byte fits)."""
    dist = distances(dfa.table, dfa.accept)
    state, out = dfa.start, bytearray()
    assert dist[state] <= budget, "no answer fits the budget"
    while True:
        row = dfa.table[state]
        ok = [b for b in range(256) if row[b] >= 0 and dist[row[b]] <= budget - len(out) - 1]
        if dfa.accept[state] and (not ok or rng.random() < stop):
            return bytes(out)
        assert ok, "the steered walk can always continue"
        b = rng.choice(ok)
        out.append(b)
        state = int(row[b])
