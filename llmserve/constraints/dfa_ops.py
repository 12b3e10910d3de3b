"""Intersection of byte automata: what a regular expression cannot say in one piece.

JSON Schema puts several conditions on one value at once (a ``pattern``, a ``format`` and length
bounds on the same string; two ``pattern``s merged from ``allOf``). Each is regular on its own; the
value must satisfy all of them, which is the product automaton. The result is embedded in the
schema's AST as a ``("dfa", ByteDFA)`` node and built into the whole automaton as it is.
"""

from __future__ import annotations

import time

import numpy as np

from llmserve.constraints.errors import ConstraintError, no_string_left
from llmserve.constraints.limits import limits
from llmserve.constraints.native import native as core
from llmserve.constraints.native import require_native
from llmserve.constraints.regex import (
    SUBSET_FACTOR,
    ByteDFA,
    _equivalence_classes,
    _left_ms,
    _native_error,
    _states_error,
    _time_budget_error,
    compile_ast,
)


def intersect(dfas: list[ByteDFA], max_states: int | None = None, *, started: float | None = None) -> ByteDFA:
    """The automaton of the strings every one of ``dfas`` accepts (trimmed, minimal), built by the
    core (``intersect_dfas``: the product over byte intervals, then the minimisation every automaton
    gets; the numpy product it replaces took most of a schema's conversion where strings carry a
    pattern and a length). ConstraintError when no string is accepted by all, or past the state
    limit, the compile memory budget or the compile time budget (counted from ``started``, a
    ``time.monotonic()``; default now)."""
    if len(dfas) == 1:
        return dfas[0]
    require_native()
    lim = limits()
    started = time.monotonic() if started is None else started
    limit = lim.max_states if max_states is None else max_states
    left_ms = _left_ms(started + lim.compile_ms / 1000, lim)
    try:
        table, accept = core.intersect_dfas(
            [np.ascontiguousarray(d.table, dtype=np.int32) for d in dfas],
            [np.ascontiguousarray(d.accept, dtype=np.uint8) for d in dfas],
            [int(d.start) for d in dfas],
            limit * SUBSET_FACTOR,  # product states, minimised below, then held to the limit
            left_ms,
            lim.compile_mb << 20,
        )
    except ValueError as exc:
        message = str(exc)
        if "matches no string" in message:
            raise ConstraintError("no string satisfies all of the conditions on this value at once") from None
        if "automaton states" in message:
            raise _states_error(limit) from None
        raise _native_error(message, lim) from None
    out = ByteDFA(table, accept, 0)
    if out.num_states > limit:
        raise _states_error(limit)
    return out


def complement(dfa: ByteDFA, universe: ByteDFA | None = None) -> ByteDFA:
    """The byte strings ``dfa`` refuses (within ``universe``'s when given: the result is then
    trimmed and minimised, else it is total over bytes, a sink taking the missing transitions)."""
    n = dfa.num_states
    table = np.vstack([np.where(dfa.table < 0, n, dfa.table), np.full((1, 256), n)]).astype(np.int32)
    accept = np.append(1 - np.asarray(dfa.accept, dtype=np.uint8), 1).astype(np.uint8)
    out = ByteDFA(table, accept, dfa.start)
    return out if universe is None else intersect([out, universe])


# --------------------------------------------------------------------------------------------
# Look-around: (?=A) (?!A) (?<=B) (?<!B), and the anchors ^ $ anywhere
# --------------------------------------------------------------------------------------------
#
# A look-ahead at position p is a condition on the rest of the value: it must (not) begin with a
# match of A, i.e. the suffix from p lies in A.* (or outside it). A look-behind is one on the
# prefix before p: it lies in .*B (or outside it). Neither is a regular-expression operator, but
# both keep the language regular, and the automaton is built directly (an alternating automaton
# made deterministic):
#
# * Each assertion in the pattern becomes a *marker*, the bytes 0xFF k (0xFF never occurs in
#   UTF-8; k numbers the assertion), and the pattern with its markers is compiled as any other
#   (the native builder). A marked string spells one way the pattern may match, its markers where
#   the assertions are checked.
# * Each look-ahead's condition is an automaton of its own (A.*, or its complement for (?!A)),
#   started where its marker is read: an *obligation* carried along with the thread that read it,
#   stepped on every later byte; the thread dies when an obligation can no longer be met, and
#   accepts only where all of its obligations accept. ``$`` is the obligation "nothing follows".
# * Each look-behind's condition is a *tracker*: the automaton of .*B run from the value's start,
#   whatever the threads do; its marker is read only where the tracker accepts (does not accept,
#   for (?<!B)). ``^`` is the condition "nothing came before".
# * A deterministic state is (tracker states, set of threads), a thread being (state of the marked
#   automaton, obligations); its markers are read as it is formed. Obligations in a state that
#   accepts every continuation are dropped, and so are threads that another one with fewer
#   obligations in the same state subsumes. The result is trimmed and minimised as any automaton.
#
# Exact for every nesting except a look-behind inside a look-ahead and a look-ahead (or ``$``)
# inside a look-behind, which are refused: their conditions would reach across the position where
# the outer one is checked. Everything here reads decoded characters (UTF-8 of the value), not JSON
# text; schema_strings.py maps the result to JSON encodings.

MARK = 0xFF
_EMPTY_ONLY = ByteDFA(np.full((1, 256), -1, dtype=np.int32), np.ones(1, dtype=np.uint8), 0)


def _marker(k: int) -> tuple:
    table = np.full((3, 256), -1, dtype=np.int32)
    table[0, MARK] = 1
    table[1, k] = 2
    return ("dfa", ByteDFA(table, np.array([0, 0, 1], dtype=np.uint8), 0))


class _Looks:
    """One look-around automaton's construction: its conditions, obligation and tracker automata,
    shared by every use of the same assertion (``\\b`` makes four per use, of the same two classes)."""

    def __init__(self, any_char: tuple, started: float, deadline: float, max_states: int, max_built: int | None):
        self.max_built = max_built
        self.any = ("rep", any_char, 0, None)
        self.started = started
        self.deadline = deadline
        self.max_states = max_states
        self.universe = compile_ast(self.any, started=started)
        self.conds: list[tuple] = []  # marker k -> ("start",) | ("behind", tracker, negative) | ("ahead", key)
        self.cond_ids: dict[tuple, int] = {}
        self.aheads: dict[tuple, tuple] = {}  # key -> (body, negative)
        self.obligations: dict[tuple, tuple] = {}  # (key, at0) -> (dfa or None, universal states)
        self.trackers: list[ByteDFA] = []
        self.tracker_ids: dict[int, int] = {}
        self.keep: list = []  # the bodies whose id() keys the tables above

    def mark(self, node, in_ahead: bool, in_behind: bool):
        """``node`` with each assertion replaced by its marker."""
        kind = node[0]
        if kind in ("cat", "alt"):
            return (kind, [self.mark(c, in_ahead, in_behind) for c in node[1]])
        if kind == "rep":
            return ("rep", self.mark(node[1], in_ahead, in_behind), node[2], node[3])
        if kind == "anchor":
            if node[1] == "^":
                return self.marker(("start",))
            if in_behind:
                raise ConstraintError("'$' inside a look-behind is not supported")
            return self.marker(("ahead", (node[1],)))
        if kind != "look":
            return node
        _, behind, negative, body = node
        self.keep.append(body)
        if behind:
            if in_ahead:
                raise ConstraintError("a look-behind inside a look-ahead is not supported")
            return self.marker(("behind", self.tracker(body), negative))
        if in_behind:
            raise ConstraintError("a look-ahead inside a look-behind is not supported")
        key = ("ahead", id(body), negative)
        self.aheads[key] = (body, negative)
        return self.marker(("ahead", key))

    def marker(self, cond: tuple) -> tuple:
        k = self.cond_ids.get(cond)
        if k is None:
            if len(self.conds) >= MARK:
                raise ConstraintError(f"more than {MARK} look-around assertions in one pattern")
            k = self.cond_ids[cond] = len(self.conds)
            self.conds.append(cond)
        return _marker(k)

    def tracker(self, body) -> int:
        """The index of the tracker automaton of ``.*body`` (run from the value's start)."""
        i = self.tracker_ids.get(id(body))
        if i is None:
            dfa = self.full(("cat", [self.any, body]), at0=True, in_behind=True)
            i = self.tracker_ids[id(body)] = len(self.trackers)
            self.trackers.append(dfa)
        return i

    def obligation(self, key: tuple, at0: bool) -> tuple:
        """The automaton the rest of the value must satisfy where a look-ahead is checked, at the
        value's start (``at0``: a ``^`` in it holds there) or later, with the states of it that
        accept every continuation; (None, None) where it never holds."""
        found = self.obligations.get((key, at0))
        if found is not None:
            return found
        dfa: ByteDFA | None
        if key == ("$",):
            dfa = _EMPTY_ONLY
        elif key == ("$\n",):
            dfa = compile_ast(("rep", ("set", [(0x0A, 0x0A)]), 0, 1), started=self.started)
        else:
            body, negative = self.aheads[key]
            try:
                dfa = self.full(("cat", [body, self.any]), at0=at0, in_ahead=True)
            except ConstraintError as exc:
                if "matches no string" not in exc.message:
                    raise
                dfa = None  # no A at all: (?=A) never holds, (?!A) always does
            if negative:
                dfa = self.universe if dfa is None else _complement_in(dfa, self.universe, self.started)
        found = (dfa, None) if dfa is None else (dfa, _universal_states(dfa, self.universe))
        self.obligations[(key, at0)] = found
        return found

    def full(self, node, *, at0: bool = True, in_ahead: bool = False, in_behind: bool = False) -> ByteDFA:
        """The automaton of the strings ``node`` matches whole (its assertions as conditions)."""
        marked = compile_ast(self.mark(node, in_ahead, in_behind), started=self.started)
        if not (marked.table[:, MARK] >= 0).any():
            return marked
        table, accept = _LookSubsets(self, marked, at0).run()
        # trimmed and minimised by the core (Python's minimisation takes seconds past a few
        # thousand states)
        built = ByteDFA(np.array(table, dtype=np.int32).reshape(-1, 256), np.array(accept, dtype=np.uint8), 0)
        return compile_ast(("dfa", built), started=self.started)


def _complement_in(dfa: ByteDFA, universe: ByteDFA, started: float) -> ByteDFA | None:
    n = dfa.num_states
    table = np.vstack([np.where(dfa.table < 0, n, dfa.table), np.full((1, 256), n)]).astype(np.int32)
    accept = np.append(1 - np.asarray(dfa.accept, dtype=np.uint8), 1).astype(np.uint8)
    try:
        return intersect([ByteDFA(table, accept, dfa.start), universe], started=started)
    except ConstraintError as exc:
        if no_string_left(exc):
            return None  # A.* holds everywhere: (?!A) never does
        raise


def _universal_states(dfa: ByteDFA, universe: ByteDFA) -> np.ndarray:
    """Bool [S]: the states of ``dfa`` from which every string of ``universe`` is accepted (the
    obligation is met whatever follows). ``dfa``'s language lies inside ``universe``'s, so these
    are the states equivalent to the universe's start: one partition refinement over both."""
    n = dfa.num_states
    t = np.vstack([dfa.table, np.where(universe.table >= 0, universe.table + n, -1)]).astype(np.int32)
    acc = np.concatenate([np.asarray(dfa.accept, bool), np.asarray(universe.accept, bool)])
    cls = _equivalence_classes(t, acc, np.ones(t.shape[0], dtype=bool))
    return cls[:n] == cls[n + universe.start]


class _LookSubsets:
    """The subset construction over threads of the marked automaton; see the section comment."""

    def __init__(self, looks: _Looks, marked: ByteDFA, at0: bool):
        self.looks, self.at0 = looks, at0
        self.table = np.asarray(marked.table)
        self.rows = self.table.tolist()
        self.accept = np.asarray(marked.accept, dtype=bool)
        self.start = marked.start
        used = {c[1] for c in looks.conds if c[0] == "behind"}
        self.tracker_ids = sorted(used)
        self.closures: dict[tuple, frozenset] = {}
        self.class_cache: dict[tuple, tuple[list[int], np.ndarray]] = {}

    def closure(self, seeds, first: bool, trackers: tuple) -> frozenset:
        rows = self.rows
        if all(rows[q][MARK] < 0 for q, _ in seeds) and len({q for q, _ in seeds}) == len(seeds):
            return frozenset(seeds)  # no marker to read, no two threads in one state
        key = (frozenset(seeds), first, trackers)
        found = self.closures.get(key)
        if found is None:
            found = self.closures[key] = self._closure(seeds, first, trackers)
        return found

    def _closure(self, seeds, first: bool, trackers: tuple) -> frozenset:
        looks, rows = self.looks, self.rows
        seen = set(seeds)
        todo = list(seeds)
        while todo:
            q, obl = todo.pop()
            after = rows[q][MARK]
            if after < 0:
                continue
            for k, r in enumerate(rows[after]):
                if r < 0:
                    continue
                cond = looks.conds[k]
                o = obl
                if cond[0] == "start":
                    if not (first and self.at0):
                        continue
                elif cond[0] == "behind":
                    t = trackers[self.tracker_ids.index(cond[1])]
                    if (t >= 0 and bool(looks.trackers[cond[1]].accept[t])) == cond[2]:
                        continue
                else:
                    key = (cond[1], first and self.at0)
                    dfa, universal = looks.obligation(*key)
                    if dfa is None:
                        continue
                    if not universal[dfa.start]:
                        o = obl | {(key, dfa.start)}
                item = (r, o)
                if item not in seen:
                    seen.add(item)
                    todo.append(item)
        # a thread with fewer obligations in the same state subsumes one with more
        by_state: dict[int, list[frozenset]] = {}
        for q, o in seen:
            by_state.setdefault(q, []).append(o)
        return frozenset((q, o) for q, obls in by_state.items() for o in obls if not any(p < o for p in obls))

    def step(self, threads, x: int) -> list:
        looks, rows = self.looks, self.rows
        seeds = []
        for q, obl in threads:
            r = rows[q][x]
            if r < 0:
                continue
            moved = set()
            for key, st in obl:
                dfa, universal = looks.obligation(*key)
                nxt = int(dfa.table[st, x])
                if nxt < 0:
                    break
                if not universal[nxt]:
                    moved.add((key, nxt))
            else:
                seeds.append((r, frozenset(moved)))
        return seeds

    def classes(self, threads, trackers: tuple) -> tuple[list[int], np.ndarray]:
        """The bytes this deterministic state treats alike: (one byte per class, class of each
        byte below 0xFF, which never occurs in a value). Cached per set of rows."""
        key = (
            frozenset(q for q, _ in threads),
            frozenset(o for _, obl in threads for o in obl),
            trackers,
        )
        found = self.class_cache.get(key)
        if found is not None:
            return found
        rows = [self.table[q, :MARK] for q in key[0]]
        rows += [self.looks.obligation(*k)[0].table[st, :MARK] for k, st in key[1]]
        rows += [
            self.looks.trackers[i].table[t, :MARK] for i, t in zip(self.tracker_ids, trackers, strict=True) if t >= 0
        ]
        columns = np.ascontiguousarray(np.stack(rows, axis=1).astype(np.int32))
        _, first, cls = np.unique(columns.view(f"V{4 * len(rows)}").reshape(-1), return_index=True, return_inverse=True)
        found = self.class_cache[key] = (first.tolist(), cls.reshape(-1))
        return found

    def accepting(self, threads) -> bool:
        obligation = self.looks.obligation
        return any(self.accept[q] and all(obligation(*key)[0].accept[st] for key, st in obl) for q, obl in threads)

    def run(self) -> tuple[list[np.ndarray], list[bool]]:
        looks = self.looks
        trackers0 = tuple(looks.trackers[i].start for i in self.tracker_ids)
        init = (trackers0, self.closure([(self.start, frozenset())], True, trackers0))
        index = {init: 0}
        order = [init]
        table: list[np.ndarray] = []
        accept: list[bool] = []
        limit = looks.max_states * SUBSET_FACTOR
        if looks.max_built is not None:
            limit = min(limit, looks.max_built)
        i = 0
        while i < len(order):
            if not i & 63 and time.monotonic() > looks.deadline:
                raise _time_budget_error()
            trackers, threads = order[i]
            i += 1
            accept.append(self.accepting(threads))
            reps, cls = self.classes(threads, trackers)
            targets = np.full(len(reps) + 1, -1, dtype=np.int64)
            for c, x in enumerate(reps):
                seeds = self.step(threads, x)
                if not seeds:
                    continue
                moved = tuple(
                    int(looks.trackers[k].table[t, x]) if t >= 0 else -1
                    for k, t in zip(self.tracker_ids, trackers, strict=True)
                )
                nxt = (moved, self.closure(seeds, False, moved))
                j = index.get(nxt)
                if j is None:
                    if len(order) >= limit:
                        if limit == looks.max_built:
                            raise LookTooLarge(f"look-around automaton over {limit} states before minimising")
                        raise _states_error(looks.max_states)
                    j = index[nxt] = len(order)
                    order.append(nxt)
                targets[c] = j
            table.append(np.append(targets[cls], -1))
        return table, accept


class LookTooLarge(ConstraintError):
    """look_dfa's construction passed ``max_built`` states (the caller has a cheaper reading)."""

    code = "look-around-too-large"


def look_dfa(node, any_char: tuple, *, started: float | None = None, max_built: int | None = None) -> ByteDFA:
    """The automaton of the strings ``node`` matches whole, where ``node`` may hold ("look", ...)
    and ("anchor", ...) nodes anywhere (see the section comment). ``any_char``: the set node of
    every character a value may hold (what ``.*`` in a look-ahead's A.* ranges over). Bounded by
    the state limit and the compile time budget counted from ``started`` (default now), and by
    ``max_built`` states of each subset construction when given (LookTooLarge past it)."""
    lim = limits()
    started = time.monotonic() if started is None else started
    looks = _Looks(any_char, started, started + lim.compile_ms / 1000, lim.max_states, max_built)
    dfa = looks.full(node)
    if dfa.num_states > lim.max_states:
        raise _states_error(lim.max_states)
    return dfa
