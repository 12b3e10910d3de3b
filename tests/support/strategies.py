"""Hypothesis strategies shared by the constraint core's property tests: regular expressions over a
small alphabet (multi-byte characters included) and vocabularies cut from the same characters (tokens
that split a UTF-8 character included)."""

from __future__ import annotations

import re

from hypothesis import strategies as st

from llmserve.constraints.vocab import Vocab


def regexes(alphabet: list[str], extra_atoms: tuple[str, ...] = (), max_leaves: int = 6):
    atom = st.sampled_from([re.escape(c) for c in alphabet] + ["[ab]", "[^a]", "[é€]", "[0-9]", ".", *extra_atoms])

    def extend(inner):
        return st.one_of(
            st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
            inner.map(lambda r: f"(?:{r})*"),
            inner.map(lambda r: f"(?:{r})?"),
            st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(lambda t: f"(?:{t[0]}){{{t[1]},{t[1] + t[2]}}}"),
        )

    return st.recursive(atom, extend, max_leaves=max_leaves)


@st.composite
def vocabs(draw, alphabet: list[str], singles: str = "all"):
    """Tokens: single bytes ("all" of the alphabet's, "some" of them: bytes no token starts, or
    "none"), then pieces of 1-5 bytes, two specials without bytes, end of sequence, and a model
    vocabulary wider than the tokenizer's."""
    encoded = b"".join(c.encode() for c in alphabet)
    pieces = draw(
        st.lists(
            st.integers(0, len(encoded) - 1).flatmap(
                lambda i: st.integers(i + 1, min(len(encoded), i + 5)).map(lambda j: encoded[i:j])
            ),
            min_size=3,
            max_size=40,
        )
    )
    every = sorted(set(encoded))
    chosen = {"all": every, "none": [], "some": draw(st.lists(st.sampled_from(every), max_size=12, unique=True))}
    tokens: list[bytes | None] = [bytes([b]) for b in chosen[singles]]
    tokens += pieces
    tokens += [None, None]  # specials without bytes
    pad = draw(st.integers(0, 40))  # model vocabulary wider than the tokenizer's
    eos = len(tokens)
    tokens.append(None)
    return Vocab(tokens, (eos,), len(tokens) + pad)


@st.composite
def batch_programs(draw):
    """Batch changes: rows added (with earlier output: a preempted request, grammar 2 = none),
    removed, moved, swapped, given a token, cut back (a diverging history), and steps of B rows."""
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        ops.append(
            draw(
                st.one_of(
                    st.tuples(st.just("add"), st.integers(0, 5), st.integers(0, 2), st.integers(0, 3)),
                    st.tuples(st.just("remove"), st.integers(0, 5)),
                    st.tuples(st.just("move"), st.integers(0, 5), st.integers(0, 5)),
                    st.tuples(st.just("swap"), st.integers(0, 5), st.integers(0, 5)),
                    st.tuples(st.just("append"), st.integers(0, 5), st.integers(0, 10**6)),
                    st.tuples(st.just("truncate"), st.integers(0, 5), st.integers(0, 3)),
                    st.tuples(st.just("step"), st.integers(1, 6)),
                )
            )
        )
    return ops
