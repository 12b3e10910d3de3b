"""The automaton built as it is walked (csrc/lazy_dfa.h, ``regex.lazy_ast``) is the whole automaton's
language, state for state along any walk: the same mask row as the complete (trimmed, minimal) form
at every step, so no token leads into a dead end; and it builds only what walks reach."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import batch_programs, regexes
from support.strategies import vocabs as shared_vocabs

from llmserve.constraints import regex
from llmserve.constraints.budget import UNREACHABLE
from llmserve.constraints.budget import distances as byte_distances
from llmserve.constraints.compiled import compile_dfa
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.jsonschema import _Converter, schema_to_dfa, schema_to_lazy
from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.native import native, native_vocab
from llmserve.constraints.vocab import Vocab

ALPHABET = ["a", "b", "é", "€", "😀", '"', "0", "{", "}", ":", ","]
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def patterns():
    return regexes(ALPHABET, ("(?:ab){0}",), max_leaves=8)


def vocabs():
    return shared_vocabs(ALPHABET, "some")


def lazy_row(lazy, vocab: Vocab, state: int) -> np.ndarray:
    out = np.empty(vocab.words, dtype=np.uint32)
    lazy.mask_row(native_vocab(vocab), state, out)
    return out


def all_forms(pattern: str, vocab: Vocab):
    """(whole automaton, its complete form, the lazy automaton) of ``pattern``; None when the whole
    automaton is refused (over a limit: the strategies draw some)."""
    try:
        whole = regex.compile_regex(pattern)
    except ConstraintError:
        return None
    return whole, compile_dfa(whole, vocab), regex.lazy_ast(regex.parse(pattern))


def assert_same_walks(lazy, complete, vocab: Vocab, choose, steps: int = 14) -> None:
    """Walk tokens both forms allow (``choose`` picks one), comparing each step's mask row."""
    state, full = 0, complete.start
    for _ in range(steps):
        row = lazy_row(lazy, vocab, state)
        np.testing.assert_array_equal(row, complete.mask_row(full))
        assert lazy.accepting(state) == complete.is_accepting(full)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size]
        allowed = [t for t in np.flatnonzero(bits) if t not in vocab.eos_ids]
        if not allowed:
            return
        token = int(choose(allowed))
        state = lazy.walk(vocab.token_bytes(token), state)
        full = complete.step(full, token)
        assert state >= 0 and full >= 0


@SETTINGS
@given(patterns(), vocabs(), st.data())
def test_lazy_rows_are_the_complete_forms_rows_along_any_walk(pattern, vocab, data):
    try:
        complete = compile_dfa(regex.compile_regex(pattern), vocab)
    except ConstraintError as exc:  # an empty language: the lazy form refuses it too
        with pytest.raises(ConstraintError, match="no string"):
            regex.lazy_ast(regex.parse(pattern))
        assert "no string" in exc.message
        return
    lazy = regex.lazy_ast(regex.parse(pattern))
    assert_same_walks(lazy, complete, vocab, lambda allowed: data.draw(st.sampled_from(allowed)))


@SETTINGS
@given(patterns(), vocabs(), st.data())
def test_lazy_distances_and_fewest_tokens_are_the_complete_automatons(pattern, vocab, data):
    """Byte distances read off the NFA (any set of usable bytes) and the token search over the lazy
    automaton give what they give over the whole automaton, state for state along a walk."""
    forms = all_forms(pattern, vocab)
    if forms is None:
        return
    whole, complete, lazy = forms
    nv = native_vocab(vocab)
    drawn = np.frombuffer(data.draw(st.binary(min_size=256, max_size=256)), np.uint8)
    usable_sets = [np.asarray(u, dtype=np.uint8) for u in (vocab.single_bytes, np.ones(256), drawn)]
    expected = [byte_distances(whole.table, whole.accept, u) for u in usable_sets]
    state, full = 0, complete.start
    for _ in range(10):
        for usable, dist in zip(usable_sets, expected, strict=True):
            assert lazy.byte_distance(state, usable) == dist[full]
        assert lazy.fewest_tokens(nv, state)[0] == native.fewest_tokens(nv, whole.table, whole.accept, full)[0]
        row = lazy_row(lazy, vocab, state)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size]
        allowed = [t for t in np.flatnonzero(bits) if t not in vocab.eos_ids]
        if not allowed:
            return
        token = int(data.draw(st.sampled_from(allowed)))
        state, full = lazy.walk(vocab.token_bytes(token), state), complete.step(full, token)


def assert_same_budget_rows(lazy, whole, complete, vocab: Vocab, choose, ks, steps: int = 10) -> None:
    """Along a walk both forms allow, ``LazyDfa.budget_row`` is the whole grammar's ``budget_row`` over
    its byte distances, for every k in ``ks``: with the vocabulary's single bytes usable (what steering
    passes) and with every byte, alternately, so that each row follows a change of the usable set.
    ``max_byte_distance`` bounds every finite distance of the whole automaton and of the states walked."""
    nv = native_vocab(vocab)
    usable_sets = [np.asarray(vocab.single_bytes, dtype=np.uint8), np.ones(256, np.uint8)]
    expected = [byte_distances(whole.table, whole.accept, u) for u in usable_sets]
    bounds = [lazy.max_byte_distance(u) for u in usable_sets]
    for dist, bound in zip(expected, bounds, strict=True):
        finite = dist[dist != UNREACHABLE]
        assert bound >= (int(finite.max()) if finite.size else 0)
    got, want = np.empty(vocab.words, np.uint32), np.empty(vocab.words, np.uint32)
    state, full = 0, complete.start
    for _ in range(steps):
        for k in ks:
            for usable, dist in zip(usable_sets, expected, strict=True):
                got.fill(0xDEADBEEF)  # every word written, not only the allowed ones
                lazy.budget_row(nv, state, usable, k, got)
                want.fill(0)
                complete.native.budget_row(full, dist, k, want)
                np.testing.assert_array_equal(got, want, err_msg=f"k={k}")
        for usable, dist, bound in zip(usable_sets, expected, bounds, strict=True):
            assert lazy.byte_distance(state, usable) == dist[full]
            assert dist[full] == UNREACHABLE or dist[full] <= bound
        bits = np.unpackbits(lazy_row(lazy, vocab, state).view(np.uint8), bitorder="little")[: vocab.size]
        allowed = [t for t in np.flatnonzero(bits) if t not in vocab.eos_ids]
        if not allowed:
            return
        token = int(choose(allowed))
        state, full = lazy.walk(vocab.token_bytes(token), state), complete.step(full, token)


@SETTINGS
@given(patterns(), vocabs(), st.data())
def test_lazy_budget_rows_are_the_whole_grammars_over_byte_distances(pattern, vocab, data):
    forms = all_forms(pattern, vocab)
    if forms is None:
        return
    whole, complete, lazy = forms
    assert_same_budget_rows(lazy, whole, complete, vocab, lambda allowed: data.draw(st.sampled_from(allowed)), range(5))


@pytest.mark.parametrize("pattern", ["", "(?:ab){0}", "a{0}", "(?:)|(?:[ab]{3}){0}"])
def test_the_empty_strings_max_byte_distance_is_0(pattern):
    lazy = regex.lazy_ast(regex.parse(pattern))
    assert lazy.accepting(0) and lazy.walk(b"a") == -1
    assert lazy.max_byte_distance(np.ones(256, np.uint8)) == 0
    assert lazy.max_byte_distance(np.zeros(256, np.uint8)) == 0


def test_max_byte_distance_is_an_upper_bound_read_off_the_nfa():
    """Every state of "[ab]*|a{50}" holds the loop, which accepts: each is at distance 0, while the
    chain's NFA states are up to 50 bytes away. The bound is theirs, and it builds no state."""
    lazy = regex.lazy_ast(regex.parse("[ab]*|a{50}"))
    every = np.ones(256, np.uint8)
    assert lazy.max_byte_distance(every) == 50
    assert lazy.found == 1
    state = 0
    for _ in range(60):
        assert lazy.byte_distance(state, every) == 0
        state = lazy.walk(b"a", state)
    only_b = np.zeros(256, np.uint8)
    only_b[ord("b")] = 1
    assert lazy.max_byte_distance(only_b) == 1  # the chain needs "a": the loop's states alone, one byte at most


OPTIONAL = {
    "type": "object",
    "properties": {
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "name": {"type": "string", "maxLength": 3},
    },
    "required": ["size"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(4))
def test_a_schemas_lazy_budget_rows_are_its_whole_grammars(json_vocab, seed):
    whole = schema_to_dfa(OPTIONAL)
    complete = compile_dfa(whole, json_vocab)
    lazy = schema_to_lazy(OPTIONAL)
    rng = np.random.default_rng(seed)
    assert_same_budget_rows(
        lazy, whole, complete, json_vocab, lambda allowed: rng.choice(allowed), (0, 1, 2, 3, 8, 30), 25
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(patterns(), min_size=2, max_size=2), vocabs(), batch_programs())
def test_a_batch_over_lazy_grammars_fills_what_whole_grammars_fill(pattern_pair, vocab, program):
    """The same batch program over grammars on lazy automata and over the complete forms: every fill
    and fill_apply equal bit for bit, dead rows alike (states are numbered differently)."""
    try:
        whole = [compile_dfa(regex.compile_regex(p), vocab).native for p in pattern_pair]
    except ConstraintError:
        return
    nv = native_vocab(vocab)
    lazy = [native.Grammar.over_lazy(nv, regex.lazy_ast(regex.parse(p))) for p in pattern_pair]
    batches = native.Batch(nv), native.Batch(nv)
    rows: dict[int, list[int]] = {}  # each row's token list, as the batches hold them (shared by both)
    for op in program:
        kind = op[0]
        if kind == "add":
            _, i, gi, prior = op
            rows[i] = [int(t) % vocab.size for t in range(prior)]
            for batch, grammars in zip(batches, (whole, lazy), strict=True):
                batch.set_row(i, grammars[gi] if gi < 2 else None, rows[i])
        elif kind in ("remove", "move", "swap"):
            for batch in batches:
                getattr(batch, "clear_row" if kind == "remove" else kind)(*op[1:])
            _follow(rows, kind, *op[1:])
        elif kind == "append" and op[1] in rows:
            # a token the row allows (mostly: the usual case), or any (a dead row follows)
            rows[op[1]].append(next_token(batches, vocab, op[1], op[2] % 4 != 0, op[2]))
        elif kind == "truncate" and op[1] in rows:
            del rows[op[1]][max(0, len(rows[op[1]]) - op[2]) :]
        elif kind == "step":
            assert_same_fills(batches, vocab, op[1])


def _follow(rows: dict[int, list[int]], kind: str, a: int, b: int | None = None) -> None:
    """``rows`` after the batch change ``kind``: a row cleared, moved from a to b, or swapped."""
    if kind == "remove":
        rows.pop(a, None)
    elif kind == "move" and a != b:
        moved = rows.pop(a, None)
        rows.pop(b, None)
        if moved is not None:
            rows[b] = moved
    elif kind == "swap":
        first, second = rows.pop(a, None), rows.pop(b, None)
        if first is not None:
            rows[b] = first
        if second is not None:
            rows[a] = second


def next_token(batches, vocab: Vocab, i: int, allowed_only: bool, pick: int) -> int:
    """Row i's next token: one it allows now (both batches brought up to date first), or any."""
    for batch in batches:
        batch.sync(i + 1)
    mask = np.zeros((i + 1, vocab.words + 1), np.uint32)
    batches[0].fill(mask, np.zeros(i + 1, np.uint8), i + 1)
    allowed = np.flatnonzero(np.unpackbits(mask[i].view(np.uint8), bitorder="little")[: vocab.size])
    choices = allowed if allowed_only and allowed.size else np.arange(vocab.size)
    return int(choices[pick % choices.size])


def assert_same_fills(batches, vocab: Vocab, B: int) -> None:
    assert batches[0].sync(B) == batches[1].sync(B)
    for i in range(B):
        states = [batch.row(i)[0] for batch in batches]
        assert (states[0] is None) == (states[1] is None)
        if states[0] is not None:
            assert (states[0] < 0) == (states[1] < 0)
    masks = [np.zeros((B, vocab.words + 1), np.uint32) for _ in batches]
    for batch, m in zip(batches, masks, strict=True):
        batch.fill(m, np.zeros(B, np.uint8), B)
    np.testing.assert_array_equal(masks[0], masks[1])
    logits = np.random.default_rng(B).standard_normal((B, vocab.size + 3)).astype(np.float32)
    outs = [logits.copy() for _ in batches]
    for batch, out in zip(batches, outs, strict=True):
        batch.fill_apply(out)  # the path without a bitmask output reads the rows in place
    np.testing.assert_array_equal(outs[0], outs[1])


def test_rows_past_the_first_blocks_fill_as_the_whole_form():
    """A row walks 140 states of a chain: rows land in three blocks of 64, each as the whole form's."""
    vocab = Vocab([b"a", b"aa", b"b", None], (3,), 4)
    nv = native_vocab(vocab)
    pattern = "a{0,150}b?"
    batches = native.Batch(nv), native.Batch(nv)
    tokens: list[int] = []
    batches[0].set_row(0, compile_dfa(regex.compile_regex(pattern), vocab).native, tokens)
    batches[1].set_row(0, native.Grammar.over_lazy(nv, regex.lazy_ast(regex.parse(pattern))), tokens)
    for _ in range(140):
        assert_same_fills(batches, vocab, 1)
        tokens.append(0)
    assert batches[1].row(0)[0] >= 128


def test_a_row_past_the_automatons_state_limit_ends_the_answer():
    """The lazy automaton's state limit (max_states x SUBSET_FACTOR) reached mid-answer: that step is
    dead, and its row allows end of sequence only, never an error inside the batch."""
    vocab = Vocab([b"a", None], (1,), 2)
    nv = native_vocab(vocab)
    set_limits(Limits(max_states=2))  # 16 states for a lazy automaton
    try:
        grammar = native.Grammar.over_lazy(nv, regex.lazy_ast(regex.parse("a{0,40}")))
    finally:
        set_limits(None)
    batch = native.Batch(nv)
    tokens: list[int] = []
    batch.set_row(0, grammar, tokens)
    states = []
    for _ in range(30):
        batch.sync(1)
        states.append(batch.row(0)[0])
        mask = np.zeros((1, vocab.words), np.uint32)
        batch.fill(mask, np.zeros(1, np.uint8), 1)
        allowed = np.flatnonzero(np.unpackbits(mask[0].view(np.uint8), bitorder="little")[: vocab.size])
        if states[-1] < 0:
            assert allowed.tolist() == [1]  # the dead row: end of sequence only
            break
        tokens.append(0)
    assert states[-1] == -1 and max(states) < 16


def test_schema_to_lazy_embeds_references_when_inlined_they_are_over_the_nfa_limit(json_vocab):
    set_limits(Limits(max_nfa_states=40_000))  # inlined, the tree counts 67k (34k per use); embedded, 9k
    try:
        with pytest.raises(ConstraintError, match="40000"):
            regex.lazy_ast(_Converter(EMBEDDING, embed_at=None).convert(EMBEDDING))
        lazy = schema_to_lazy(EMBEDDING)
    finally:
        set_limits(None)
    complete = compile_dfa(schema_to_dfa(EMBEDDING), json_vocab)
    rng = np.random.default_rng(1)
    assert_same_walks(lazy, complete, json_vocab, lambda allowed: rng.choice(allowed), steps=30)


def test_a_lazy_grammar_refuses_what_needs_the_whole_automaton():
    g = native.Grammar.over_lazy(native_vocab(Vocab([b"a", b"b", None], (2,), 3)), regex.lazy_ast(regex.parse("ab")))
    one = np.zeros(1, np.int32)
    for call in (
        g.complete,
        g.compress,
        lambda: g.token_distances(one, one),
        lambda: g.budget_row(0, one, 1, np.zeros(1, np.uint32)),
        lambda: g.rows_into(np.zeros((1, 1), np.uint32)),
        lambda: g.finish_later(1, 1 << 20),
        g.compact_all,
    ):
        with pytest.raises(ValueError, match="lazy"):
            call()
    with pytest.raises(ValueError, match="out of range"):
        g.step(5, 0)  # a state not built yet
    assert g.step(0, 0) >= 0 and g.step(g.step(0, 0), 1) >= 0 and g.step(0, 1) == -1


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "ç"]}, "maxItems": 3},
        "size": {"type": "integer", "minimum": -5, "maximum": 300},
        "when": {"type": "string", "format": "date"},
        "child": {"$ref": "#/$defs/node"},
        "kind": {"anyOf": [{"const": "x"}, {"type": "number"}, {"type": "null"}]},
    },
    "required": ["name"],
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "boolean"}}, "additionalProperties": False}},
}


# references to a tree large enough to be built into an automaton of its own by schema_to_dfa
# (EMBED_AT), which schema_to_lazy inlines
ITEM = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 40} for i in range(8)}}
EMBEDDING = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/item"}, "b": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
    "$defs": {"item": ITEM},
}


@pytest.fixture(scope="module")
def json_vocab():
    text = json.dumps({"name": "ab", "tags": ["a", "ç"], "size": -3, "when": "2024-02-29", "kind": 1.5e3}) + "ntrue"
    pieces = {text[i : i + n].encode() for n in (1, 2, 3) for i in range(len(text) - n + 1)}
    tokens = [bytes([b]) for b in range(32, 127)] + sorted(pieces) + ["ç".encode(), b"\xc3", None]
    return Vocab(tokens, (len(tokens) - 1,), len(tokens) + 7)


@pytest.mark.parametrize("schema", [SCHEMA, EMBEDDING], ids=["schema", "embedding"])
@pytest.mark.parametrize("seed", range(6))
def test_a_schemas_lazy_rows_are_its_complete_rows(json_vocab, schema, seed):
    complete = compile_dfa(schema_to_dfa(schema), json_vocab)
    lazy = schema_to_lazy(schema)
    rng = np.random.default_rng(seed)
    assert_same_walks(lazy, complete, json_vocab, lambda allowed: rng.choice(allowed), steps=60)


def test_batch_rows_walking_a_schema_fill_what_the_whole_form_fills(json_vocab):
    """Three rows of a batch each walk their own allowed tokens through a schema: at every step the
    lazy grammar's fill equals the complete form's (row by row, past the start state)."""
    nv = native_vocab(json_vocab)
    whole = compile_dfa(schema_to_dfa(SCHEMA), json_vocab).native
    lazy = native.Grammar.over_lazy(nv, schema_to_lazy(SCHEMA))  # one form, shared by the rows
    batches = native.Batch(nv), native.Batch(nv)
    rows: list[list[int]] = [[], [], []]
    for i, tokens in enumerate(rows):
        batches[0].set_row(i, whole, tokens)
        batches[1].set_row(i, lazy, tokens)
    rng = np.random.default_rng(0)
    for _ in range(40):
        assert_same_fills(batches, json_vocab, len(rows))
        for i, tokens in enumerate(rows):
            tokens.append(next_token(batches, json_vocab, i, True, int(rng.integers(1 << 30))))
    assert max(len(t) for t in rows) == 40 and any(batches[1].row(i)[0] > 3 for i in range(3))


def test_the_first_mask_builds_a_few_states_of_hundreds(json_vocab):
    whole = schema_to_dfa(SCHEMA)
    assert whole.num_states > 200
    lazy = schema_to_lazy(SCHEMA)
    lazy_row(lazy, json_vocab, 0)
    assert lazy.expanded <= 3 and lazy.found <= 4  # "{" then '{"'; nothing past what tokens reach
    # the shortest answer, '{"name":""}', in bytes off the NFA (no state built) and in tokens
    assert lazy.byte_distance(0, np.ones(256, np.uint8)) == 11
    assert lazy.found <= 4
    whole_tokens = native.fewest_tokens(native_vocab(json_vocab), whole.table, whole.accept, whole.start)[0]
    assert lazy.fewest_tokens(native_vocab(json_vocab))[0] == whole_tokens


def test_a_walk_past_the_state_limit_is_an_error_and_leaves_the_automaton_whole():
    words = regex.serialize_ast(regex.parse("[ab]*a[ab]{12}"))
    rng = np.random.default_rng(0)
    for limit in (3, 5, 64):
        lazy = native.LazyDfa(words, limit, 10_000)  # no time limit per call
        with pytest.raises(ValueError, match=f"more than {limit} automaton states"):
            for _ in range(200):
                lazy.walk(bytes(rng.choice([97, 98], 40).tolist()), 0)
        # states found by the row the limit stopped: each still walks, every one of them is live
        # (every state here allows "a"), or the walk meets the limit again; never a wrong "dead"
        for state in range(lazy.found):
            try:
                assert lazy.walk(b"a", state) >= 0
            except ValueError as exc:
                assert "automaton states" in str(exc)


def test_the_nfa_is_bounded_by_the_compile_limits():
    set_limits(Limits(max_nfa_states=50))
    try:
        with pytest.raises(ConstraintError, match="50 states"):
            regex.lazy_ast(regex.parse("[a-z]{100}"))
    finally:
        set_limits(None)
    with pytest.raises(ValueError, match="state out of range"):
        regex.lazy_ast(regex.parse("abc")).walk(b"a", 5)


@SETTINGS
@given(patterns(), vocabs(), st.data())
def test_the_lazy_greedy_answer_bounds_the_fewest_tokens_from_above(pattern, vocab, data):
    """One shortest answer in bytes cut into the longest tokens, read off the lazy automaton: never
    fewer tokens than the fewest (the whole automaton's search), none only when no string of bytes
    answers, and a count whenever the vocabulary's single bytes spell one (the cut cannot fail)."""
    forms = all_forms(pattern, vocab)
    if forms is None:
        return
    whole, _, lazy = forms
    nv = native_vocab(vocab)
    fewest = native.fewest_tokens(nv, whole.table, whole.accept, whole.start)[0]
    greedy = lazy.greedy_tokens(nv, 0)
    if greedy == UNREACHABLE:  # no answer in bytes: none in tokens
        assert fewest == UNREACHABLE
    elif greedy != -1:  # an answer in tokens
        assert fewest != UNREACHABLE and greedy >= fewest
    if byte_distances(whole.table, whole.accept, vocab.single_bytes)[whole.start] != UNREACHABLE:
        assert greedy != -1


def whole_occurs(whole, text: bytes) -> bool:
    """The reference: ``text`` is read from every state of the trimmed minimal automaton (each one
    reached by some answer, each able to end one) and some state survives it."""
    table = whole.table
    states = np.arange(table.shape[0])
    for b in text:
        moved = table[states, b]
        states = np.unique(moved[moved >= 0])
        if states.size == 0:
            return False
    return True


texts = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4).map(lambda cs: "".join(cs).encode())


@SETTINGS
@given(patterns(), st.lists(st.one_of(texts, texts.map(lambda t: t[1:] or t), texts.map(lambda t: t[:-1] or t))))
def test_a_text_occurs_inside_an_answer_as_in_the_whole_automaton(pattern, drawn):
    """What a stop string is checked by: exactly the factors of the language (a text cut inside a
    character too), however many texts share first bytes."""
    try:
        whole = regex.compile_regex(pattern)
    except ConstraintError:
        return
    lazy = regex.lazy_ast(regex.parse(pattern))
    found = lazy.occurs(drawn, 10**9)
    assert found == [int(whole_occurs(whole, t)) for t in drawn]
    assert lazy.found == 1  # builds no state


def test_occurs_reads_a_bounded_number_of_moves_and_says_when_it_did_not_decide():
    lazy = schema_to_lazy(SCHEMA)
    assert lazy.occurs([b"\x00", b"zzz"], 0) == [-1, -1]
    assert lazy.occurs([b"", b'"name"'], 10**9) == [1, 1]
    assert lazy.occurs([b"\x00"], 10**9) == [0]
    whole = schema_to_dfa(SCHEMA)
    probes = [
        b'"size":-5',
        b'"size":-6',
        b'"size":300',
        b"301",
        b'"c"',
        b'"\xc3\xa7"]',
        b'"v":1',
        b'{"v":true}',
        b"END",
    ]
    found = lazy.occurs(probes, 10**9)
    assert found == [int(whole_occurs(whole, t)) for t in probes] and set(found) == {0, 1}
