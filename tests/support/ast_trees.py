"""Hypothesis strategies for the converter's tuple trees (the nodes ``regex.serialize_ast`` writes):
random trees of every inner node kind over the leaves a test gives."""

from __future__ import annotations

from hypothesis import strategies as st


def ranges(top: int):
    """One code-point range within [0, top]."""
    return st.tuples(st.integers(0, top), st.integers(0, top)).map(lambda r: (min(r), max(r)))


def byte_sets():
    """A set of up to 4 ranges of code points below 256."""
    return st.lists(ranges(255), max_size=4).map(lambda rs: ("set", rs))


def _count():
    return st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 9))).map(
        lambda lh: (lh[0], None if lh[1] is None else max(lh))
    )


def inner(children):
    """cat, alt, rep, list and members nodes over ``children``."""
    seq = st.lists(children, max_size=4)
    return st.one_of(
        seq.map(lambda cs: ("cat", cs)),
        seq.map(lambda cs: ("alt", tuple(cs))),  # children as a tuple too, as regex.parse builds them
        st.tuples(children, _count()).map(lambda t: ("rep", t[0], *t[1])),
        st.tuples(children, _count()).map(lambda t: ("list", t[0], *t[1])),
        st.tuples(st.lists(st.tuples(st.booleans(), children), max_size=3), st.booleans()).map(
            lambda t: ("members", t[0], t[1])
        ),
    )


def trees(leaves, max_leaves: int = 40):
    return st.recursive(leaves, inner, max_leaves=max_leaves)
