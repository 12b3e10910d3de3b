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
from llmserve.constraints.regex import SUBSET_FACTOR, ByteDFA, _states_error, _time_budget_error, compile_ast


def _byte_classes(tables: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Bytes that every table treats alike share a class: (class of each byte [256], one byte per class).
    The product then steps once per class rather than once per byte."""
    columns = np.concatenate([t.T for t in tables], axis=1)  # [256, sum of S]
    _, first, inverse = np.unique(columns, axis=0, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


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
            raise _time_budget_error(lim.compile_ms)
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
    product = ByteDFA(np.array(rows, dtype=np.int32), np.array(accept, dtype=np.uint8), 0)
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
