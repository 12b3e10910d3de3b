"""``oneOf`` branches that may overlap, served as each branch and not the others (``_Converter._one_of``):
every sampled answer validates with ``jsonschema`` and matches exactly one branch. No vocabulary, no engine."""

from __future__ import annotations

import json
import random
import time

import jsonschema
import pytest
from support.automata import steered_walk

from llmserve.constraints import ConstraintError
from llmserve.constraints.schema_merge import Unsatisfiable
from llmserve.constraints.spec import ConstraintSpec


def dfa_of(schema):
    return ConstraintSpec("json_schema", schema).to_dfa()


def samples(schema, n=80, budget=160, seed=0) -> list:
    dfa = dfa_of(schema)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        value = json.loads(steered_walk(dfa, rng, budget, stop=0.15).decode("utf-8"))
        jsonschema.validate(value, schema)
        out.append(value)
    return out


def matching(value, branches, root) -> list[int]:
    """The branches (with the root's definitions) that ``value`` satisfies."""
    defs = {k: root[k] for k in ("definitions", "$defs") if k in root}
    return [i for i, b in enumerate(branches) if jsonschema.Draft7Validator({**defs, **b}).is_valid(value)]


# an object whose properties differ in one name's schema only (SchemaStore's Grunt watch task)
EVENTS = {
    "definitions": {"event": {"type": "string", "enum": ["all", "changed", "added"]}},
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "spawn": {"type": "boolean"},
                "events": {"type": "array", "items": {"$ref": "#/definitions/event"}},
            },
        },
        {"type": "object", "properties": {"spawn": {"type": "boolean"}, "events": {"$ref": "#/definitions/event"}}},
    ],
}

# one of two names (SchemaStore's Prometheus basic_auth): the other is never generated
EITHER_NAME = {
    "type": ["object", "null"],
    "properties": {
        "username": {"type": "string"},
        "password": {"type": ["string", "null"]},
        "password_file": {"type": "string"},
    },
    "oneOf": [{"required": ["password"]}, {"required": ["password_file"]}],
    "additionalProperties": False,
    "required": ["username"],
}

# told apart by a pattern of a property they both require (a bundler config: .js, .css, .html)
BY_PATTERN = {
    "type": "object",
    "oneOf": [
        {
            "required": ["out"],
            "properties": {"out": {"type": "string", "pattern": "\\.js$"}, "minify": {"type": "boolean"}},
        },
        {
            "required": ["out"],
            "properties": {"out": {"type": "string", "pattern": "\\.css$"}, "minify": {"type": "boolean"}},
        },
        {"required": ["out"], "properties": {"out": {"type": "string", "pattern": "\\.(html|htm)$"}}},
    ],
}

# at most one property, every branch open: told apart by a name one branch does not declare
ONE_MEMBER = {
    "type": "object",
    "maxProperties": 1,
    "oneOf": [
        {"properties": {"priority": {"type": "integer"}, "prefetch": {"type": "integer"}, "queue": {"type": "string"}}},
        {"properties": {"priority": {"type": "integer"}, "topic": {"type": "string"}}},
    ],
}

# a generic branch and specific ones (SchemaStore's .NET template post-actions): the generic one
# without the specific ids, the specific ones left out (every value of theirs matches the generic one)
GENERIC_AND_SPECIFIC = {
    "type": "object",
    "required": ["id"],
    "oneOf": [
        {"properties": {"id": {"type": "string", "pattern": "^[0-9a-f]{4}$"}, "args": {"type": "object"}}},
        {"properties": {"id": {"enum": ["ab12"]}, "args": {"type": "object"}}},
        {"properties": {"id": {"enum": ["cd34"]}, "args": {"type": "object"}}},
    ],
}


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        (EVENTS, ['{"events":["all"]}', '{"spawn":true,"events":"added"}'], ["{}", '{"spawn":true}']),
        (
            EITHER_NAME,
            ['{"username":"u","password":null}', '{"username":"u","password_file":"f"}'],
            ["null", '{"username":"u"}', '{"username":"u","password":"p","password_file":"f"}'],
        ),
        (BY_PATTERN, ['{"out":"a.js"}', '{"out":"a.css","minify":true}', '{"out":".htm"}'], ['{"out":"a.jsx"}']),
        (ONE_MEMBER, ['{"prefetch":"x"}', '{"topic":1}'], ["{}", '{"priority":1}', '{"queue":"q"}']),
        (GENERIC_AND_SPECIFIC, ['{"id":"0000"}'], ['{"id":"ab12"}', '{"id":"cd34","args":{}}']),
    ],
)
def test_overlapping_one_of_branches_generate_answers_of_exactly_one_branch(schema, accepted, refused):
    for value in samples(schema):
        assert len(matching(value, schema["oneOf"], schema)) == 1, value
    dfa = dfa_of(schema)
    for text in accepted:
        assert dfa.matches(text.encode()), text
        assert len(matching(json.loads(text), schema["oneOf"], schema)) == 1
    for text in refused:
        assert not dfa.matches(text.encode()), text


def test_a_branch_that_is_each_value_of_another_is_never_generated_and_null_not_either():
    values = samples(EITHER_NAME)
    assert None not in values  # null satisfies both 'required' branches: it fails the oneOf
    assert all(("password" in v) != ("password_file" in v) for v in values)


def test_twin_branches_match_nothing():
    twin = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
    with pytest.raises(Unsatisfiable):
        dfa_of({"oneOf": [twin, twin]})
    # oneOf(oneOf(X, X), X): the inner one matches nothing, so X is the whole
    nested = {"oneOf": [{"oneOf": [twin, twin]}, twin]}
    assert all(isinstance(v, list) and v for v in samples(nested))


def test_a_branch_served_as_a_subset_is_seen_as_admitting_every_value():
    # the if/then branch admits every integer too (its 'if' fails for them): an integer answer would
    # match both branches, so only strings that fail the other branch are generated
    schema = {"oneOf": [{"type": "integer"}, {"if": {"type": "string"}, "then": {"minLength": 2}}]}
    try:
        values = samples(schema)
    except ConstraintError:
        return  # refusing is sound too
    assert not any(isinstance(v, int) for v in values)


def test_branches_that_cannot_be_told_apart_are_still_refused_or_unsatisfiable():
    with pytest.raises(ConstraintError):
        dfa_of({"oneOf": [{"type": "string"}, {"type": "string", "minLength": 1}]})


# ------------------------------------------------------------------ contains, dependencies, allOf merges


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "contains": {"const": "type"}, "items": {"enum": ["const", "static", "type"]}},
        {"type": "array", "contains": {"type": "integer"}, "minContains": 2, "maxContains": 3, "maxItems": 5},
        {"type": "array", "prefixItems": [{"type": "string"}], "contains": {"minLength": 3}},
        {"allOf": [{"contains": {"const": "a"}}, {"contains": {"const": "b"}}], "type": "array"},
        {
            "allOf": [{"contains": {"enum": ["a", "b"]}}, {"contains": {"const": "b"}}],
            "type": "array",
            "uniqueItems": True,
        },
        {"type": "object", "properties": {"tags": {"type": "array", "contains": {"const": "x"}}}, "required": ["tags"]},
    ],
)
def test_contains_generates_arrays_whose_first_items_match(schema):
    values = samples(schema)
    assert all(isinstance(v, (list, dict)) for v in values)


def test_contains_is_refused_with_fewer_items_allowed_than_it_needs():
    with pytest.raises(Unsatisfiable):
        dfa_of({"type": "array", "contains": {"type": "integer"}, "minContains": 3, "maxItems": 2})


def test_not_contains_is_arrays_without_a_matching_item():
    schema = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "not": {"contains": {"const": "a"}}}
    dfa = dfa_of(schema)
    assert not dfa.matches(b'["b","a"]')
    assert dfa.matches(b'["b","c"]')
    samples(schema)


def test_a_schema_dependency_of_a_required_name_always_applies():
    schema = {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "aql": {"type": "string"}, "x": {"type": "integer"}},
        "required": ["pattern"],
        "dependencies": {"pattern": {"not": {"required": ["aql"]}}},
    }
    dfa = dfa_of(schema)
    assert not dfa.matches(b'{"pattern":"p","aql":"q"}')
    assert dfa.matches(b'{"pattern":"p","x":1}')
    samples(schema)


def test_all_of_merges_dependencies_per_name_and_item_schemas_per_position():
    schema = {
        "type": "object",
        "allOf": [
            {"dependencies": {"a": ["b"]}, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
            {"dependencies": {"a": ["c"], "c": {"required": ["b"]}}, "properties": {"c": {"type": "integer"}}},
        ],
    }
    samples(schema)
    tuple_and_items = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "allOf": [
            {"items": [{"type": "integer"}, {"type": "string"}]},
            {"items": {"type": ["integer", "string"], "maximum": 5}},
        ],
    }
    dfa = dfa_of(tuple_and_items)
    assert not dfa.matches(b"[7]")  # the first position follows both sides: an integer up to 5
    assert dfa.matches(b'[5,"a"]')
    samples(tuple_and_items)


# ------------------------------------------------------------------ numbers and unique items


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, ["0.5", "0.1"], ["0", "1", "1.5"]),
        ({"type": "number", "minimum": -0.5, "maximum": -0.1}, ["-0.5", "-0.1"], ["0", "-1"]),
        ({"type": "number", "multipleOf": 0.1}, ["3", "-70"], ["0.3", "0.5"]),
        ({"type": "number", "multipleOf": 1.5, "minimum": 0}, ["3", "0"], ["1", "-3"]),
    ],
)
def test_numbers_with_fractional_bounds_or_multiples(schema, accepted, refused):
    dfa = dfa_of(schema)
    for text in accepted:
        assert dfa.matches(text.encode()), text
        jsonschema.validate(json.loads(text), schema)
    for text in refused:
        assert not dfa.matches(text.encode()), text
    samples(schema)


def test_unique_items_of_listed_values_are_distinct():
    schema = {
        "type": "array",
        "minItems": 2,
        "maxItems": 3,
        "uniqueItems": True,
        "items": {"anyOf": [{"enum": ["a", "b", "c", 1]}, {"type": "object"}], "not": {"const": "b"}},
    }
    dfa = dfa_of(schema)
    assert dfa.matches(b'["a","c"]')
    assert not dfa.matches(b'["a","a"]')
    assert not dfa.matches(b'["a","b"]')
    assert dfa.matches(b'["a","c",1]')
    for value in samples(schema):
        assert len({json.dumps(v) for v in value}) == len(value)
    with pytest.raises(ConstraintError, match="uniqueItems"):
        dfa_of({"type": "array", "minItems": 2, "uniqueItems": True, "items": {"type": "string"}})


def test_unique_booleans_and_nulls_list_themselves():
    """pydantic's set[bool] with min_length 2: booleans and null are values to choose from."""
    schema = {"type": "array", "minItems": 2, "uniqueItems": True, "items": {"type": ["boolean", "null"]}}
    dfa = dfa_of(schema)
    assert dfa.matches(b"[false,true]") and dfa.matches(b"[false,true,null]")
    assert not dfa.matches(b"[true,true]") and not dfa.matches(b"[null]")
    for value in samples(schema):
        assert len({json.dumps(v) for v in value}) == len(value) >= 2
    with pytest.raises(Unsatisfiable, match="fewer than 3 distinct"):
        dfa_of({"type": "array", "minItems": 3, "uniqueItems": True, "items": {"type": "boolean"}})


D2020 = {"$schema": "https://json-schema.org/draft/2020-12/schema"}


@pytest.mark.parametrize(
    "schema",
    [
        # in an allOf member: the sibling's "b" is not evaluated there, so the member refuses it, and b is required
        {
            **D2020,
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ],
        },
        # in a $ref target, likewise
        {
            **D2020,
            "$defs": {
                "X": {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}
            },
            "$ref": "#/$defs/X",
            "properties": {"b": {"type": "integer"}},
            "required": ["b"],
        },
    ],
)
def test_a_name_a_closed_member_does_not_evaluate_cannot_be_required(schema):
    """Merging must not let a member see its siblings' names as its own (found in review): as JSON Schema reads
    it, no value satisfies these."""
    with pytest.raises(ConstraintError, match="'b'"):
        dfa_of(schema)


def test_unevaluated_properties_beside_a_nested_not_is_refused_by_name():
    """A 'not' nested in an allOf member declares names it never evaluates: what is evaluated depends on the
    answer, so the keyword is refused, never served unsoundly."""
    schema = {
        **D2020,
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "unevaluatedProperties": False,
        "allOf": [{"not": {"properties": {"z": {"const": "x"}}}}],
    }
    with pytest.raises(ConstraintError, match="unevaluatedProperties"):
        dfa_of(schema)


def test_all_of_merges_pattern_properties_per_pattern():
    schema = {
        "type": "object",
        "allOf": [
            {"patternProperties": {"^x-": {"type": "string"}}},
            {"patternProperties": {"^x-": {"maxLength": 3}, "^y": {}}},
        ],
        "properties": {"x-a": {}, "yb": {"type": "integer"}},
    }
    dfa = dfa_of(schema)
    assert not dfa.matches(b'{"x-a":"long"}')
    assert dfa.matches(b'{"x-a":"abc","yb":1}')
    samples(schema)


def test_conditionals_whose_ifs_exhaust_a_required_property_serve_some_by_their_else():
    # (SchemaStore's JDownloader crawler rule) every 'if' at once leaves "rule" no value: the later
    # ones are served by their 'else' (no 'else': anything) and a value that fails their 'if'
    schema = {
        "type": "object",
        "required": ["rule"],
        "additionalProperties": False,
        "properties": {
            "rule": {"enum": ["DEEP", "REWRITE", "DIRECT"], "type": "string"},
            "deep": {"type": ["string", "null"]},
            "rewrite": {"type": ["string", "null"]},
        },
        "allOf": [
            {
                "if": {"properties": {"rule": {"not": {"const": "DEEP"}}}},
                "then": {"properties": {"deep": {"type": "null"}}},
            },
            {
                "if": {"properties": {"rule": {"not": {"const": "REWRITE"}}}},
                "then": {"properties": {"rewrite": {"type": "null"}}},
            },
            {"if": {"properties": {"rule": {"not": {"oneOf": [{"const": "DIRECT"}, {"const": "DEEP"}]}}}}, "then": {}},
        ],
    }
    values = samples(schema)
    assert {v["rule"] for v in values} <= {"DEEP", "REWRITE", "DIRECT"}


def test_a_conditional_beside_other_keywords_may_be_served_by_its_else():
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "a"}}},
        "then": {"required": ["x"]},
        "else": {"properties": {"x": {"minimum": 5}}},
        "allOf": [{"properties": {"kind": {"const": "b"}}}],
    }
    dfa = dfa_of(schema)
    assert dfa.matches(b'{"kind":"b","x":7}')
    assert not dfa.matches(b'{"kind":"b","x":1}')
    samples(schema)


def test_two_formats_of_an_all_of_both_hold():
    schema = {"allOf": [{"type": "string", "format": "uuid"}, {"format": "ipv4"}]}
    with pytest.raises(Unsatisfiable):
        dfa_of(schema)  # no string is both
    both = {"allOf": [{"type": "string", "format": "date"}, {"format": "int32"}, {"maxLength": 10}]}
    assert all(len(v) == 10 for v in samples(both))


def test_an_optional_string_no_generated_value_satisfies_is_left_out():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^abc$", "maxLength": 2}, "b": {"type": "integer"}},
    }
    dfa = dfa_of(schema)
    assert not dfa.matches(b'{"a":"abc"}')
    assert dfa.matches(b'{"b":1}')


def test_telling_deeply_nested_all_of_apart_stays_fast():
    from llmserve.constraints.jsonschema import _disjoint

    a: dict = {"type": "string"}
    b: dict = {"type": "string", "minLength": 1}
    for _ in range(40):  # what merging negations into a branch again and again builds
        a = {"allOf": [a, {"maxLength": 9}]}
        b = {"allOf": [b, {"pattern": "x"}]}
    start = time.monotonic()
    assert not _disjoint(a, b)
    assert time.monotonic() - start < 1.0


MODES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"mode": {"enum": ["extract", "search"]}, "message": {"type": "string"}},
}
FORBIDS_MESSAGE = {"if": {"properties": {"mode": {"const": "extract"}}, "required": ["mode"]}}
FORBIDS_MESSAGE["then"] = {"properties": {"message": False}}


@pytest.mark.parametrize(
    "schema",
    [
        {**MODES, **FORBIDS_MESSAGE},
        {**MODES, "allOf": [FORBIDS_MESSAGE]},
        {"allOf": [{"properties": {"message": False}}, {"properties": {"message": {"type": "string"}}}]},
    ],
)
def test_a_property_that_one_side_of_a_merge_forbids_stays_forbidden(schema):
    """``properties: {name: false}`` merged with a side that does not declare the name (an if/then's
    'if', here) used to drop the name: the other side's schema for it then applied alone. Seen on
    SchemaStore's semgrep rules schema (11c281e26573): 30 of 300 sampled answers held a 'message'
    with mode 'extract'."""
    dfa = dfa_of(schema)
    assert not dfa.matches(b'{"mode":"extract","message":"x"}')
    for value in samples(schema):
        jsonschema.validate(value, schema)
