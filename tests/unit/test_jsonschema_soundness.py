"""Soundness cases found by sampling answers of random and real schemas: each schema here once had an
automaton that accepted a text ``jsonschema`` rejects. Every accepted text must validate; where the
converter cannot serve a schema exactly it refuses by name. No vocabulary, no engine."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from support.automata import steered_walk

from llmserve.constraints import ConstraintError
from llmserve.constraints.spec import ConstraintSpec


def dfa_of(schema):
    return ConstraintSpec("json_schema", schema).to_dfa()


def assert_sound(schema, texts=(), n=60, budget=80, seed=0):
    """Every listed text the automaton accepts, and every sampled answer, validates."""
    dfa = dfa_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in texts:
        if dfa.matches(text.encode()):
            assert validator.is_valid(json.loads(text)), text
    rng = random.Random(seed)
    for _ in range(n):
        text = steered_walk(dfa, rng, budget, stop=0.15).decode("utf-8")
        assert validator.is_valid(json.loads(text)), text
    return dfa


# ------------------------------------------------------------------ not, as a oneOf branch

# not (a positive number matching exactly one of [anything, a string]) = not (a positive number):
# its negation through "fails every branch" is empty (nothing fails true), yet the 'not' admits 0
POSITIVE_ONE_OF = {"not": {"type": "number", "exclusiveMinimum": 0, "oneOf": [True, {"type": "string"}]}}
NON_POSITIVE = {"type": "number", "maximum": 0, "exclusiveMinimum": -0.5}


def test_a_not_empty_only_as_far_as_its_subset_goes_is_not_a_oneof_branch_matching_nothing():
    # 0 matches both branches: the oneOf fails it
    schema = {"oneOf": [POSITIVE_ONE_OF, NON_POSITIVE]}
    assert not jsonschema.Draft202012Validator(schema).is_valid(0)
    try:
        dfa = assert_sound(schema, ["0", "-0.25", "1", '"a"'])
    except ConstraintError:
        return  # a refusal is sound too
    assert not dfa.matches(b"0")


def test_a_not_of_a_schema_every_value_satisfies_still_matches_nothing():
    # not true is empty exactly: the other oneOf branch is served alone
    schema = {"oneOf": [{"not": True}, NON_POSITIVE]}
    dfa = assert_sound(schema, ["0", "-0.25"])
    assert dfa.matches(b"0")


# ------------------------------------------------------------------ patternProperties in an allOf


@pytest.mark.parametrize(
    ("schema", "texts"),
    [
        (
            {"allOf": [{"type": "object", "patternProperties": {"^x": {}}}, {"additionalProperties": False}]},
            ['{"x":1}', '{"xa":"a"}'],
        ),
        (
            {
                "allOf": [
                    {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
                    {"additionalProperties": {"type": "string"}},
                ]
            },
            ['{"x":1}', '{"x":"a"}'],
        ),
        (
            {
                "allOf": [
                    {"additionalProperties": {"type": "string"}},
                    {"type": "object", "patternProperties": {"^x": {"type": "string", "maxLength": 1}}},
                ]
            },
            ['{"x":1}', '{"x":"ab"}'],
        ),
    ],
)
def test_names_one_side_matches_by_pattern_follow_the_other_sides_additional_properties(schema, texts):
    dfa = assert_sound(schema, texts)
    for text in texts:
        assert not dfa.matches(text.encode()), text
    assert dfa.matches(b"{}")


def test_a_pattern_name_valid_on_both_sides_is_still_generated():
    schema = {
        "allOf": [
            {"additionalProperties": {"type": "string"}},
            {"type": "object", "patternProperties": {"^x": {"type": "string", "maxLength": 1}}},
        ]
    }
    assert dfa_of(schema).matches(b'{"x":"a"}')


# ------------------------------------------------------------------ minProperties over free members


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
        {"type": "object", "minProperties": 2, "patternProperties": {"^a": {"type": "integer"}}},
        {"type": "object", "minProperties": 2, "patternProperties": {"^a": {}, "^b": {}}},
    ],
)
def test_min_properties_over_free_member_names_is_refused_as_names_could_repeat(schema):
    # {"a":1,"a":2} parses to one member: it fails minProperties 2
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads('{"a":1,"a":2}'))
    with pytest.raises(ConstraintError, match="minProperties"):
        dfa_of(schema)


def test_min_properties_one_over_free_members_is_still_served():
    dfa = assert_sound({"type": "object", "minProperties": 1, "additionalProperties": {"type": "integer"}})
    assert dfa.matches(b'{"a":1}')
    assert not dfa.matches(b"{}")


# ------------------------------------------------------------------ object keywords and other types


def test_a_required_name_another_side_forbids_leaves_the_other_types_in_a_merge():
    # {properties: {c: false}} and required [c] together refuse every object, and nothing else: the
    # string branch is not alone
    schema = {"oneOf": [{"type": "string"}, {"properties": {"c": False}}], "required": ["c"]}
    assert not jsonschema.Draft202012Validator(schema).is_valid("a")
    try:
        dfa = assert_sound(schema, ['"a"', '""'])
    except ConstraintError:
        return
    assert not dfa.matches(b'"a"')


def test_the_same_conflict_in_an_allof_is_no_oneof_branch_matching_nothing():
    branch = {"allOf": [{"properties": {"a": {}}, "required": ["a"]}, {"additionalProperties": False}]}
    schema = {"oneOf": [branch, {}]}
    dfa = assert_sound(schema, ["2", '"x"', "{}"])
    assert not dfa.matches(b"2")  # matches the allOf too (it only refuses objects)
    assert dfa.matches(b"{}")


def test_a_discriminating_property_does_not_tell_apart_values_that_are_not_objects():
    schema = {
        "oneOf": [
            {"type": "array", "properties": {"k": {"const": 1}}, "required": ["k"]},
            {"properties": {"k": {"const": 2}}, "required": ["k"]},
        ]
    }
    assert not jsonschema.Draft202012Validator(schema).is_valid([])
    try:
        dfa = assert_sound(schema, ["[]", "[1]"])
    except ConstraintError:
        return
    assert not dfa.matches(b"[]")


def test_a_declared_name_the_other_sides_pattern_matches_is_not_additional_there():
    # b matches ^[ab] on the first branch: allowed there, so {"b": ...} matches both branches
    schema = {
        "oneOf": [{"additionalProperties": False, "patternProperties": {"^[ab]": {}}}, {}],
        "properties": {"b": True},
    }
    assert not jsonschema.Draft202012Validator(schema).is_valid({"b": 1})
    try:
        dfa = assert_sound(schema, ['{"b":1}', "{}"])
    except ConstraintError:
        return
    assert not dfa.matches(b'{"b":1}')


def test_a_declared_name_in_an_allof_follows_the_other_sides_matching_pattern():
    schema = {
        "allOf": [{"additionalProperties": False, "patternProperties": {"^[ab]": {"type": "integer"}}}],
        "properties": {"b": True, "c": True},
    }
    dfa = assert_sound(schema, ['{"b":1}', '{"b":"x"}', '{"c":1}'])
    assert dfa.matches(b'{"b":1}')
    assert not dfa.matches(b'{"b":"x"}')


@pytest.mark.parametrize(
    "dependency",
    [{"dependentSchemas": {"a": {"properties": {"c": {}}}}}, {"dependentRequired": {"a": ["c"]}}],
)
def test_names_a_required_names_dependency_adds_can_match_another_oneof_branch(dependency):
    # a is required, so its dependency holds: an answer may hold c, which the second branch requires
    schema = {"oneOf": [{"properties": {"b": {}, "a": True}, **dependency}, {"required": ["c"]}], "required": ["a"]}
    assert not jsonschema.Draft202012Validator(schema).is_valid({"a": 0, "c": 2})
    try:
        dfa = assert_sound(schema, ['{"b":null,"a":0,"c":2}', '{"a":0,"c":2}', '{"a":0}'])
    except ConstraintError:
        return
    assert not dfa.matches(b'{"a":0,"c":2}')


# ------------------------------------------------------------------ types of branches served as a subset

# not {type: object, required: [a]} is served as objects without a (a subset): its values include
# every string too, so its types do not tell it apart from a string branch
NOT_OBJECT_WITH_A = {"not": {"type": "object", "required": ["a"]}}


@pytest.mark.parametrize(
    "branch",
    [{"oneOf": [NOT_OBJECT_WITH_A]}, {"anyOf": [NOT_OBJECT_WITH_A, {"type": "integer"}]}],
)
def test_the_types_of_a_branch_served_as_a_subset_do_not_tell_oneof_branches_apart(branch):
    schema = {"oneOf": [branch, {"type": "string"}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid("s")
    try:
        dfa = assert_sound(schema, ['"s"', "{}", "1"])
    except ConstraintError:
        return
    assert not dfa.matches(b'"s"')


def test_a_type_a_subset_branch_states_still_bounds_its_values():
    conditional = {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}
    schema = {"oneOf": [{"anyOf": [conditional, {"type": "integer"}]}, {"type": "string"}]}
    dfa = assert_sound(schema, ['"s"', "1", "{}"])
    assert dfa.matches(b'"s"')


def test_the_types_of_items_served_as_a_subset_do_not_tell_arrays_apart():
    schema = {
        "$defs": {"t": NOT_OBJECT_WITH_A},
        "oneOf": [
            {"type": "array", "items": {"$ref": "#/$defs/t"}},
            {"type": "array", "items": {"type": "string"}},
        ],
    }
    assert not jsonschema.Draft202012Validator(schema).is_valid(["s"])
    try:
        dfa = assert_sound(schema, ['["s"]', "[{}]", "[]"])
    except ConstraintError:
        return
    assert not dfa.matches(b'["s"]')


# ------------------------------------------------------------------ minProperties over maxProperties


@pytest.mark.parametrize("patterns", [{"^[ab]": {}}, {"^a": {}, "^b": {}}])
def test_min_properties_over_max_properties_admits_no_object_over_patterns(patterns):
    # the free members once came out as {} whatever minProperties said
    inner = {"minProperties": 1, "maxProperties": 0, "patternProperties": patterns}
    schema = {"properties": {"a": inner}}
    dfa = assert_sound(schema, ['{"a":{}}', '{"a":1}', "{}"])
    assert not dfa.matches(b'{"a":{}}')
    with pytest.raises(ConstraintError):
        dfa_of({"type": "object", **inner})


def test_a_true_oneof_branch_is_told_apart_from_an_object_branch():
    # the negations of the object branch once merged into 'true' itself (an AttributeError)
    schema = {"oneOf": [{"type": "object", "properties": {"a": {"type": "number"}}}, True]}
    dfa = assert_sound(schema, ["{}", '{"a":1}', '{"a":"x"}'])
    assert dfa.matches(b'{"a":"x"}')
    assert not dfa.matches(b"{}")


# ------------------------------------------------------------------ not of a schema no value satisfies

EMPTY = {"type": "boolean", "allOf": [{"type": "integer"}]}


def test_not_of_a_schema_no_value_satisfies_admits_every_value():
    dfa = assert_sound({"not": EMPTY}, ["1", '"s"', "[1]"])
    assert dfa.matches(b"[1]")


def test_not_of_an_empty_schema_is_no_oneof_branch_matching_nothing():
    # every value matches both branches: nothing validates
    schema = {"oneOf": [{"not": EMPTY}, {}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid([1])
    with pytest.raises(ConstraintError):
        dfa_of(schema)


def test_an_empty_anyof_branch_inside_not_is_failed_by_every_value():
    schema = {"oneOf": [{"not": {"anyOf": [EMPTY, {"type": "string"}]}}, {"type": "integer"}]}
    dfa = assert_sound(schema, ["1", '"s"', "[1]"])
    assert not dfa.matches(b"1")


# ------------------------------------------------------------------ dependencies of one name in two keywords


def test_a_names_schema_dependency_holds_beside_its_required_dependency():
    # dependentRequired of a once hid its dependentSchemas: a was generated with any value
    schema = {
        "properties": {"b": {}, "a": {}},
        "required": ["b"],
        "dependentRequired": {"a": ["b"]},
        "dependentSchemas": {"a": {"properties": {"a": {"type": "integer"}}}},
    }
    dfa = assert_sound(schema, ['{"b":1,"a":{}}', '{"b":1,"a":1}', '{"b":1}'])
    assert not dfa.matches(b'{"b":1,"a":{}}')
    assert dfa.matches(b'{"b":1}')


def test_a_pattern_matching_a_name_the_other_side_declares_keeps_that_names_values_in_a_merge():
    # ab is declared on the second side (any value) and matches ^a on the first: an integer; ax
    # matches ^a and is additional on the second side: refused
    schema = {
        "allOf": [
            {"patternProperties": {"^a": {"type": "integer"}}},
            {"properties": {"ab": {}}, "additionalProperties": False},
        ]
    }
    dfa = assert_sound(schema, ['{"ab":1}', '{"ab":"s"}', '{"ax":1}'])
    assert dfa.matches(b'{"ab":1}')
    assert not dfa.matches(b'{"ab":"s"}')


def test_a_required_name_only_the_pattern_side_covers_follows_the_other_sides_additional_properties():
    schema = {
        "allOf": [
            {"patternProperties": {"^x": {}}, "additionalProperties": False, "properties": {"p": {}}},
            {"properties": {"xa": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
        ],
        "required": ["x1"],
    }
    dfa = assert_sound(schema, ['{"x1":1}', '{"x1":"s"}'])
    assert dfa.matches(b'{"x1":1}')
    assert not dfa.matches(b'{"x1":"s"}')
