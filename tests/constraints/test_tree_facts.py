"""What the NFA would be, read off a tree without building it (csrc/tree_facts.h, ``regex.tree_facts``):
the same states and moves as the NFA ``LazyDfa`` builds, a shortest answer it accepts (as short as
its byte distance, over the same bytes), malformed words refused as the builder refuses them; and a
frontend's check that admits a new constraint from these facts, leaving the NFA to the engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ast_trees

from llmserve.constraints import compiler, regex
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.limits import Limits, limits, set_limits
from llmserve.constraints.native import native
from llmserve.constraints.spec import spec_from_request
from llmserve.constraints.vocab import Vocab

INT32_MAX = 2**31 - 1
ASCII_LETTERS = np.zeros(256, np.uint8)
ASCII_LETTERS[ord("a") : ord("z") + 1] = 1
NO_COMMA = np.ones(256, np.uint8)
NO_COMMA[ord(",")] = 0
BELOW_C3 = np.zeros(256, np.uint8)  # some two-byte sequences, no longer one
BELOW_C3[:0xC3] = 1


def _leaf():
    narrow = st.lists(ast_trees.ranges(0x7F), max_size=4)
    wide = st.lists(st.one_of(ast_trees.ranges(0xFF), ast_trees.ranges(0x10FFFF)), max_size=3)  # multi-byte
    embedded = st.sampled_from(["ab|c", "[0-9]{2,3}", "x*", "é+"]).map(lambda p: ("dfa", regex.compile_regex(p)))
    return st.one_of(narrow.map(lambda rs: ("set", rs)), wide.map(lambda rs: ("set", rs)), embedded)


trees = ast_trees.trees(_leaf(), max_leaves=30)


def check_facts(words: np.ndarray, usable: np.ndarray) -> None:
    lazy = regex.lazy_words(words)
    states, moves, answer = native.tree_facts(words, usable, 2_000_000)
    assert (states, moves) == tuple(lazy.nfa_size)
    distance = lazy.byte_distance(0, usable)
    if answer is None:
        assert distance == INT32_MAX
        return
    assert len(answer) == distance
    assert all(usable[b] for b in answer)
    end = lazy.walk(answer, 0)
    assert end >= 0 and lazy.accepting(end), answer


@settings(max_examples=300, deadline=None)
@given(trees, st.sampled_from([regex.EVERY_BYTE, ASCII_LETTERS, NO_COMMA, BELOW_C3]))
def test_facts_are_the_nfas_and_the_answer_a_shortest_one(tree, usable):
    words = regex.serialize_ast(tree)
    try:
        regex.lazy_words(words)
    except ConstraintError as exc:  # an empty language: the facts say so by having no answer
        assert regex.EMPTY_LANGUAGE in exc.message
        assert native.tree_facts(words, regex.EVERY_BYTE, 2_000_000)[2] is None
        return
    check_facts(words, usable)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "format": "date-time"}, "b": {"type": "integer"}}},
        {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["x", "yy"]}, "minItems": 2}}},
        {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{3}$"}}, "required": ["id"]},
        {"anyOf": [{"type": "number", "minimum": 10}, {"type": "boolean"}]},
        {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}, "minProperties": 1},
    ],
)
def test_facts_of_converted_schemas(schema):
    from llmserve.constraints.jsonschema import schema_words

    words = schema_words(schema)
    for usable in (regex.EVERY_BYTE, ASCII_LETTERS):
        check_facts(words, usable)


def test_past_the_cap_the_walk_stops_as_the_builder_does():
    words = regex.serialize_ast(regex.parse("[a-z]{50}"))
    states, moves, answer = native.tree_facts(words, regex.EVERY_BYTE, 2_000_000)
    assert answer == b"a" * 50
    assert native.tree_facts(words, regex.EVERY_BYTE, states) == (states, moves, answer)
    native.LazyDfa(words, 100, states)  # exactly at the limit: built
    assert native.tree_facts(words, regex.EVERY_BYTE, states - 1) == (states, 0, None)
    with pytest.raises(ValueError, match="too large"):
        native.LazyDfa(words, 100, states - 1)
    # over the limit before a malformed word: the builder stops at the limit, and so does the walk
    over_then_bad = np.array([1, 3, 3, 30, 30, 0, 1, 97, 97, 3, 30, 30, 0, 1, 97, 97, 9], np.int32)
    with pytest.raises(ValueError, match="too large"):
        native.LazyDfa(over_then_bad, 100, 100)
    assert native.tree_facts(over_then_bad, regex.EVERY_BYTE, 100) == (101, 0, None)


def test_answers_do_not_outgrow_the_cap():
    """Children each just under the cap, 400 of them: the walk stops at the second instead of
    building 400 megabyte-long answers (bounded by time alone)."""
    import resource

    child = [3, 1000, 1000, 3, 998, 998, 0, 1, 97, 97]  # ~2M states, a 1 MB answer
    words = np.array([1, 400] + child * 400, np.int32)
    alone = native.tree_facts(np.array(child, np.int32), regex.EVERY_BYTE, 2_000_000)
    assert alone[0] <= 2_000_000 and len(alone[2]) == 998_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert native.tree_facts(words, regex.EVERY_BYTE, 2_000_000) == (2_000_001, 0, None)
    members = np.array([5, 400, 1, *([1, *child] * 400)], np.int32)
    assert native.tree_facts(members, regex.EVERY_BYTE, 2_000_000) == (2_000_001, 0, None)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB
    huge_cap = native.tree_facts(np.array(child, np.int32), regex.EVERY_BYTE, 2**62)
    assert huge_cap == alone


@pytest.mark.parametrize(
    "words",
    [
        [],
        [9, 0],
        [0, 1, 5],
        [0, 1, 5, 0x110000],
        [1, 2, 0, 0],
        [0, 0, 7],
        [3, 2, 1, 0, 0],
        [4, 2, 5, 1, 1, 0, 0],
        [4, 1, 0, 1, 1, 0, 300, 0],
        [5, 1, 0, 1],
        [0, -1],
    ],
)
def test_malformed_words_are_refused_as_the_builder_refuses_them(words):
    ast = np.array(words, dtype=np.int32)
    with pytest.raises(ValueError) as built:
        native.LazyDfa(ast, 100, 100)
    with pytest.raises(ValueError) as walked:
        native.tree_facts(ast, regex.EVERY_BYTE, 100)
    assert str(walked.value) == str(built.value)


def test_a_walk_out_of_time_is_refused():
    many = 1_000_000
    ast = np.concatenate([np.array([1, many], np.int32), np.tile(np.array([0, 1, 97, 97], np.int32), many)])
    with pytest.raises(ValueError, match="time budget"):
        native.tree_facts(ast, regex.EVERY_BYTE, 10_000_000, 1)


def test_inputs_are_checked():
    ast = regex.serialize_ast(regex.parse("a"))
    with pytest.raises(ValueError, match="usable"):
        native.tree_facts(ast, np.ones(255, np.uint8), 10)
    with pytest.raises(ValueError, match="cap"):
        native.tree_facts(ast, regex.EVERY_BYTE, -1)


@pytest.fixture(autouse=True)
def fresh():
    compiler._MEMORY.clear()
    before = limits()
    yield
    set_limits(before)
    compiler._MEMORY.clear()


SCHEMA = {"json_schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}


def _vocab() -> Vocab:
    tokens: list[bytes | None] = [bytes([b]) for b in range(256)] + [b'{"a":"', b'"}', None]
    return Vocab(tokens, (len(tokens) - 1,), len(tokens))


def test_the_check_admits_from_the_facts_and_leaves_the_nfa_to_the_engine(monkeypatch, tmp_path):
    built = []
    real = compiler.lazy_words
    monkeypatch.setattr(compiler, "lazy_words", lambda *a, **kw: built.append(1) or real(*a, **kw))
    spec = spec_from_request(SCHEMA)
    compiler.check_constraint(spec, cache_dir=tmp_path)
    found = compiler.shortest_answer(SCHEMA, _vocab(), cache_dir=tmp_path, within=10)
    assert built == [], "the frontend built the NFA"
    assert (found.tokens, found.bound) == (2, "at most")  # {"a":"  "}
    compiler._MEMORY.clear()  # the engine, another process, builds it from the kept tree
    form = compiler.serving_form(SCHEMA, _vocab(), cache_dir=tmp_path)
    assert isinstance(form, compiler.LazyConstraint) and built == [1]


def test_a_budget_the_greedy_answer_does_not_fit_is_searched_exactly():
    found = compiler.shortest_answer(SCHEMA, _vocab(), cache_dir=False, within=1)
    assert (found.tokens, found.bound) == (2, "exact")


def test_an_empty_language_is_refused_by_the_check_and_remembered(monkeypatch):
    spec = spec_from_request({"regex": "a{0}b[^\\x00-\\U0010FFFF]"})
    walks = []
    real = compiler.tree_facts
    monkeypatch.setattr(compiler, "tree_facts", lambda *a, **kw: walks.append(1) or real(*a, **kw))
    for _ in range(2):
        with pytest.raises(ConstraintError, match="matches no string"):
            compiler.check_constraint(spec, cache_dir=False)
    assert walks == [1]


def test_an_nfa_near_its_memory_limit_is_checked_by_building_it(monkeypatch):
    """Facts past half the memory budget (the NFA takes 64 bytes a state and 8 a move, then its start
    state's subset) leave the check to the NFA's build, as before the facts: here 0.87 MB of 1 MiB."""
    set_limits(Limits(compile_mb=1))
    spec = spec_from_request({"regex": "([a-z]{1000}){6}"})
    built = []
    real = compiler.lazy_words
    monkeypatch.setattr(compiler, "lazy_words", lambda *a, **kw: built.append(1) or real(*a, **kw))
    assert compiler._tree_facts(spec, False, regex.EVERY_BYTE) is None
    compiler.check_constraint(spec, cache_dir=False)
    assert built == [1]
    set_limits(Limits(compile_mb=2))
    compiler._MEMORY.clear()
    assert compiler._tree_facts(spec, False, regex.EVERY_BYTE) == regex.TreeFacts(12021, 12020, b"a" * 6000)
    compiler.check_constraint(spec, cache_dir=False)
    assert built == [1]
