"""How far each automaton state is from the end of the answer: what lets a constrained answer close
within ``max_tokens``.

``distances(dfa, bytes_usable)`` is, per state, the fewest steps to an accepting state when every
step is one byte from ``bytes_usable`` (the bytes the vocabulary holds as single-byte tokens; a
byte-level BPE holds all 256). Each step is then one token, so the distance is a number of tokens
that is always *achievable*: a state at distance d can end the answer in d tokens, plus one for
end of sequence. Multi-byte tokens can only shorten that, so the figure is an upper bound of the
true fewest tokens, and steering by it is safe:

    invariant: distance(state) + 1 <= tokens left
    allow token t in state s only if distance(step(s, t)) + 1 <= tokens left - 1

The token that takes the first byte of a shortest completion always qualifies, so the invariant
holds at every step and the answer ends in an accepting state with end of sequence within the
budget. When ``distance(start) + 1`` exceeds ``max_tokens`` no steering can help: the request is
refused up front (``BudgetError``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.native import native, native_vocab

UNREACHABLE = np.iinfo(np.int32).max


class BudgetError(ConstraintError):
    """Even the shortest answer the constraint allows does not fit in ``max_tokens``."""

    code = "constraint-budget"
    default_hint = "Raise max_tokens, or loosen the constraint (fewer required properties, shorter minimums)."


def distances(
    table: NDArray[np.int32],
    accept: NDArray[np.uint8],
    bytes_usable: NDArray[np.bool_] | None = None,
    classes: NDArray[np.uint8] | None = None,
):
    """int32 [S]: fewest single-byte steps to an accepting state (UNREACHABLE where none), a
    breadth-first search backwards from the accepting states. ``classes``: ``table`` is over byte
    classes, int32[S, C] (see ``regex.ByteDFA``); a class is a usable step when any of its bytes is."""
    table = np.asarray(table)
    n = table.shape[0]
    usable = np.ones(256, dtype=bool) if bytes_usable is None else np.asarray(bytes_usable, dtype=bool)
    if classes is not None:
        by_class = np.zeros(table.shape[1], dtype=bool)
        np.logical_or.at(by_class, np.asarray(classes, dtype=np.intp), usable)
        usable = by_class
    # reverse edges over usable bytes: (target, source) pairs
    src, byte = np.nonzero((table >= 0) & usable[None, :])
    dst = table[src, byte]
    order = np.argsort(dst, kind="stable")
    src_by_dst = src[order]
    starts = np.searchsorted(dst[order], np.arange(n + 1))
    dist = np.full(n, UNREACHABLE, dtype=np.int32)
    frontier = np.flatnonzero(np.asarray(accept, dtype=bool))
    dist[frontier] = 0
    d = 0
    while frontier.size:
        d += 1
        preds = np.unique(np.concatenate([src_by_dst[starts[q] : starts[q + 1]] for q in frontier]))
        preds = preds[dist[preds] == UNREACHABLE]
        dist[preds] = d
        frontier = preds
    return dist


def token_distances(table, accept, vocab, classes: NDArray[np.uint8] | None = None) -> NDArray[np.int32]:
    """int32 [S]: fewest tokens to an accepting state. Single-byte steps over the vocabulary's
    one-byte tokens give an achievable upper bound; the native core, when built, then lowers it to
    the exact figure over whole tokens (Bellman-Ford over token steps, states in increasing
    distance). Needs the automaton and the vocabulary only, no mask table. ``classes``: as in
    ``distances``."""
    dist = distances(table, accept, vocab.single_bytes, classes)
    if native is not None:
        order = np.argsort(dist, kind="stable").astype(np.int32)
        native.token_distances(
            native_vocab(vocab),
            np.ascontiguousarray(table, dtype=np.int32),
            np.ascontiguousarray(accept, dtype=np.uint8),
            dist,
            order,
            None if classes is None else np.ascontiguousarray(classes, dtype=np.uint8),
        )
    return dist


def check_fits(shortest: int, max_tokens: int | None) -> None:
    """Refuse a request whose shortest answer (``shortest`` tokens, end of sequence not counted)
    cannot fit in ``max_tokens``."""
    if max_tokens is None:
        return
    if shortest == UNREACHABLE or shortest + 1 > max_tokens:
        need = "no number of" if shortest == UNREACHABLE else str(shortest + 1)
        raise BudgetError(
            f"max_tokens={max_tokens} is too small for this constraint: its shortest answer needs "
            f"{need} tokens (end of sequence included)"
        )
