"""The core's walkers over converter trees (csrc/tree_bindings.cpp) against the Python reference
(``regex._expanded_size``, ``regex._serialize_ast``): the same counts, memo and words on random
trees with shared subtrees, on converted JSON schemas, and clear errors on malformed nodes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ast_trees

from llmserve.constraints import jsonschema, regex
from llmserve.constraints.native import native

trees = ast_trees.trees(ast_trees.byte_sets())


@st.composite
def shared_trees(draw):
    """A tree whose subtrees are used several times over (as the converter shares a $ref's tree)."""
    parts = [draw(trees)]
    for _ in range(draw(st.integers(1, 4))):
        picks = draw(st.lists(st.sampled_from(parts), min_size=1, max_size=4))
        parts.append((draw(st.sampled_from(["cat", "alt"])), picks))
    return parts[-1]


@settings(max_examples=300, deadline=None)
@given(shared_trees(), st.sampled_from([0, 5, 60, 10_000, 2_000_000]))
def test_sizes_and_words_are_the_reference_s(tree, cap):
    assert native.tree_expanded_size(tree, cap) == regex._expanded_size(tree, cap)
    np.testing.assert_array_equal(native.tree_words(tree, regex._dfa_words), regex._serialize_ast(tree))


@settings(max_examples=100, deadline=None)
@given(st.lists(shared_trees(), min_size=2, max_size=5), st.sampled_from([50, 2_000_000]))
def test_the_memo_carries_counts_across_calls_as_the_reference_s(parts, cap):
    """The converter asks about each reference's tree, then about trees holding those."""
    memo, ref = native.TreeSizes(), {}
    for i in range(len(parts)):
        tree = ("cat", parts[: i + 1])
        assert native.tree_expanded_size(tree, cap, memo) == regex._expanded_size(tree, cap, ref)
    assert len(memo) == len(ref)


def test_an_embedded_automaton_counts_its_states_and_writes_its_words():
    dfa = regex.compile_ast(regex.parse("[a-c]{2}x"), classes=True)
    tree = ("cat", [("set", [(48, 57)]), ("dfa", dfa), ("rep", ("dfa", dfa), 1, 3)])
    assert native.tree_expanded_size(tree, 10_000) == regex._expanded_size(tree, 10_000)
    calls = []

    def words(automaton):
        calls.append(automaton)
        return regex._dfa_words(automaton)

    np.testing.assert_array_equal(native.tree_words(tree, words), regex._serialize_ast(tree))
    assert calls == [dfa, dfa]


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$defs": {"s": {"enum": ["x", "yy", 3]}},
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 3},
                "b": {"$ref": "#/$defs/s"},
                "c": {"$ref": "#/$defs/s"},
            },
        },
        {"$defs": {"s": {"type": "string", "pattern": "^[a-z]+$"}}, "type": "array", "items": {"$ref": "#/$defs/s"}},
        {"anyOf": [{"type": "null"}, {"type": "object", "additionalProperties": {"type": "number"}}]},
    ],
)
def test_converted_schemas_count_and_serialise_as_the_reference(schema):
    tree = jsonschema.schema_to_ast(schema)
    assert native.tree_expanded_size(tree, 2_000_000) == regex._expanded_size(tree, 2_000_000)
    np.testing.assert_array_equal(native.tree_words(tree, regex._dfa_words), regex._serialize_ast(tree))


def test_counts_past_int64_saturate_at_the_cap():
    huge = ("rep", ("rep", ("set", [(97, 97)]), 0, 2**62), 0, 2**62)
    assert native.tree_expanded_size(huge, 1000) == 1001 == regex._expanded_size(huge, 1000)


@pytest.mark.parametrize(
    ("node", "error", "match"),
    [
        (["cat", []], ValueError, "not a tuple"),
        (("cat", [True]), ValueError, "not a tuple"),  # a bool is no node (the walk's flags are its own)
        (("cat",), ValueError, "too few fields"),
        (("star", []), ValueError, "unknown kind star"),
        ((7, []), ValueError, "kind is not a string"),
        (("cat", 5), TypeError, "expected a list or tuple"),
        (("rep", ("set", []), 0), ValueError, "too few fields"),
        (("members", [(True, ("set", []), 1)], True), ValueError, "not \\(required, child\\)"),
        (("set", [(1, 2, 3)]), ValueError, "not \\(lo, hi\\)"),
        (("rep", ("set", []), 2**40, None), OverflowError, "int32"),
    ],
)
def test_malformed_nodes_are_refused_with_a_clear_error(node, error, match):
    with pytest.raises(error, match=match):
        native.tree_words(node, regex._dfa_words)
    if error is ValueError and "lo, hi" not in match:
        with pytest.raises(error, match=match):
            native.tree_expanded_size(node, 100)


def test_literal_nodes_are_shared_and_bounded():
    """A literal's characters are shared set nodes (Latin-1's always); the characters held beyond
    those are bounded whatever a schema names, and a literal is the same language after the bound."""
    from llmserve.constraints import regex

    assert regex.literal("ab")[1][0] is regex.literal("ba")[1][1]
    for i in range(2 * regex._CHAR_NODES_HELD):
        assert regex.literal(chr(0x4E00 + i)) == ("cat", [("set", [(0x4E00 + i, 0x4E00 + i)])])
    assert len(regex._CHAR_NODES) <= regex._CHAR_NODES_HELD
    assert regex.literal("é")[1][0] is regex._LATIN_1_NODES["é"]


def test_short_literals_are_one_node_per_text_and_bounded():
    """A schema names ``null`` or a property hundreds of times: one node per short text (nodes are
    never mutated); how many are held, and how long, is bounded."""
    from llmserve.constraints import regex

    assert regex.literal('"name":') is regex.literal('"name":')
    long = "x" * (regex._LITERAL_HELD_CHARS + 1)
    assert regex.literal(long) is not regex.literal(long)
    assert regex.literal(long) == ("cat", [regex._LATIN_1_NODES["x"]] * len(long))
    for i in range(2 * regex._LITERALS_HELD):
        assert regex.literal(f"p{i}") == ("cat", [regex._LATIN_1_NODES[c] for c in f"p{i}"])
    assert len(regex._LITERALS) <= regex._LITERALS_HELD


def test_an_alphabet_holds_every_character_a_tree_may_match():
    """What a stop string is checked against (a superset: look-arounds' characters too; None where
    an embedded automaton over bytes is in the tree)."""
    from llmserve.constraints import regex

    assert regex.alphabet(regex.parse("[0-9]{3}|x+")) == [(0x30, 0x39), (0x78, 0x78)]
    assert regex.alphabet(regex.parse("^a(?=b)$", schema=True)) == [(0x61, 0x62)]
    assert regex.alphabet(("cat", [("dfa", regex.compile_ast(regex.parse("a"))), ("set", [(1, 2)])])) is None
