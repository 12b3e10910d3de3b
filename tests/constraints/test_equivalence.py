"""Property tests: the C++ core and the pure-Python reference agree exactly, and both agree with
Python's ``re`` on what the constraint accepts, over random constraints, vocabularies (tokens that
split UTF-8 characters included), token streams and batch changes."""

from __future__ import annotations

import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import batch_programs
from support.strategies import regexes as shared_regexes
from support.strategies import vocabs as shared_vocabs

from llmserve.constraints import reference
from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.native import native, native_vocab
from llmserve.constraints.regex import compile_regex

ALPHABET = ["a", "b", "é", "€", "😀", '"', "0"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def regexes():
    return shared_regexes(ALPHABET)


def vocabs(full_bytes=True):
    return shared_vocabs(ALPHABET, "all" if full_bytes else "none")


def strings():
    return st.lists(st.sampled_from(ALPHABET), max_size=8).map("".join)


@SETTINGS
@given(regexes(), st.lists(strings(), min_size=1, max_size=10))
def test_dfa_matches_python_re(pattern, samples):
    dfa = compile_regex(pattern)
    for s in samples:
        assert dfa.matches(s.encode()) == bool(re.fullmatch(pattern, s))


@SETTINGS
@given(regexes())
def test_native_dfa_construction_equals_reference(pattern):
    """The C++ subset construction + minimisation gives the reference's table, state for state."""
    a, b = compile_regex(pattern, "native"), compile_regex(pattern, "python")
    np.testing.assert_array_equal(a.table, b.table)
    np.testing.assert_array_equal(a.accept, b.accept)


@SETTINGS
@given(regexes(), vocabs(full_bytes=False))
def test_native_masks_equal_reference(pattern, vocab):
    dfa = compile_regex(pattern)
    a = compile_dfa(dfa, vocab, backend="native")
    b = compile_dfa(dfa, vocab, backend="python")
    assert a.masks.shape == (dfa.num_states + 1, vocab.words)
    np.testing.assert_array_equal(a.masks, b.masks)


@SETTINGS
@given(regexes(), vocabs(), st.data())
def test_allowed_tokens_keep_a_match_reachable(pattern, vocab, data):
    """Walk only allowed tokens; the output stays a prefix of a match and ends in one at EOS."""
    c = compile_dfa(compile_regex(pattern), vocab, backend="native")
    g = c.native
    state, out = c.start, b""
    for _ in range(12):
        allowed = np.flatnonzero(c.allowed(state))
        assert allowed.size > 0
        tok = int(data.draw(st.sampled_from(list(allowed))))
        nxt = g.step(state, tok)
        assert nxt == c.step(state, tok)
        if tok in vocab.eos_ids:
            assert re.fullmatch(pattern, out.decode("utf-8"))
            return
        assert nxt >= 0
        out += vocab.token_bytes(tok)
        state = nxt


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(regexes(), min_size=2, max_size=2), vocabs(), batch_programs(), st.integers(0, 2**31))
def test_batch_native_equals_reference(patterns, vocab, program, seed):
    """Random adds (with prior output: preemption), removes, moves, swaps, appends, truncations
    (diverging history) and steps: fill and fill_apply agree bit for bit."""
    rng = np.random.default_rng(seed)
    grammars = [compile_dfa(compile_regex(p), vocab, backend="python") for p in patterns]
    # the native side starts from lazily computed rows: fills must compute what they need
    lazy = [CompiledConstraint.lazy(vocab, compile_regex(p)) for p in patterns]
    nb, rb = native.Batch(native_vocab(vocab)), reference.ReferenceBatch(vocab)
    lists: dict[int, list[int]] = {}
    for op in program:
        kind = op[0]
        if kind == "add":
            _, i, gi, prior = op
            toks = [int(t) for t in rng.integers(0, vocab.size, prior)]
            lists[i] = toks
            g = grammars[gi] if gi < 2 else None
            nb.set_row(i, lazy[gi].native if g else None, toks)
            rb.set_row(i, g, toks)
        elif kind == "remove":
            nb.clear_row(op[1])
            rb.clear_row(op[1])
        elif kind == "move":
            nb.move(op[1], op[2])
            rb.move(op[1], op[2])
        elif kind == "swap":
            nb.swap(op[1], op[2])
            rb.swap(op[1], op[2])
        elif kind == "append" and op[1] in lists:
            lists[op[1]].append(op[2] % vocab.size)
        elif kind == "truncate" and op[1] in lists:
            del lists[op[1]][max(0, len(lists[op[1]]) - op[2]) :]
        elif kind == "step":
            B = op[1]
            assert nb.sync(B) == rb.sync(B)
            for i in range(B):
                assert nb.row(i) == rb.row(i)
            W = vocab.words + 1
            m1 = np.zeros((B, W), np.uint32)
            m2 = np.zeros((B, W), np.uint32)
            a1 = np.zeros(B, np.uint8)
            a2 = np.zeros(B, np.uint8)
            nb.fill(m1, a1, B)
            rb.fill(m2, a2, B)
            np.testing.assert_array_equal(m1, m2)
            np.testing.assert_array_equal(a1, a2)
            logits = rng.standard_normal((B, vocab.size + int(rng.integers(0, 40)))).astype(np.float32)
            l1, l2 = logits.copy(), logits.copy()
            o1 = np.zeros((B, (logits.shape[1] + 31) // 32), np.uint32)
            o2 = o1.copy()
            nb.fill_apply(l1, o1)
            rb.fill_apply(l2, o2)
            np.testing.assert_array_equal(o1, o2)
            np.testing.assert_array_equal(l1, l2)
            l3 = logits.copy()
            nb.fill_apply(l3)  # without a bitmask output: same logits
            np.testing.assert_array_equal(l3, l2)
            l4 = logits.copy()
            native.apply_bitmask(l4, o1)
            np.testing.assert_array_equal(l4, l2)


def test_apply_bitmask_large_batch_threads():
    rng = np.random.default_rng(0)
    B, V = 64, 50_000
    logits = rng.standard_normal((B, V)).astype(np.float32)
    bits = rng.integers(0, 2**32, (B, (V + 31) // 32), dtype=np.uint32)
    bits[::3] = 0xFFFFFFFF
    bits[1::3] = 0
    out = logits.copy()
    native.apply_bitmask(out, bits)
    allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :V].astype(bool)
    np.testing.assert_array_equal(out, np.where(allowed, logits, -np.inf).astype(np.float32))
