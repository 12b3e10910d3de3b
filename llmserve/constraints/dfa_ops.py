"""Intersection of byte automata: what a regular expression cannot say in one piece.

JSON Schema puts several conditions on one value at once (a ``pattern``, a ``format`` and length
bounds on the same string; two ``pattern``s merged from ``allOf``). Each is regular on its own; the
value must satisfy all of them, which is the product automaton. The result is embedded in the
schema's AST as a ``("dfa", ByteDFA)`` node and built into the whole automaton as it is.
"""

from __future__ import annotations

import time

import numpy as np

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.limits import limits
from llmserve.constraints.regex import (
    SUBSET_FACTOR,
    ByteDFA,
    _equivalence_classes,
    _states_error,
    _time_budget_error,
    compile_ast,
)

# successors a product builds between two checks of the clock and the state limit (~2 MB of arrays)
PRODUCT_CHUNK = 1 << 16
# rows of a product turned from byte classes into bytes between two checks of the clock (8 MB)
EXPAND_CHUNK = 8192


def _byte_classes(tables: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Bytes that every table treats alike share a class: (class of each byte [256], one byte per class).
    The product then steps once per class rather than once per byte. Classes are numbered in the
    order of their columns (lexicographic, as ``np.unique(columns, axis=0)`` numbers them): the
    distinct columns are found by their bytes and only those few are sorted."""
    columns = np.ascontiguousarray(np.concatenate([t.T for t in tables], axis=1), dtype=np.int32)  # [256, sum of S]
    seen: dict[bytes, int] = {}
    first_of: list[int] = []
    group = np.empty(256, dtype=np.int64)
    for b in range(256):
        g = seen.setdefault(columns[b].tobytes(), len(seen))
        if g == len(first_of):
            first_of.append(b)
        group[b] = g
    distinct = columns[first_of]  # [G, sum of S], in order of first byte
    rank = np.lexsort(distinct.T[::-1]) if distinct.shape[1] else np.arange(len(first_of))  # sorted order of groups
    class_of_group = np.empty(len(first_of), dtype=np.int64)
    class_of_group[rank] = np.arange(len(first_of))
    return class_of_group[group], np.asarray(first_of, dtype=np.int64)[rank]


def _product(
    dfas: list[ByteDFA],
    tables: list[np.ndarray],
    cls_of: np.ndarray,
    reps: np.ndarray,
    limit: int,
    deadline: float,
    budget_ms: int,
) -> ByteDFA:
    """The product automaton of ``dfas`` (reachable pairs from the starts, untrimmed), its states
    numbered as a breadth-first search from the start meets them (state by state, class by class).
    One frontier at a time with arrays: a product state is the mixed-radix number of its states."""
    sizes = [t.shape[0] for t in tables]
    weights: list[int] = []
    radix = 1
    for n in sizes:
        weights.append(radix)
        radix *= n
    if radix >= 1 << 62:  # the numbers would overflow: state by state
        return _product_by_state(dfas, tables, cls_of, reps, limit, deadline, budget_ms)
    steps = [t[:, reps].astype(np.int64) for t in tables]  # [S_i, classes]
    accepts = [np.asarray(d.accept) != 0 for d in dfas]
    k, width = len(dfas), len(reps)
    start = sum(d.start * w for d, w in zip(dfas, weights, strict=True))
    index = {start: 0}
    cur = np.array([[d.start for d in dfas]], dtype=np.int64)  # the frontier's states' states, [n, k]
    rows: list[np.ndarray] = []
    accept: list[np.ndarray] = []
    total = 1
    # a frontier is expanded in ordered chunks of at most PRODUCT_CHUNK successors, each checked
    # against the clock and the state limit before the next is built: one wide frontier would
    # otherwise build arrays of millions of entries past both. States found by an earlier chunk are
    # in `index` already, so the numbering is the same as over the whole frontier at once.
    chunk = max(1, PRODUCT_CHUNK // max(width, 1))
    while len(cur):
        found_parts: list[np.ndarray] = []
        for at in range(0, len(cur), chunk):
            if time.monotonic() > deadline:
                raise _time_budget_error(budget_ms)
            part = cur[at : at + chunk]
            frontier = len(part)
            ok = np.ones(frontier, dtype=bool)
            keys = np.zeros((frontier, width), dtype=np.int64)
            live = np.ones((frontier, width), dtype=bool)
            for i in range(k):
                ok &= accepts[i][part[:, i]]
                nxt = steps[i][part[:, i]]  # [frontier, classes]
                live &= nxt >= 0
                keys += nxt * weights[i]
            flat = keys.ravel()
            where = np.flatnonzero(live.ravel())
            uniq, first, inverse = np.unique(flat[where], return_index=True, return_inverse=True)
            ids = np.empty(len(uniq), dtype=np.int64)
            fresh: list[int] = []
            for u, key in enumerate(uniq.tolist()):
                j = index.get(key)
                if j is None:
                    fresh.append(u)
                else:
                    ids[u] = j
            if fresh:
                new = np.asarray(fresh, dtype=np.int64)
                new = new[np.argsort(first[new], kind="stable")]  # numbered as the search meets them
                if total + len(new) > limit * SUBSET_FACTOR:  # minimised below, then held to the limit
                    raise _states_error(limit)
                ids[new] = np.arange(total, total + len(new))
                found = uniq[new]
                index.update(zip(found.tolist(), range(total, total + len(new)), strict=True))
                total += len(new)
                found_parts.append(found)
            out = np.full(frontier * width, -1, dtype=np.int32)  # state numbers stay under the limit
            out[where] = ids[inverse.reshape(-1)]
            rows.append(out.reshape(frontier, width))  # by class: bytes only once the product is whole
            accept.append(ok)
        if found_parts:
            found = found_parts[0] if len(found_parts) == 1 else np.concatenate(found_parts)
            cur = np.stack([(found // w) % n for w, n in zip(weights, sizes, strict=True)], axis=1)
        else:
            cur = cur[:0]
    narrow = rows[0] if len(rows) == 1 else np.concatenate(rows)
    # by byte, EXPAND_CHUNK rows at a time between checks of the clock: hundreds of thousands of
    # states make hundreds of MB
    table = np.empty((narrow.shape[0], 256), dtype=np.int32)
    for at in range(0, narrow.shape[0], EXPAND_CHUNK):
        if time.monotonic() > deadline:
            raise _time_budget_error(budget_ms)
        table[at : at + EXPAND_CHUNK] = narrow[at : at + EXPAND_CHUNK][:, cls_of]
    return ByteDFA(table, np.concatenate(accept).astype(np.uint8), 0)


def _product_by_state(
    dfas: list[ByteDFA],
    tables: list[np.ndarray],
    cls_of: np.ndarray,
    reps: np.ndarray,
    limit: int,
    deadline: float,
    budget_ms: int,
) -> ByteDFA:
    """``_product`` one state at a time (tuples of states: any number of automata of any size)."""
    start = tuple(d.start for d in dfas)
    index = {start: 0}
    order = [start]
    rows: list[list[int]] = []
    accept: list[bool] = []
    i = 0
    while i < len(order):
        cur = order[i]
        i += 1
        if not i & 255 and time.monotonic() > deadline:
            raise _time_budget_error(budget_ms)
        accept.append(all(bool(d.accept[q]) for d, q in zip(dfas, cur, strict=True)))
        by_class = np.full(len(reps), -1, dtype=np.int64)
        nxt = np.stack([t[q, reps] for t, q in zip(tables, cur, strict=True)])  # [k, classes]
        live = (nxt >= 0).all(axis=0)
        for c in np.flatnonzero(live):
            key = tuple(int(x) for x in nxt[:, c])
            j = index.get(key)
            if j is None:
                if len(order) >= limit * SUBSET_FACTOR:  # minimised below, then held to the limit
                    raise _states_error(limit)
                j = index[key] = len(order)
                order.append(key)
            by_class[c] = j
        rows.append(by_class[cls_of].tolist())
    return ByteDFA(np.array(rows, dtype=np.int32), np.array(accept, dtype=np.uint8), 0)


def intersect(dfas: list[ByteDFA], max_states: int | None = None, *, started: float | None = None) -> ByteDFA:
    """The automaton of the strings every one of ``dfas`` accepts (trimmed, minimal).
    ConstraintError when no string is accepted by all, or past the state limit or the compile time
    budget (counted from ``started``, a ``time.monotonic()``; default now)."""
    if len(dfas) == 1:
        return dfas[0]
    lim = limits()
    started = time.monotonic() if started is None else started
    deadline = started + lim.compile_ms / 1000
    limit = lim.max_states if max_states is None else max_states
    tables = [np.asarray(d.table) for d in dfas]
    cls_of, reps = _byte_classes(tables)
    product = _product(dfas, tables, cls_of, reps, limit, deadline, lim.compile_ms)
    try:
        # trimmed and minimised by the core, inside the same budget (Python's minimisation took
        # seconds on a product of a few thousand states)
        out = compile_ast(("dfa", product), started=started)
    except ConstraintError as exc:
        if "matches no string" not in exc.message:
            raise
        raise ConstraintError("no string satisfies all of the conditions on this value at once") from None
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
        if "no string satisfies" in exc.message or "matches no string" in exc.message:
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
