"""The narrower subset ``schema_to_dfa`` builds when a schema's automaton is over the state limit
(``jsonschema.NARROW_*``): unconstrained values one level deep, no recursion, long
``maxLength`` cut. Every answer still validates; a schema that fits is built exactly as before; a
schema that does not fit even narrowed is refused naming the limit, as before (issue #17, the
corpus's "more than 20000 automaton states" refusals)."""

from __future__ import annotations

import json
import random
import time

import jsonschema
import pytest
from support.automata import steered_walk

from llmserve.constraints import ConstraintError
from llmserve.constraints.jsonschema import NARROW_MAX_LENGTH, schema_to_dfa
from llmserve.constraints.limits import Limits, limits, set_limits
from llmserve.constraints.regex import compile_ast


@pytest.fixture
def max_states():
    def set_to(n: int) -> None:
        set_limits(Limits(max_states=n))

    yield set_to
    set_limits(None)


def walk(dfa, rng: random.Random, budget: int) -> bytes:
    return steered_walk(dfa, rng, budget, stop=0.05)


def assert_answers_valid(dfa, schema, n=40, budget=600):
    rng = random.Random(0)
    for _ in range(n):
        jsonschema.validate(json.loads(walk(dfa, rng, budget).decode()), schema)


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


LONG_TEXT = {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 80}, "body": {"type": "string", "maxLength": 4000}},
    "required": ["body"],
}


def test_a_long_max_length_over_the_state_limit_is_cut(caplog, max_states):
    """``maxLength: 4000`` alone is ~52k states (13 per counted character): over a limit of
    20,000, so the narrow try keeps bodies of at most NARROW_MAX_LENGTH characters."""
    max_states(20000)
    with caplog.at_level("WARNING", logger="llmserve.constraints"):
        dfa = schema_to_dfa(LONG_TEXT)
    # the subset is never silent: the server log says the language is smaller than the schema's
    [warning] = [r.getMessage() for r in caplog.records if "narrower subset" in r.getMessage()]
    assert "over the limit" in warning and f"at most {NARROW_MAX_LENGTH} characters" in warning
    assert dfa.num_states < 20_000
    assert dfa.matches(_compact({"body": "x" * NARROW_MAX_LENGTH}).encode())
    assert not dfa.matches(_compact({"body": "x" * (NARROW_MAX_LENGTH + 1)}).encode())
    assert dfa.matches(_compact({"summary": "é" * 80, "body": ""}).encode())
    assert not dfa.matches(_compact({"summary": "s" * 81, "body": ""}).encode())  # short bounds stay exact
    assert_answers_valid(dfa, LONG_TEXT)


def test_a_schema_too_slow_as_given_leaves_time_for_its_subset():
    """The schema as given gets only jsonschema.WIDE_SHARE of the compile budget, so that a first
    try that runs out of time still leaves the rest for the subset (free-form values one level
    deep). Where a first try took the whole budget, nothing was left. The first try is made slow
    here on purpose (the real construction of this schema is now too fast to run out of time): it
    uses all the time it is given, as a schema too large to build in time does."""
    set_limits(Limits(compile_ms=1000))
    schema = {"type": "object", "properties": {f"p{i}": {} for i in range(120)}}
    tries: list[float] = []

    def first_try_runs_out(ast, backend="native", *, started=None, sizes=None):
        tries.append(time.monotonic())
        if len(tries) == 1:
            assert started is not None
            deadline = started + limits().compile_ms / 1000
            while time.monotonic() < deadline:
                time.sleep(0.005)
            raise ConstraintError("constraint compile time budget (1000 ms) exceeded (limit: 1000 ms)")
        return compile_ast(ast, backend, started=started, sizes=sizes)

    try:
        began = time.monotonic()
        dfa = schema_to_dfa(schema, build=first_try_runs_out)
    finally:
        set_limits(None)
    assert len(tries) == 2 and tries[1] - began < 1.0  # the subset was tried within the budget
    assert dfa.matches(b'{"p0":[1,"a"],"p119":{"k":null}}')
    assert not dfa.matches(b'{"p0":[[1]]}')  # nested two levels: outside the subset
    assert_answers_valid(dfa, schema, n=10)


def test_a_schema_that_fits_is_built_exactly(caplog):
    schema = {"type": "object", "properties": {"body": {"type": "string", "maxLength": 1000}}, "required": ["body"]}
    with caplog.at_level("WARNING", logger="llmserve.constraints"):
        dfa = schema_to_dfa(schema)
    assert not [r for r in caplog.records if "narrower subset" in r.getMessage()]
    assert dfa.matches(_compact({"body": "x" * 1000}).encode())
    assert not dfa.matches(_compact({"body": "x" * 1001}).encode())


FREE_FORM = {"type": "object", "properties": {f"p{i}": {} for i in range(8)}, "required": ["p0"]}


def test_unconstrained_values_over_the_state_limit_are_one_level_deep(max_states):
    deep = json.dumps({"p0": {"a": [1, {"b": 2}]}}).replace(" ", "")
    assert schema_to_dfa(FREE_FORM).matches(deep.encode())  # fits the default limit: depth 3
    max_states(2000)  # 8 free-form values of ~620 states each do not fit; one level deep they do
    dfa = schema_to_dfa(FREE_FORM)
    assert not dfa.matches(deep.encode())
    assert dfa.matches(b'{"p0":{"a":1,"b":"x"},"p7":[true,null]}')
    assert_answers_valid(dfa, FREE_FORM)


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "format": "email"},
                "tags": {"type": "array", "items": {"type": "string", "format": "date-time"}},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["name"],
        }
    },
    "$ref": "#/$defs/node",
}


def test_recursion_over_the_state_limit_is_not_followed(max_states):
    nested = b'{"name":"a@b.io","children":[{"name":"c@d.io","children":[{"name":"e@f.io"}]}]}'
    assert schema_to_dfa(TREE).matches(nested)
    max_states(400)  # 573 states as given, 191 with recursion followed once
    dfa = schema_to_dfa(TREE)
    assert dfa.matches(b'{"name":"a@b.io","children":[]}')
    assert not dfa.matches(b'{"name":"a@b.io","children":[{"name":"c@d.io"}]}')  # node inside node
    assert_answers_valid(dfa, TREE)


def test_a_schema_too_large_even_narrowed_is_refused_naming_the_limit(max_states):
    max_states(20000)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 250} for i in range(12)}}
    with pytest.raises(ConstraintError, match="more than 20000 automaton states"):
        schema_to_dfa(schema)


def test_recursion_nesting_deeper_than_the_converter_allows_is_built_without_recursion():
    """A cycle of 15 references, unrolled MAX_RECURSION times, nests past MAX_DEPTH; without
    recursion it fits, and the nested path still ends at a valid value."""
    defs = {
        f"n{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/n{i + 1}"}, "v": {"type": "integer"}}}
        for i in range(14)
    }
    defs["n14"] = {"type": "object", "properties": {"back": {"$ref": "#/$defs/n0"}}}
    schema = {"$defs": defs, "$ref": "#/$defs/n0"}
    dfa = schema_to_dfa(schema)
    chain = '{"x":' * 14 + "{}" + "}" * 14
    assert dfa.matches(chain.encode())
    assert not dfa.matches(('{"x":' * 14 + '{"back":{}}' + "}" * 14).encode())  # n0 inside n0
    assert_answers_valid(dfa, schema)
