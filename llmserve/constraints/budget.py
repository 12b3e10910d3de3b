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

That check needs the start state's figure alone: ``fewest_tokens`` searches forward from the start
over whole tokens, and costs only the states nearer the start than the shortest answer. The figure
for every state (``token_distances``, what steering uses) costs a walk of the vocabulary per state
and round: seconds for a 50,000-state schema at a 100k vocabulary, too much to pay while the request
waits.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints.comb import Comb, class_columns
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.native import native, native_vocab

UNREACHABLE = np.iinfo(np.int32).max


class BudgetError(ConstraintError):
    """Even the shortest answer the constraint allows does not fit in ``max_tokens``."""

    code = "constraint-budget"
    default_hint = "Raise max_tokens, or loosen the constraint (fewer required properties, shorter minimums)."


def _columns(table, classes) -> NDArray[np.int16] | NDArray[np.int32] | Comb:
    """The table as the core reads it: a compressed form's comb, or int16 class columns, as they are
    (no int32 copy of them per search), anything else as int32 (the core reads a dense table in 32
    bits only)."""
    if classes is not None and isinstance(table, tuple):
        return Comb(*table)
    if classes is not None and isinstance(table, np.ndarray) and table.dtype == np.int16 and table.flags.c_contiguous:
        return table
    return np.ascontiguousarray(table, dtype=np.int32)


def distances(
    table: NDArray[np.int32] | NDArray[np.int16] | Comb,
    accept: NDArray[np.uint8],
    bytes_usable: NDArray[np.bool_] | None = None,
    classes: NDArray[np.uint8] | None = None,
):
    """int32 [S]: fewest single-byte steps to an accepting state (UNREACHABLE where none), a
    breadth-first search backwards from the accepting states. ``classes``: ``table`` is over byte
    classes: columns int32[S, C] (see ``regex.ByteDFA``) or a compressed form's comb; a class is a usable
    step when any of its bytes is.
    Natively when the core is built (steering reads it inline, at a request's first steered step:
    tens of milliseconds in numpy for a 50,000-state schema)."""
    usable = np.ones(256, dtype=bool) if bytes_usable is None else np.asarray(bytes_usable, dtype=bool)
    if native is None:
        held = table if classes is None else class_columns(table, classes)
        return _distances_numpy(np.asarray(held), accept, usable, classes)
    return native.byte_distances(
        _columns(table, classes),
        np.ascontiguousarray(accept, dtype=np.uint8),
        np.ascontiguousarray(usable, dtype=np.uint8),
        None if classes is None else np.ascontiguousarray(classes, dtype=np.uint8),
    )


def _distances_numpy(table, accept, usable, classes) -> NDArray[np.int32]:
    """``distances`` without the core (and its reference in the tests)."""
    n = table.shape[0]
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
            _columns(table, classes),
            np.ascontiguousarray(accept, dtype=np.uint8),
            dist,
            order,
            None if classes is None else np.ascontiguousarray(classes, dtype=np.uint8),
        )
    return dist


class Shortest(NamedTuple):
    """How many tokens the shortest answer takes, end of sequence not counted (``UNREACHABLE``: no
    answer). ``bound``: "exact"; "at most" (an answer of ``tokens`` tokens exists, which is all a
    budget check needs to let a request through); or "at least" (the search ran out of time)."""

    tokens: int
    bound: str = "exact"


def fewest_tokens(
    table: NDArray[np.int32] | NDArray[np.int16] | Comb,
    accept: NDArray[np.uint8],
    start: int,
    vocab,
    classes: NDArray[np.uint8] | None = None,
    *,
    within: int | None = None,
    budget_ms: int = 0,
) -> Shortest:
    """The fewest tokens from ``start`` to an accepting state (see the module doc). With ``within``,
    an answer of at most ``within`` tokens found cheaply (a shortest answer in bytes cut into the
    longest tokens) is enough: "at most". Otherwise a search forward from ``start`` within
    ``budget_ms`` (0: no limit) gives the exact figure, or "at least" when the time ran out.
    ``classes``: as in ``distances``. Without the native core: the single-byte figure, an achievable
    upper bound, taken as exact (as ``token_distances`` does)."""
    if native is None:
        return Shortest(int(distances(table, accept, vocab.single_bytes, classes)[start]))
    args = (
        native_vocab(vocab),
        _columns(table, classes),
        np.ascontiguousarray(accept, dtype=np.uint8),
        int(start),
        None if classes is None else np.ascontiguousarray(classes, dtype=np.uint8),
    )
    if within is not None:
        greedy = native.greedy_tokens(*args)
        if greedy == UNREACHABLE:
            return Shortest(greedy)
        if 0 <= greedy <= within:
            return Shortest(greedy, "at most")
    tokens, explored = native.fewest_tokens(*args, budget_ms=int(budget_ms))
    if tokens < 0:  # every answer takes more than `explored` tokens
        return Shortest(explored + 1, "at least")
    return Shortest(int(tokens))


def lazy_fewest_tokens(lazy, vocab, *, within: int | None = None, budget_ms: int = 0) -> Shortest:
    """``fewest_tokens`` from the start of an automaton built as it is walked (a ``_core.LazyDfa``),
    building only the states the search reaches (``within``: an answer of at most that many tokens,
    found along one shortest answer in bytes, is enough: "at most"); "at least" when ``budget_ms``
    (or the automaton's own time limit per call) ran out first. ConstraintError when it reaches the
    automaton's state or memory limit first."""
    try:
        if within is not None:
            greedy = lazy.greedy_tokens(native_vocab(vocab), 0)
            if greedy == UNREACHABLE:
                return Shortest(greedy)
            if 0 <= greedy <= within:
                return Shortest(greedy, "at most")
        tokens, explored = lazy.fewest_tokens(native_vocab(vocab), 0, int(budget_ms))
    except ValueError as exc:  # the automaton's state or memory limit: the constraint's to answer for
        raise ConstraintError(str(exc)) from None
    if tokens < 0:
        return Shortest(explored + 1, "at least")
    return Shortest(int(tokens))


def steerable_from(form, state: int, tokens: int) -> bool:
    """Whether steering ``form`` (a compiled or lazy form) can end an answer at ``state`` within
    ``tokens`` more tokens: its steering figure fits, or one shortest answer in bytes from there,
    cut into the longest tokens, fits and is recorded for steering (``form.add_answer``). Steering
    by the least of the single-byte figure and recorded answers keeps the invariant above: each
    figure comes with a next token one nearer (a single-byte token; the recorded answer's next
    token, which reaches a state recorded one nearer)."""
    if form.steering_bound(state) <= tokens:
        return True
    answer = form.shortest_from(state)
    return answer is not None and 0 <= form.add_answer(answer, state) <= tokens


def check_fits(shortest: int | Shortest, max_tokens: int | None, limit: str | None = None) -> None:
    """Refuse a request whose shortest answer (``shortest`` tokens, end of sequence not counted)
    cannot fit in ``max_tokens``. A lower bound refuses only when even the bound does not fit; an
    upper bound never refuses (it shows a fit when it fits, and tells nothing otherwise). ``limit``:
    what the refusal calls the budget where ``max_tokens=N`` alone would mislead (a default, or a
    figure the engine cut to the context)."""
    if max_tokens is None:
        return
    found = shortest if isinstance(shortest, Shortest) else Shortest(int(shortest))
    tokens = found.tokens
    if found.bound == "at most":
        return
    if tokens == UNREACHABLE or tokens + 1 > max_tokens:
        need = str(tokens + 1) if found.bound == "exact" else f"at least {tokens + 1}"
        if tokens == UNREACHABLE:
            need = "no number of"
        raise BudgetError(
            f"{limit or f'max_tokens={max_tokens}'} is too small for this constraint: its shortest answer "
            f"needs {need} tokens (end of sequence included)"
        )
