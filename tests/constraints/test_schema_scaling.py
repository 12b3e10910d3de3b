"""Compile cost of large and nested JSON schemas (issue #17): the structures real schemas repeat
(objects of optional properties, arrays, nesting) build each value once, whatever the depth. No
vocabulary, no engine: the automaton only."""

from __future__ import annotations

import itertools
import json
import random
import time

import jsonschema
import pytest

from llmserve.constraints.budget import distances
from llmserve.constraints.jsonschema import schema_to_ast
from llmserve.constraints.regex import compile_ast, expanded_size, literal, parse


def same_table(ast):
    """The native core and the Python reference build the same minimal automaton."""
    a, b = compile_ast(ast, "native"), compile_ast(ast, "python")
    assert a.num_states == b.num_states
    assert (a.table == b.table).all() and (a.accept == b.accept).all()
    return a


@pytest.mark.parametrize("at_least_one", [False, True])
@pytest.mark.parametrize("required", list(itertools.product([True, False], repeat=3)))
def test_members_node_is_the_language_of_optional_members(required, at_least_one):
    values = ["a", "bb", "ccc"]
    dfa = same_table(
        ("members", list(zip(required, [literal("a"), literal("bb"), parse("c+")], strict=True)), at_least_one)
    )
    for k in range(4):
        for chosen in itertools.combinations(range(3), k):
            text = ",".join(values[i] for i in chosen)
            ok = all(i in chosen for i in range(3) if required[i]) and not (at_least_one and k == 0)
            assert dfa.matches(text.encode()) == ok, text
    assert not dfa.matches(b",a") and not dfa.matches(b"a,") and not dfa.matches(b"bb,a")


@pytest.mark.parametrize("lo,hi", [(0, None), (1, None), (3, None), (0, 0), (0, 2), (1, 3), (2, 2)])
def test_list_node_is_comma_separated_repetition(lo, hi):
    dfa = same_table(("list", parse("ab?"), lo, hi))
    for n in range(6):
        for items in itertools.product(["a", "ab"], repeat=n):
            assert dfa.matches(",".join(items).encode()) == (n >= lo and (hi is None or n <= hi))
    assert not dfa.matches(b",a") and not dfa.matches(b"a,")


def nested(depth: int) -> dict:
    schema: dict = {"type": "string", "maxLength": 3}
    for _ in range(depth):
        schema = {
            "type": "object",
            "properties": {
                "x": {"type": "integer"},
                "n": schema,
                "y": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "boolean"}}}},
            },
        }
    return schema


def test_nested_objects_and_arrays_build_each_value_once():
    # each object's members and each array's items used to be written twice (before and after a
    # comma): 16 levels expanded to more than 2M NFA states and were refused
    schema = nested(16)
    ast = schema_to_ast(schema)
    assert expanded_size(ast, 2_000_000) < 20_000
    t = time.perf_counter()
    dfa = compile_ast(ast)
    assert time.perf_counter() - t < 1.0
    dist = distances(dfa.table, dfa.accept)
    rng = random.Random(7)
    for _ in range(20):  # random accepted answers (steered to end within 400 bytes) validate
        state, out = dfa.start, bytearray()
        while not (dfa.accept[state] and rng.random() < 0.2):
            live = [b for b in range(256) if dfa.table[state, b] >= 0 and dist[dfa.table[state, b]] < 400 - len(out)]
            if not live:
                break
            out.append(rng.choice(live))
            state = int(dfa.table[state, out[-1]])
        jsonschema.validate(json.loads(out.decode()), schema)
