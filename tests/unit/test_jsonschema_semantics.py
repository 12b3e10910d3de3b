"""JSON Schema semantics of the constraint engine, checked against the ``jsonschema`` package: every
answer the automaton accepts (sampled by random walks) validates, and the cases of issue #17 that
used to be wrong are refused or accepted as JSON Schema says. No vocabulary, no engine."""

from __future__ import annotations

import json
import random
import re
import time

import jsonschema
import numpy as np
import pytest
from support.automata import steered_walk

from llmserve.constraints import ConstraintError
from llmserve.constraints.budget import UNREACHABLE, distances
from llmserve.constraints.spec import ConstraintSpec


def dfa_of(schema):
    return ConstraintSpec("json_schema", schema).to_dfa()


def walk(dfa, rng: random.Random, budget: int) -> bytes:
    return steered_walk(dfa, rng, budget, stop=0.15)


def assert_samples_valid(schema, n=60, budget=120, seed=0):
    dfa = dfa_of(schema)
    rng = random.Random(seed)
    for _ in range(n):
        text = walk(dfa, rng, budget).decode("utf-8")
        jsonschema.validate(json.loads(text), schema)


def accepts(schema, text: str) -> bool:
    return dfa_of(schema).matches(text.encode())


# ------------------------------------------------------------------ strings


PATTERN_5 = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^.{1,5}$"}},
    "required": ["s"],
}


@pytest.mark.parametrize("text", ['{"s":"a"b"}', '{"s":"a\\"}', '{"s":"\\"}', '{"s":"a\nb"}'])
def test_a_pattern_never_lets_a_raw_quote_backslash_or_control_character_into_the_json(text):
    assert not accepts(PATTERN_5, text)


def test_a_pattern_applies_to_the_decoded_value():
    assert accepts(PATTERN_5, '{"s":"a\\"b"}')  # decoded: a"b, 3 characters
    assert accepts(PATTERN_5, '{"s":"\\\\"}')  # decoded: one backslash
    assert not accepts(PATTERN_5, '{"s":"abcdef"}')
    assert_samples_valid(PATTERN_5)


def test_an_unanchored_pattern_is_a_search_and_anchors_hold():
    assert accepts({"type": "string", "pattern": "abc"}, '"xabcx"')
    assert accepts({"type": "string", "pattern": "^abc"}, '"abcx"')
    assert not accepts({"type": "string", "pattern": "^abc"}, '"xabc"')
    assert accepts({"type": "string", "pattern": "abc$"}, '"xabc"')
    assert not accepts({"type": "string", "pattern": "abc$"}, '"abcx"')
    assert accepts({"type": "string", "pattern": "^a$|^b"}, '"bzz"')
    assert not accepts({"type": "string", "pattern": "^a$|^b"}, '"az"')
    assert_samples_valid({"type": "string", "pattern": "[0-9]{3}", "maxLength": 8})


def test_an_anchor_inside_a_pattern_is_refused_not_misread():
    with pytest.raises(ConstraintError, match="'\\^' and '\\$'"):
        dfa_of({"type": "string", "pattern": "a^b"})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
        {"type": "string", "pattern": "x", "minLength": 4, "maxLength": 6},
        {"type": "string", "format": "uuid", "pattern": "^0"},
        {"type": "string", "pattern": ["^a", "b$"]},
    ],
)
def test_length_bounds_and_patterns_hold_together(schema):
    assert_samples_valid(schema if not isinstance(schema.get("pattern"), list) else _two_patterns())


def _two_patterns():
    return {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}], "maxLength": 6}


def test_length_and_pattern_count_decoded_characters():
    schema = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}
    assert accepts(schema, '"abcde"')
    assert not accepts(schema, '"abcdef"')
    assert accepts({"type": "string", "maxLength": 1}, '"\\n"')
    assert accepts({"type": "string", "minLength": 2, "maxLength": 2}, '"é\\""')


def test_no_string_satisfying_all_conditions_is_an_error():
    with pytest.raises(ConstraintError, match="no string satisfies"):
        dfa_of({"type": "string", "pattern": "^abc$", "maxLength": 2})


@pytest.mark.parametrize("fmt", ["date", "time", "date-time", "email", "uuid", "ipv4", "ipv6", "hostname", "uri"])
def test_formats_generate_values_the_format_checker_accepts(fmt):
    schema = {"type": "string", "format": fmt}
    dfa = dfa_of(schema)
    rng = random.Random(1)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for _ in range(30):
        value = json.loads(walk(dfa, rng, 120))
        if fmt in checker.checkers:  # some checkers need optional packages
            checker.check(value, fmt)
        jsonschema.validate(value, schema)


# ------------------------------------------------------------------ numbers


def test_integer_bounds_accept_exactly_the_range():
    dfa = dfa_of({"type": "integer", "minimum": -15, "exclusiveMaximum": 231})
    for i in range(-400, 400):
        assert dfa.matches(str(i).encode()) == (-15 <= i <= 230), i


@pytest.mark.parametrize(
    "schema,inside,outside",
    [
        # snowflake ids, nanosecond timestamps: bounds past the 16 digits an open side stops at
        ({"type": "integer", "minimum": 10**17, "maximum": 2**63 - 1}, [10**17, 2**63 - 1], [10**17 - 1, 2**63]),
        ({"type": "integer", "minimum": 1_600_000_000_000_000_000}, [16 * 10**17, 9 * 10**18], [0, -1]),
        ({"type": "integer", "exclusiveMaximum": -(10**17)}, [-(10**17) - 1], [-(10**17), 0]),
        ({"type": "number", "exclusiveMinimum": 1e20}, [10**20 + 10**4], [10**20]),
        # a float this large is a 301-digit integer exactly: rounded inward to 17 digits
        ({"type": "number", "minimum": 1e300}, [2 * 10**300], [10**300]),
        ({"type": "number", "exclusiveMaximum": -1e300, "minimum": -1e301}, [-2 * 10**300], [-(10**300)]),
    ],
)
def test_large_bounds_are_served_not_refused(schema, inside, outside):
    """They were clamped to 16 digits, so minimum 1e17 read as 'no integer lies between the
    bounds'."""
    for value in inside:
        assert accepts(schema, str(value)), value
        jsonschema.validate(value, schema)
    for value in outside:
        assert not accepts(schema, str(value)), value
    assert_samples_valid(schema, budget=700)


def test_number_bounds_and_multiple_of_one():
    assert_samples_valid({"type": "number", "minimum": 0.5, "maximum": 99.5})
    assert_samples_valid({"type": "number", "exclusiveMinimum": 0, "multipleOf": 1})
    # jsonschema divides as floats: 0.3 / 0.1 is not whole, so only integers are generated
    assert not accepts({"type": "number", "multipleOf": 0.1}, "0.3")
    assert_samples_valid({"type": "number", "multipleOf": 0.1})


@pytest.mark.parametrize("multiple", [0.1, 0.25, 0.5, 0.2, 0.05, 1.5, 2.5, 0.125])
def test_a_fractional_multiple_of_admits_the_integers_jsonschema_admits(multiple):
    """Integers k whose k / multiple is whole as floats (jsonschema's test), within bounds."""
    schema = {"type": "number", "multipleOf": multiple, "minimum": -300, "maximum": 300}
    dfa = dfa_of(schema)
    for k in range(-320, 320):
        admitted = -300 <= k <= 300 and int(k / multiple) == k / multiple
        assert dfa.matches(str(k).encode()) == admitted, k


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "pattern": {"a": 1}}, "pattern must be a string"),
        ({"type": "string", "format": {"a": 1}}, "format must be a string"),
        ({"type": "string", "pattern": ["a", {"b": 1}]}, "pattern must be a string"),
        ({"$ref": {"x": 1}, "description": "d"}, "only local \\$ref is supported"),
        ({"type": "integer", "multipleOf": 1e-305, "minimum": 0, "maximum": 100}, "quotients overflow"),
        # past 2**53 jsonschema's float division is inexact (numpy raised on the first: a 500)
        ({"type": "integer", "minimum": 123456789012345678901234567890, "multipleOf": 0.5}, "past 2\\*\\*53"),
        ({"type": "number", "minimum": 1e17, "multipleOf": 100.0}, "past 2\\*\\*53"),
    ],
)
def test_keywords_of_the_wrong_type_are_refused_by_name(schema, message):
    """Refused as a 400 names them, never a server error (the conversion's memos key on them)."""
    with pytest.raises(ConstraintError, match=message):
        dfa_of(schema)


@pytest.mark.parametrize(
    "schema",
    [
        # a range past the window around zero: its own bound starts the window (was refused as "no
        # integer lies between the bounds 20000 and 10000")
        {"type": "integer", "minimum": 20000, "multipleOf": 0.5},
        {"type": "integer", "maximum": -20000, "multipleOf": 0.25},
        # an open side reaches past a large multipleOf (was "no multiple of 1e17 lies between")
        {"type": "integer", "minimum": 1, "multipleOf": 10**17},
    ],
)
def test_multiples_past_the_default_windows_are_served(schema):
    dfa = dfa_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for k in [*range(-20010, -19990), *range(19990, 20010), 10**17, 2 * 10**17, 10**17 + 1]:
        if dfa.matches(str(k).encode()):
            assert validator.is_valid(k), k
    assert_samples_valid(schema, budget=200)


def test_a_fractional_multiple_of_whose_multiples_are_not_regular_is_refused_by_name():
    # 7 / 0.7 is whole as floats but 21 / 0.7 is not (30.000000000000004): no integer step gives jsonschema's verdicts
    with pytest.raises(ConstraintError, match=r"multipleOf 0\.7 is not supported"):
        dfa_of({"type": "number", "multipleOf": 0.7})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 16},
        {"type": "integer", "multipleOf": 7, "minimum": -100, "exclusiveMaximum": 50},
        {"type": "number", "multipleOf": 3.0, "minimum": 1},
    ],
)
def test_whole_multiple_of_accepts_exactly_the_multiples(schema):
    dfa = dfa_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for i in range(-300, 300):
        assert dfa.matches(str(i).encode()) == validator.is_valid(i), i
    assert not dfa.matches(b"016") and not dfa.matches(b"1.5")
    assert_samples_valid(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 1_000_000},
        {"type": "integer", "multipleOf": 2_500_000, "minimum": -(10**8)},
        {"type": "number", "multipleOf": 1e6, "maximum": 10**9},
    ],
)
def test_a_multiple_of_ten_thousand_times_a_power_of_ten_is_served(schema):
    """Past MAX_MULTIPLE (a state per remainder) a multipleOf of d * 10**k is d's multiples then k
    zeros: conint(multiple_of=1_000_000) was refused."""
    dfa = dfa_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for i in [*range(-(10**7), 10**7, 125_000), 0, 1, 10**6 + 10, -(2 * 10**9), 10**12]:
        assert dfa.matches(str(i).encode()) == validator.is_valid(i), i
    assert not dfa.matches(b"-0") and not dfa.matches(b"00")
    assert_samples_valid(schema)
    with pytest.raises(ConstraintError, match="times a power of ten"):
        dfa_of({"type": "integer", "multipleOf": 123_457})


def test_no_multiple_between_the_bounds_is_unsatisfiable():
    with pytest.raises(ConstraintError, match="no multiple of 16"):
        dfa_of({"type": "integer", "multipleOf": 16, "minimum": 1, "maximum": 15})


# ------------------------------------------------------------------ combinators


def test_anyof_branches_keep_the_parents_keywords():
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "x": {"type": "string", "maxLength": 2}},
        "required": ["id"],
        "anyOf": [
            {"properties": {"x": {"type": "string", "minLength": 1}}, "required": ["x"]},
            {"properties": {"y": {"type": "null"}}, "required": ["y"]},
        ],
    }
    assert not accepts(schema, '{"x":"a"}')  # the parent's required id
    assert not accepts(schema, '{"id":1,"x":"abc"}')  # the parent's maxLength
    assert accepts(schema, '{"id":1,"x":"ab"}')
    assert accepts(schema, '{"id":1,"y":null}')
    assert_samples_valid(schema)


def test_allof_merges_every_branch():
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
            {"properties": {"a": {"maximum": 9}, "b": {"type": "boolean"}}, "required": ["b"]},
        ]
    }
    assert accepts(schema, '{"a":5,"b":true}')
    assert not accepts(schema, '{"a":10,"b":true}')
    assert not accepts(schema, '{"a":5}')
    assert_samples_valid(schema)


def test_allof_respects_a_branchs_additional_properties_false():
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            {"properties": {"b": {"type": "integer"}}},
        ]
    }
    assert not accepts(schema, '{"a":1,"b":2}')
    assert_samples_valid(schema)


def test_refs_with_siblings_and_nested_definitions():
    schema = {
        "$defs": {"pos": {"type": "integer", "minimum": 1}, "name": {"type": "string", "maxLength": 3}},
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/pos", "maximum": 3}, "s": {"$ref": "#/$defs/name"}},
        "required": ["n", "s"],
    }
    assert accepts(schema, '{"n":3,"s":"abc"}')
    assert not accepts(schema, '{"n":4,"s":"abc"}')
    assert_samples_valid(schema)


def test_oneof_with_exclusive_branches_is_served_and_overlapping_ones_refused():
    exclusive = {
        "oneOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]},
            {"type": "null"},
        ]
    }
    assert_samples_valid(exclusive)
    with pytest.raises(ConstraintError, match="oneOf"):
        dfa_of({"oneOf": [{"type": "integer"}, {"type": "number"}]})


def test_enum_values_are_checked_against_the_keywords_beside_them():
    schema = {"type": "string", "enum": ["a", "bb", 3], "maxLength": 1}
    assert accepts(schema, '"a"')
    assert not accepts(schema, '"bb"')
    assert not accepts(schema, "3")


def test_nullable_and_type_lists_take_each_types_own_keywords():
    """``nullable`` (OpenAPI) admits null there, and is an unknown keyword to JSON Schema: null is
    never generated for it, so answers validate under both; its negation excludes null."""
    schema = {"type": ["string", "integer"], "maxLength": 2, "minimum": 5, "nullable": True}
    assert accepts(schema, '"ab"') and accepts(schema, "7") and not accepts(schema, "null")
    assert not accepts(schema, "4") and not accepts(schema, '"abc"')
    assert_samples_valid(schema)
    negated = {"not": {"type": "string", "nullable": True}}
    assert not accepts(negated, "null") and not accepts(negated, '"a"') and accepts(negated, "1")


# ------------------------------------------------------------------ objects and arrays


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"type": "object", "additionalProperties": False},
        {"type": "object", "required": ["k"], "additionalProperties": {"type": "string"}},
        {"type": "object", "patternProperties": {"^x-": {"type": "boolean"}}},
        {"type": "object", "properties": {"x-a": {"type": "integer"}}, "patternProperties": {"^x-": {"minimum": 3}}},
        {"type": "array"},
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "null"}, "minItems": 2},
        {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
        {},
    ],
)
def test_free_form_and_open_shapes_generate_valid_values(schema):
    assert_samples_valid(schema, n=40)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "propertyNames": {"maxLength": 3}, "additionalProperties": {"type": "integer"}},
        {
            "type": "object",
            "properties": {"ab": {"type": "null"}, "abcd": {"type": "null"}},
            "propertyNames": {"maxLength": 3},
        },
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
            "required": ["c"],
            "dependentRequired": {"a": ["b"], "c": ["b"]},
        },
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}}, "minProperties": 1},
        {
            "oneOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ]
        },
    ],
)
def test_property_names_dependencies_min_properties_and_oneof_by_required_names(schema):
    assert_samples_valid(schema, n=40)


def test_min_properties_one_leaves_out_the_empty_object():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1}
    assert not accepts(schema, "{}") and accepts(schema, '{"a":1}')


def test_a_refusal_names_where_in_the_answer_it_arises():
    """A refusal inside a large schema ends with the JSON path of the value at fault."""
    bad = {"type": "string", "format": "multi-host-uri"}
    for schema, path in (
        ({"type": "object", "properties": {"db": bad}, "required": ["db"]}, "$.db"),
        ({"type": "object", "properties": {"a b": {"type": "array", "items": bad, "minItems": 1}}}, '$["a b"][*]'),
        ({"type": "array", "prefixItems": [{"type": "integer"}, {"properties": {"x": bad}}]}, "$[1].x"),
        (
            {"$defs": {"D": {"type": "object", "properties": {"u": bad}}}, "properties": {"d": {"$ref": "#/$defs/D"}}},
            "$.d.u",
        ),
    ):
        with pytest.raises(ConstraintError) as info:
            dfa_of(schema)
        assert info.value.message.endswith(f"(at {path})"), info.value.message
        assert "multi-host-uri" in info.value.message
    # an unsatisfiable required value too
    with pytest.raises(ConstraintError, match=re.escape("(at $.n)")):
        dfa_of(
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 2}}, "required": ["n"]}
        )


def test_annotations_are_ignored():
    schema = {
        "id": "http://example.com/s",
        "$id": "x",
        "x-internal": {"anything": 1},
        "markdownDescription": "**m**",
        "type": "object",
        "properties": {"a": {"type": "integer", "title": "A", "examples": [1], "deprecated": True}},
    }
    assert accepts(schema, '{"a":1}')


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "integer", "not": {"minimum": 3}}, "'not' of \\['minimum'\\] is not supported"),
        ({"type": "integer", "not": {"const": 3}}, "'not' with const/enum numbers"),
        ({"not": {"if": {"type": "string"}, "then": {"minLength": 2}}}, "'not' of a schema with if/then/else"),
        ({"$dynamicRef": "#meta"}, "dynamicRef"),
        ({"type": "array", "contains": {"type": "null"}, "unevaluatedItems": False}, "unevaluatedItems"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"type": "array", "uniqueItems": True, "minItems": 2}, "uniqueItems"),
    ],
)
def test_unsupported_keywords_are_refused_by_name(schema, keyword):
    with pytest.raises(ConstraintError, match=keyword):
        dfa_of(schema)


NOT_SCHEMAS = [
    {"type": "string", "maxLength": 2, "not": {"enum": ["a", "b", ""]}},
    {"type": "string", "not": {"pattern": "^[aA][sS]$"}},
    {"type": ["string", "integer", "boolean"], "not": {"type": "integer"}},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "not": {"required": ["a", "b"]},
    },
    {"type": "object", "additionalProperties": {"type": "integer"}, "not": {"required": ["a"]}},
    {"type": "string", "not": {"oneOf": [{"const": "X"}, {"const": "Y"}]}},
    {
        "type": "object",
        "properties": {"k": {"type": ["string", "null"]}},
        "not": {"properties": {"k": {"type": "string"}}},
    },
    {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "integer"}},
        "allOf": [{"not": {"required": ["a"]}}, {"not": {"required": ["b"]}}],
    },
]


@pytest.mark.parametrize("schema", NOT_SCHEMAS)
def test_not_is_served_as_a_sound_subset(schema):
    # 'not' was refused outright
    assert_samples_valid(schema, n=40)


def test_not_excludes_every_spelling_of_a_value():
    assert not accepts({"type": "string", "not": {"const": "a"}}, '"a"')
    assert not accepts({"type": "string", "not": {"const": "a"}}, '"\\u0061"')
    assert accepts({"type": "string", "not": {"const": "a"}}, '"ab"')
    free = {"type": "object", "additionalProperties": {"type": "integer"}, "not": {"required": ["a"]}}
    assert not accepts(free, '{"a":1}') and accepts(free, '{"b":1}')
    assert not accepts({"type": "string", "not": {"pattern": "^[aA][sS]$"}}, '"As"')


def test_thirty_five_optional_properties_compile_in_well_under_a_second():
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": ["string", "integer", "null"]} for i in range(35)},
    }
    started = time.monotonic()
    dfa = dfa_of(schema)
    assert time.monotonic() - started < 0.5
    assert dfa.matches(b'{"p3":1,"p34":null}') and not dfa.matches(b'{"p34":null,"p3":1}')


def test_distances_count_the_fewest_bytes_to_an_accepting_state():
    dfa = dfa_of({"type": "object", "properties": {"ab": {"type": "string"}}, "required": ["ab"]})
    dist = distances(dfa.table, dfa.accept)
    assert dist[dfa.start] == len('{"ab":""}')
    restricted = distances(dfa.table, dfa.accept, np.array([b != ord("}") for b in range(256)]))
    assert restricted[dfa.start] == UNREACHABLE


def test_an_intersection_builds_the_same_automaton_natively_and_in_the_python_reference():
    spec = ConstraintSpec(
        "json_schema",
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-c]+$", "maxLength": 4}}},
    )
    native, python = spec.to_dfa("native"), spec.to_dfa("python")
    np.testing.assert_array_equal(native.table, python.table)
    np.testing.assert_array_equal(native.accept, python.accept)


def test_a_recursive_ref_is_unrolled_to_a_bounded_depth():
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    assert accepts(tree, '{"v":1,"kids":[{"v":2,"kids":[{"v":3}]}]}')
    assert not accepts(tree, '{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[{"v":4}]}]}]}')  # 4 levels
    assert_samples_valid(tree)


def test_a_recursion_the_schema_requires_deeper_than_the_bound_is_refused():
    endless = {"$defs": {"a": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}}}
    with pytest.raises(ConstraintError, match="recursive"):
        dfa_of({**endless, "$ref": "#/$defs/a"})


@pytest.mark.parametrize(
    "schema",
    [
        # a listed value of one branch that the other's type (or pattern) refuses
        {"oneOf": [{"enum": [False]}, {"type": "string"}]},
        {"oneOf": [{"enum": ["none"]}, {"type": "string", "pattern": "^[0-9]+[smh]$"}]},
        # a discriminator behind allOf
        {
            "type": "object",
            "required": ["v"],
            "oneOf": [
                {"properties": {"v": {"allOf": [{"type": "string"}, {"const": "1"}]}, "a": {"type": "integer"}}},
                {"properties": {"v": {"allOf": [{"type": "string"}, {"const": "2"}]}, "b": {"type": "integer"}}},
            ],
        },
        # each branch requires a name the other declares: never generated in the other
        {
            "type": "object",
            "properties": {"deny": {"type": "string"}, "grant": {"type": "string"}},
            "oneOf": [{"required": ["deny"]}, {"required": ["grant"]}],
        },
        # one optional property each, nothing else allowed: both accept {}, so each requires its own
        {
            "oneOf": [
                {"type": "object", "properties": {"only": {"type": "boolean"}}, "additionalProperties": False},
                {"type": "object", "properties": {"except": {"type": "boolean"}}, "additionalProperties": False},
            ]
        },
        # arrays whose items exclude each other's overlap only on []
        {
            "oneOf": [
                {"type": "array", "items": {"enum": ["top", "left"]}},
                {"type": "array", "items": {"enum": ["vertical"]}},
            ]
        },
        # integer and number overlap: only the string branch is generated
        {"oneOf": [{"type": "integer"}, {"type": "number"}, {"type": "string", "maxLength": 3}]},
    ],
)
def test_oneof_generates_only_answers_that_match_exactly_one_branch(schema):
    assert_samples_valid(schema, n=80)


def test_oneof_with_only_overlapping_branches_is_refused():
    with pytest.raises(ConstraintError, match="oneOf"):
        dfa_of({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]})


ONEOF_NARROWED = [
    # a branch whose types come from its own oneOf and a $ref: told apart from the object branch
    (
        {
            "$defs": {"s": {"type": "string"}},
            "oneOf": [
                {"oneOf": [{"$ref": "#/$defs/s"}, {"type": "array", "items": {"type": "string"}}]},
                {"type": "object", "properties": {"a": {"type": "integer"}}},
            ],
        },
        ['"x"', '["x"]', '{"a":1}'],
        [],
    ),
    # several types, one of which another branch takes: only the others are generated
    (
        {"oneOf": [{"type": ["array", "boolean"], "items": {"type": "integer"}}, {"type": "boolean"}]},
        ["[1]"],
        ["true"],
    ),
    # a string branch against listed strings and against a pattern: those strings left out
    ({"oneOf": [{"type": "string"}, {"enum": ["inherit"]}]}, ['"x"'], ['"inherit"']),
    ({"oneOf": [{"type": "string"}, {"type": "string", "pattern": "^a"}]}, ['"b"', '"ba"'], ['"ab"', '"a"']),
    # a discriminator whose open branch excludes the others' values with 'not'
    (
        {
            "type": "object",
            "oneOf": [
                {"properties": {"k": {"type": "string", "not": {"enum": ["x", "y"]}}, "v": {"type": "integer"}}},
                {"properties": {"k": {"const": "x"}}},
                {"properties": {"k": {"const": "y"}}},
            ],
        },
        ['{"k":"z","v":1}', '{"k":"x"}'],
        ['{"v":1}'],
    ),
    # an open branch of a discriminator: the others' listed values left out of it
    (
        {
            "type": "object",
            "required": ["id"],
            "oneOf": [
                {"properties": {"id": {"type": "string"}}},
                {"properties": {"id": {"enum": ["a", "b"]}, "n": {"type": "integer"}}},
            ],
        },
        ['{"id":"c"}'],
        ['{"id":"a"}'],
    ),
]


@pytest.mark.parametrize(("schema", "yes", "no"), ONEOF_NARROWED)
def test_overlapping_oneof_branches_are_narrowed_until_they_exclude_each_other(schema, yes, no):
    assert_samples_valid(schema, n=80)
    for text in yes:
        assert accepts(schema, text), text
    for text in no:
        assert not accepts(schema, text), text


def test_several_pattern_properties_without_properties_generate_names_of_one_pattern_each():
    schema = {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}, "b$": {"type": "string"}},
        "additionalProperties": False,
    }
    assert_samples_valid(schema, n=120)
    assert accepts(schema, '{"ax":1,"xb":"s"}')
    assert not accepts(schema, '{"ab":1}')  # both patterns match: owed to both schemas, not generated
    assert not accepts(schema, '{"x":1}')  # neither matches: additionalProperties false


@pytest.mark.parametrize("fmt", ["int32", "int64", "password", "via [$symbol]($style)"])
def test_formats_outside_json_schemas_vocabulary_are_annotations(fmt):
    """JSON Schema 2019-09/2020-12: ``format`` annotates unless a format-assertion vocabulary is
    declared, and validators ignore formats they do not know: any string, as ``jsonschema`` says."""
    schema = {"type": "string", "format": fmt, "maxLength": 4}
    assert accepts(schema, '"a b"') and not accepts(schema, '"abcde"')
    assert_samples_valid(schema)
    assert accepts({"type": "string", "format": "uuid"}, '"00000000-0000-0000-0000-000000000000"')
    assert not accepts({"type": "string", "format": "uuid"}, '"a b"')  # a format it knows still constrains


def test_duration_format_generates_iso_durations():
    schema = {"type": "string", "format": "duration"}
    assert accepts(schema, '"P3D"') and accepts(schema, '"PT5M"') and not accepts(schema, '"3 days"')
    assert_samples_valid(schema)


def test_an_embedded_automaton_is_encoded_as_runs_of_equal_targets_per_row():
    from llmserve.constraints.regex import _DFA, _dfa_words, byte_ranges, compile_regex

    dfa = compile_regex("[a-c]x|[^b]y+|\\d{2}")
    expected = [_DFA, dfa.num_states, dfa.start, *(int(a) for a in dfa.accept)]
    for row in dfa.table:
        runs = byte_ranges(row)
        expected += [len(runs), *(x for run in runs for x in run)]
    np.testing.assert_array_equal(_dfa_words(dfa), np.array(expected, dtype=np.int32))


@pytest.mark.parametrize(
    "schema",
    [
        {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}},
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}, "y": {"type": "string"}},
            "required": ["kind"],
            "allOf": [{"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}}],
        },
        {"type": "integer", "if": False, "else": {"minimum": 5}},
        {"type": "boolean", "then": {"const": True}},  # no if: then has no effect
    ],
)
def test_if_then_else_answers_satisfy_if_and_then(schema):
    assert_samples_valid(schema, n=80)


IF_CHAIN = {
    "type": "object",
    "properties": {"kind": {"enum": ["a", "b", "c"]}, "x": {"type": "integer"}, "y": {"type": "boolean"}},
    "required": ["kind"],
    "allOf": [
        {
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"required": ["x"]},
            "else": {"properties": {"x": False}},
        },
        {"if": {"properties": {"kind": {"const": "b"}}}, "then": {"required": ["y"]}},
        {"if": {"properties": {"kind": {"const": "c"}}}, "then": {"properties": {"y": {"const": True}}}},
    ],
}


def test_if_chains_on_one_discriminator_generate_every_branch():
    # an if-chain (one 'if' per value of a property) was refused: every 'if' was held at once
    assert accepts(IF_CHAIN, '{"kind":"a","x":1}') and not accepts(IF_CHAIN, '{"kind":"a"}')
    assert accepts(IF_CHAIN, '{"kind":"b","y":false}') and not accepts(IF_CHAIN, '{"kind":"b","x":1,"y":true}')
    assert accepts(IF_CHAIN, '{"kind":"c","y":true}') and not accepts(IF_CHAIN, '{"kind":"c","y":false}')
    assert_samples_valid(IF_CHAIN, n=60)


def test_if_chain_branches_are_objects_only():
    # a non-object satisfies every 'if' of properties, so every 'then' would apply to it
    schema = {
        "type": ["object", "string"],
        "allOf": [
            {"if": {"properties": {"k": {"const": "a"}}}, "then": {"minLength": 3}},
            {"if": {"properties": {"k": {"const": "b"}}}, "then": {"maxLength": 1}},
        ],
    }
    assert not accepts(schema, '"ab"')
    assert_samples_valid(schema, n=40)


def test_ifs_that_cannot_hold_together_serve_the_later_one_by_its_else():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "allOf": [
            {"if": {"required": ["a"]}, "then": {"propertyNames": {"maxLength": 3}}},
            {"if": {"required": ["b"]}, "then": {"propertyNames": {"maxLength": 4}}},
        ],
    }
    assert accepts(schema, '{"a":1}')
    assert not accepts(schema, '{"a":1,"b":2}')  # the second 'if' fails: no "b"
    assert_samples_valid(schema, n=40)
    # an 'if' that cannot be negated: refused by name as before
    schema["allOf"][1]["if"] = {"minProperties": 2}
    with pytest.raises(ConstraintError, match=r"allOf with 2 if/then/else: served as an if-chain only when"):
        dfa_of(schema)


LOOKAHEADS = [
    ("^(?!variables$)([a-zA-Z][a-zA-Z0-9_]+)$", ["variables", "variable", "variabless", "ab", "a"]),
    (r"^(?=[^=]+$)(?!\s+$)(.|\n)+$", ["a=b", "  ", "ab", " a", ""]),
    (r"^(?!@@)[@a-zA-Z0-9_-]+$", ["@@a", "@a", "a@@"]),
    (r"^(?!.*--)[a-z-]+$", ["a--b", "a-b", "--"]),
]


@pytest.mark.parametrize(("pattern", "words"), LOOKAHEADS)
def test_lookaheads_at_a_patterns_start_match_as_python_re_does(pattern, words):
    # refused before ("look-around ... not supported")
    schema = {"type": "string", "pattern": pattern}
    for word in words:
        assert accepts(schema, json.dumps(word)) == (re.search(pattern, word) is not None), word
    assert_samples_valid(schema, n=20)


# ------------------------------------------------------------------ oneOf on both sides of allOf

ONE_OF_TWICE = {
    "allOf": [
        {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
        {"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "integer", "minimum": 5}, {"type": "null"}]},
    ]
}


def test_one_of_on_both_sides_of_all_of_is_one_of_over_the_pairs():
    """oneOf(A) & oneOf(B) is oneOf over the pairs Ai & Bj: a value satisfies |A's| * |B's| pairs."""
    assert accepts(ONE_OF_TWICE, '"ab"') and accepts(ONE_OF_TWICE, "7")
    for text in ('"abcd"', '"ba"', "4", "null", "true"):  # fails one side or the other
        assert not accepts(ONE_OF_TWICE, text), text
        assert not jsonschema.Draft202012Validator(ONE_OF_TWICE).is_valid(json.loads(text))
    assert_samples_valid(ONE_OF_TWICE)


def test_one_of_on_both_sides_keeps_only_pairs_it_can_tell_apart():
    # "ab" matches both strings of the first oneOf: it fails there, and must never be generated
    schema = {
        "allOf": [
            {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "b"}]},
            {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        ]
    }
    dfa = dfa_of(schema)
    assert not dfa.matches(b'"ab"') and not jsonschema.Draft202012Validator(schema).is_valid("ab")
    assert dfa.matches(b'"a"')  # the short strings without a "b": one branch of each side
    assert_samples_valid(schema)


# ------------------------------------------------------------------ \d \w \s in both dialects


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [
        # U+001C-U+001F and U+0085 are white space to Python's re (jsonschema), not to ECMA-262;
        # U+FEFF the other way round; U+00A0 to both
        ("^[^\\s-]+$", ["a\x1cb", "a\x85", "a\u00a0b", "a\ufeff", "a-b", "a b"]),
        ("^\\S+$", ["a\x1f", "\u3000", "\ufeff", "a\tb"]),
        ("^\\D+$", ["\u0663", "7"]),  # ARABIC-INDIC DIGIT THREE: a digit to Python only
        # a digit in a newer Unicode than Python 3.11's (Rust's regex, pydantic's, knows it)
        ("^\\D+$", ["\U00010d40", "a\U0001e4f0"]),
        ("^[^\\w.]+$", ["\u00e9", "a", "_", "."]),
        # word characters to Rust's regex (pydantic checks a field's pattern with it) only: a
        # combining mark, connector punctuation, a join control, a circled letter
        ("^\\W+$", ["\u0357", "\u06d9", "\u203f", "\u200c", "\u24b6"]),
    ],
)
def test_an_excluded_class_escape_excludes_what_either_dialect_counts_in_it(pattern, refused):
    schema = {"type": "string", "pattern": pattern}
    for value in refused:
        assert not accepts(schema, json.dumps(value, ensure_ascii=False)), repr(value)
        assert not accepts(schema, json.dumps(value)), repr(value)
    assert accepts(schema, '"!?"')
    assert_samples_valid(schema, n=80)


def test_pydantic_reads_back_a_pattern_that_excludes_word_characters():
    from pydantic import BaseModel, Field

    class Model(BaseModel):
        a: str = Field(pattern="^\\W{3}$")

    dfa = dfa_of(Model.model_json_schema())
    rng = random.Random(3)
    for _ in range(150):
        Model.model_validate_json(steered_walk(dfa, rng, 200, stop=0.1))


def test_a_string_that_holds_json_holds_json_text_of_its_content_schema():
    """pydantic's Json[T] (contentMediaType application/json, contentSchema T): answers read back as a T; the
    inner text's own quotes and backslashes are escaped once more."""
    from typing import Literal

    from pydantic import BaseModel, Field, Json

    class Inner(BaseModel):
        name: str
        kind: Literal['say "hi"', "back\\slash"]
        tags: list[int] = Field(max_length=3)

    class Model(BaseModel):
        payload: Json[Inner]
        anything: Json
        short: Json[list[int]] = Field(max_length=6)

    schema = Model.model_json_schema()
    inner = json.dumps({"name": "a", "kind": 'say "hi"', "tags": []}, separators=(",", ":"))
    outer = json.dumps({"payload": inner, "anything": "null", "short": "[1,2]"}, separators=(",", ":"))
    assert accepts(schema, outer)
    assert not accepts(schema, '{"payload":"{}","anything":"null","short":"[]"}')  # not an Inner
    assert not accepts(schema, '{"payload":"x","anything":"nul","short":"[]"}')
    dfa = dfa_of(schema)
    rng = random.Random(7)
    for _ in range(150):
        answer = Model.model_validate_json(steered_walk(dfa, rng, 300, stop=0.1))
        assert len(answer.short) <= 6
    assert_samples_valid(schema)
    # with the string's own keywords too: both hold
    bounded = {"type": "string", "contentMediaType": "application/json", "maxLength": 6, "pattern": "^\\["}
    dfa = dfa_of({**bounded, "contentSchema": {"type": "array", "items": {"type": "integer"}}})
    for _ in range(60):
        text = json.loads(steered_walk(dfa, rng, 100, stop=0.1))
        assert len(text) <= 6 and all(isinstance(v, int) for v in json.loads(text)), text
    # two content schemas (allOf) both hold
    merged = {
        "allOf": [
            {**bounded, "maxLength": 20, "pattern": "", "contentSchema": {"type": "integer"}},
            {"contentSchema": {"minimum": 5}},
        ]
    }
    assert accepts(merged, '"5"') and not accepts(merged, '"4"') and not accepts(merged, '"x"')
    # where no JSON text meets the string's own keywords, or the listed values are not JSON, those stand alone
    held = {"type": "string", "contentMediaType": "application/json"}
    assert accepts({**held, "const": "x"}, '"x"') and accepts({**held, "format": "date"}, '"2024-01-02"')
    assert accepts(
        {"allOf": [{**held, "contentSchema": {"type": "integer"}}, {"contentSchema": {"type": "string"}}]}, '"x"'
    )
    # base64-encoded JSON is not JSON text, and without the media type the content schema says nothing
    encoded = {"type": "string", "contentMediaType": "application/json", "contentEncoding": "base64"}
    assert accepts(encoded, '"e30="') and accepts(encoded, '"not json"')
    assert accepts({"type": "string", "contentSchema": {"type": "integer"}}, '"x"')


def test_a_required_class_escape_generates_what_both_dialects_count_in_it():
    schema = {"type": "string", "pattern": "^\\s\\d\\w$"}
    assert accepts(schema, '" 1a"') and accepts(schema, '"\\t9_"')
    assert not accepts(schema, '"\u00a01a"')  # white space to both, but not generated: a subset
    assert not accepts(schema, '"\\u001c1a"') and not accepts(schema, '" \u0663a"') and not accepts(schema, '" 1é"')
    assert_samples_valid(schema)


# ------------------------------------------------------------------ patternProperties with propertyNames


@pytest.mark.parametrize(
    "patterns",
    [{"^a": {"type": "integer"}}, {"^a": {"type": "integer"}, "^b": {"type": "string"}}],
)
def test_pattern_properties_with_property_names_generate_names_both_allow(patterns):
    schema = {
        "type": "object",
        "patternProperties": patterns,
        "propertyNames": {"maxLength": 3, "pattern": "^[a-z]+$"},
        "additionalProperties": False,
    }
    assert accepts(schema, '{"abc":1}')
    assert not accepts(schema, '{"abcd":1}')  # propertyNames' maxLength
    assert not accepts(schema, '{"aB":1}')  # propertyNames' pattern
    assert not accepts(schema, '{"xy":1}')  # no patternProperties pattern
    assert_samples_valid(schema, n=80)


def test_pattern_properties_no_name_of_which_property_names_allow_leave_the_empty_object():
    schema = {"type": "object", "patternProperties": {"^a": {}}, "propertyNames": {"pattern": "^b"}}
    assert accepts(schema, "{}") and not accepts(schema, '{"ab":1}')
    with pytest.raises(ConstraintError):
        dfa_of({**schema, "minProperties": 1})


def test_one_of_arrays_told_apart_by_the_type_of_their_referenced_items():
    """``[]`` matches both branches; arrays of at least one item cannot (strings against objects)."""
    schema = {
        "definitions": {"secret": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"$ref": "#/definitions/secret"}},
        ],
    }
    assert accepts(schema, '["a"]') and accepts(schema, '[{"name":"x"}]')
    assert not accepts(schema, "[]") and not jsonschema.Draft7Validator(schema).is_valid([])
    assert not accepts(schema, '["a",{}]')
    assert_samples_valid(schema)


def test_property_names_of_another_type_leave_only_the_empty_object():
    """pydantic writes dict[IntEnum, X] with an integer propertyNames: no name (a string) passes it, so {} is the one
    answer, not no answer."""
    schema = {"type": "object", "propertyNames": {"type": "integer", "enum": [1, 2]}, "additionalProperties": True}
    assert accepts(schema, "{}") and not accepts(schema, '{"1":true}')
    assert accepts({**schema, "properties": {"a": {}}}, "{}")
    for refused in ({**schema, "minProperties": 1}, {**schema, "properties": {"a": {}}, "required": ["a"]}):
        with pytest.raises(ConstraintError):
            dfa_of(refused)
    assert_samples_valid({"type": "object", "properties": {"d": schema}, "required": ["d"]})


def test_the_empty_pattern_alone_with_no_additional_properties_generates_the_empty_object():
    """JSON Schema: "" matches every name; jsonschema (4.26) counts every member additional there."""
    schema = {"type": "object", "patternProperties": {"": {"type": "integer"}}, "additionalProperties": False}
    assert not jsonschema.Draft7Validator(schema).is_valid({"a": 1})  # what the subset follows
    assert accepts(schema, "{}") and not accepts(schema, '{"a":1}')
    assert_samples_valid(schema)
    wider = {**schema, "additionalProperties": True}  # no additionalProperties check to trip
    assert accepts(wider, '{"a":1}') and jsonschema.Draft7Validator(wider).is_valid({"a": 1})
    assert_samples_valid(wider)


# ------------------------------------------------------------------ minProperties / maxProperties

PROPS_ABCD = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}, "d": {"type": "integer"}}


def test_max_properties_below_the_declared_keeps_the_required_and_the_first_optional():
    schema = {"type": "object", "properties": PROPS_ABCD, "required": ["c"], "maxProperties": 2}
    assert accepts(schema, '{"a":1,"c":2}') and accepts(schema, '{"c":2}')
    assert not accepts(schema, '{"a":1,"b":1,"c":2}')  # three members
    assert not accepts(schema, '{"c":2,"d":1}')  # a subset: only the first optional property
    assert_samples_valid(schema)
    with pytest.raises(ConstraintError):
        dfa_of({**schema, "required": ["a", "b", "c"]})


def test_min_properties_above_the_required_requires_the_first_optional():
    schema = {"type": "object", "properties": PROPS_ABCD, "required": ["d"], "minProperties": 3}
    assert accepts(schema, '{"a":1,"b":1,"d":2}') and accepts(schema, '{"a":1,"b":1,"c":1,"d":2}')
    assert not accepts(schema, '{"a":1,"d":2}')  # two members
    assert_samples_valid(schema)
    with pytest.raises(ConstraintError, match="minProperties"):
        dfa_of({**schema, "minProperties": 5})


def test_a_ref_pointer_is_percent_decoded():
    schema = {
        "definitions": {"a:b c": {"type": "integer", "minimum": 3}},
        "type": "object",
        "properties": {"x": {"$ref": "#/definitions/a%3Ab%20c"}},
        "required": ["x"],
    }
    assert accepts(schema, '{"x":3}') and not accepts(schema, '{"x":2}')
    assert jsonschema.Draft7Validator(schema).is_valid({"x": 3})
    assert_samples_valid(schema)


@pytest.mark.parametrize(
    ("pattern", "values"),
    [
        ("^(?:^lucene\\.|builtin\\.)", ["lucene.x", "builtin.", "xlucene.", "a", "x builtin."]),
        ("^(?:^[a-z]+:)?[^\\s]*$", ["http:x", "abc", "a b", ":x", "1:x"]),
    ],
)
def test_a_caret_right_after_the_leading_caret_is_the_same_anchor(pattern, values):
    schema = {"type": "string", "pattern": pattern}
    for value in values:
        assert accepts(schema, json.dumps(value)) == (re.search(pattern, value) is not None), value
    assert_samples_valid(schema)


def test_a_caret_inside_a_repetition_is_still_refused():
    with pytest.raises(ConstraintError, match="only at the start and end"):
        dfa_of({"type": "string", "pattern": "^(^a)*b$"})  # a second round does not start at 0


# ------------------------------------------------------------------ integral floats listed as values

DRAFT4 = "http://json-schema.org/draft-04/schema#"


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": DRAFT4, "type": "integer", "enum": [1.0, 2]},
        {
            "$schema": DRAFT4,
            "type": "object",
            "properties": {"n": {"type": "integer", "const": 3.0}},
            "required": ["n"],
        },
        # a subschema naming draft 4 is validated under draft 4's rules, whatever the root says
        {"type": "object", "properties": {"n": {"$schema": DRAFT4, "type": "integer", "enum": [-0.0, 7.0]}}},
        {"$schema": DRAFT4, "type": "array", "items": {"type": "integer", "enum": [1.0, 2.0]}, "maxItems": 3},
    ],
)
def test_an_integral_float_listed_for_an_integer_is_answered_as_draft_4_integers_too(schema):
    """Draft 4 counts 1.0 as a number, not an integer: the listed value is spelled "1", the same
    JSON Schema value under every draft."""
    dfa = dfa_of(schema)
    assert not dfa.matches(b"1.0")
    assert_samples_valid(schema)


def test_a_huge_integral_float_is_answered_in_all_its_digits_and_a_fraction_as_it_is():
    schema = {"$schema": DRAFT4, "type": "integer", "enum": [1.0, 1e20]}
    dfa = dfa_of(schema)
    assert dfa.matches(b"100000000000000000000") and not dfa.matches(b"1e+20")
    assert_samples_valid(schema)
    assert dfa_of({"enum": [1.5]}).matches(b"1.5")


# ------------------------------------------------------------------ draft 3


DRAFT3 = "http://json-schema.org/draft-03/schema#"


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": DRAFT3, "type": "object", "properties": {"a": {"type": "string", "required": True}}},
        {"$schema": DRAFT3, "type": "integer", "divisibleBy": 3},
        {"type": "object", "properties": {"a": {"$schema": DRAFT3, "extends": {"type": "string"}}}},
        {"$defs": {"x": {"$schema": DRAFT3}}, "type": "string"},
        # a property named like a value keyword still holds a schema
        {"type": "object", "properties": {"enum": {"$schema": DRAFT3, "type": "integer", "divisibleBy": 7}}},
        # what a local reference points at is a schema wherever it sits
        {"type": "object", "properties": {"a": {"$ref": "#/x-shared/n"}}, "x-shared": {"n": {"$schema": DRAFT3}}},
        {"type": "array", "items": [{"$schema": "http://json-schema.org/draft-03/hyper-schema"}]},
    ],
)
def test_draft_3_is_refused_where_its_keywords_would_be_misread(schema):
    with pytest.raises(ConstraintError, match=r"draft 3, which is not supported.*draft 4 or later"):
        dfa_of(schema)


def test_draft_3_named_inside_a_value_or_an_annotation_is_only_that():
    schema = {
        "type": "object",
        "default": {"$schema": DRAFT3},
        "x-meta": {"$schema": DRAFT3},
        "example": {"$schema": DRAFT3},
        "properties": {"s": {"const": {"$schema": DRAFT3}}},
    }
    assert accepts(schema, '{"s":{"$schema":"' + DRAFT3 + '"}}')
    assert accepts({"$schema": "https://example.com/my-draft-03/schema", "type": "integer"}, "1")


# ------------------------------------------------------------------ parsed trees kept


def test_a_kept_pattern_tree_is_per_reading():
    """Parsed trees are kept per pattern and reading: the excluded reading of ``\\d`` (what either
    dialect counts as a digit) is not the generated one (ASCII digits), however often both are met."""
    from llmserve.constraints.regex import parse

    for _ in range(2):
        wide, narrow = parse("\\d", schema=True, excluded=True), parse("\\d", schema=True)
        assert wide != narrow
        assert parse("\\d", schema=True) is narrow
    for _ in range(2):  # a refusal is not kept: it is raised every time
        with pytest.raises(ConstraintError, match="unbalanced"):
            parse("a)", schema=True)


def test_a_pattern_whose_tree_is_large_is_parsed_at_each_use_not_kept():
    """What is kept per pattern is bounded by its size, not only by a count: a short pattern of
    negated Unicode categories parses to megabytes (a hostile request's) and is never held by the
    process; a plain one is kept and shared."""
    from llmserve.constraints import regex

    large = "\\P{L}" * 600 + "x"
    assert regex.tree_bytes(regex.parse(large, schema=True)) > regex.PARSED_KEPT_BYTES // 16
    kept = regex._PARSED._kept.nbytes
    assert regex.parse(large, schema=True) is not regex.parse(large, schema=True)
    assert regex._PARSED._kept.nbytes == kept
    small = "^kept-once-[0-9]$"
    assert regex.parse(small, schema=True) is regex.parse(small, schema=True)
    assert regex._PARSED._kept.nbytes <= regex.PARSED_KEPT_BYTES


@pytest.mark.parametrize(
    "obj",
    [
        {"json_schema": {"const": "\ud800"}},
        {"json_schema": {"type": "integer", "description": "\ud800"}},
        {"json_schema": {"type": "object", "properties": {"\udfff": {"type": "integer"}}, "required": ["\udfff"]}},
        {"regex": "\ud800"},
        {"choice": ["\ud800", "b"]},
    ],
)
def test_a_lone_surrogate_is_a_refusal_or_nothing_never_a_crash(obj, tmp_path):
    """A lone surrogate cannot be written as UTF-8 (the cache keys' input was, a 500): refused as matching no string
    where an answer would need it, else harmless (an annotation, one choice of two)."""
    from llmserve.constraints.compiler import check_constraint
    from llmserve.constraints.spec import spec_from_request

    try:
        check_constraint(spec_from_request(obj), cache_dir=tmp_path)
    except ConstraintError as exc:
        assert "no string" in exc.message


DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"
BASE = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "unevaluatedProperties": False},
        # the names a $ref or an allOf member declares are evaluated
        {
            "$defs": {"base": BASE},
            "$ref": "#/$defs/base",
            "properties": {"b": {"type": "string", "maxLength": 3}},
            "required": ["b"],
            "unevaluatedProperties": False,
        },
        {"allOf": [BASE, {"properties": {"c": {"type": "null"}}, "required": ["c"]}], "unevaluatedProperties": False},
        # a closed base keeps its own scope: the name its parent adds is not evaluated there, so never generated
        {
            "$defs": {"base": {**BASE, "unevaluatedProperties": False}},
            "$ref": "#/$defs/base",
            "properties": {"b": {"type": "string"}},
        },
        {"type": "object", "unevaluatedProperties": {"type": "integer"}, "minProperties": 1},
        {"type": "object", "properties": {"a": {"type": "null"}}, "unevaluatedProperties": True, "required": ["a"]},
        {"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False, "minItems": 1},
        {"type": "array", "unevaluatedItems": {"type": "integer"}, "minItems": 2},
        {"type": "array", "allOf": [{"prefixItems": [{"type": "null"}]}], "unevaluatedItems": {"type": "boolean"}},
    ],
)
def test_unevaluated_keywords_hold_where_what_is_evaluated_is_known(schema):
    assert_samples_valid({"$schema": DRAFT_2020, **schema}, n=40)


def test_a_closed_base_refuses_a_name_its_parent_requires_and_conditional_scopes_stay_refused():
    closed = {"$defs": {"base": {**BASE, "unevaluatedProperties": False}}, "$ref": "#/$defs/base"}
    with pytest.raises(ConstraintError, match="'b'"):
        dfa_of({**closed, "properties": {"b": {"type": "string"}}, "required": ["b"]})
    assert not accepts({**closed, "properties": {"b": {"type": "string"}}}, '{"a":1,"b":"x"}')
    for schema in (
        {"type": "array", "contains": {"type": "string"}, "unevaluatedItems": False},
        {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False},
        {"type": "object", "not": {"required": ["q"]}, "unevaluatedProperties": False},
        # which branch evaluated a name depends on the answer
        {"type": "object", "anyOf": [{"properties": {"x": {"const": 1}}}], "unevaluatedProperties": False},
    ):
        with pytest.raises(ConstraintError, match="unevaluated"):
            dfa_of(schema)


def test_a_remembered_refusal_is_raised_as_a_new_error_each_time(tmp_path):
    """Raising the remembered object itself chained every raise's frames (holding the request) onto its traceback:
    memory grew with each request that repeated a refused constraint."""
    import traceback

    from llmserve.constraints.compiler import check_constraint
    from llmserve.constraints.spec import spec_from_request

    spec = spec_from_request({"json_schema": {"type": "string", "minLength": 3, "maxLength": 2}})
    seen = []
    for _ in range(5):
        with pytest.raises(ConstraintError) as info:
            check_constraint(spec, cache_dir=tmp_path)
        seen.append(info.value)
    assert len({id(e) for e in seen}) == 5 and len({e.message for e in seen}) == 1
    depths = [len(traceback.extract_tb(e.__traceback__)) for e in seen[1:]]
    assert depths == [depths[0]] * 4, depths


def test_a_schema_sent_as_deeply_nested_json_text_is_refused_not_a_crash():
    """The request body's depth limit never sees inside a string: the parser's RecursionError was a 500."""
    from llmserve.constraints.spec import spec_from_request

    deep = '{"not":' * 5000 + "{}" + "}" * 5000
    with pytest.raises(ConstraintError, match="nested too deeply"):
        ConstraintSpec("json_schema", deep)
    with pytest.raises(ConstraintError, match="nested too deeply"):
        spec_from_request('{"json_schema":' + deep + "}")


@pytest.mark.parametrize(
    "schema,kept",
    [
        ({"const": 0.1, "minimum": 0.1}, ["0.1"]),
        ({"enum": [0.3, 0.4], "maximum": 0.3}, ["0.3"]),
        ({"enum": [1, 2, 3], "exclusiveMinimum": 1, "maximum": 2}, ["2"]),
        (
            {
                "enum": [1, 2],
                "minimum": 1,
                "exclusiveMinimum": True,
                "$schema": "http://json-schema.org/draft-04/schema#",
            },
            ["2"],
        ),
        ({"enum": ["a", 5], "minimum": 6}, ['"a"']),  # bounds apply to numbers only
    ],
)
def test_listed_values_meet_the_bounds_beside_them_as_values(schema, kept):
    """The number automaton of the bounds is a subset of the numbers: a listed 0.1 beside minimum 0.1 was left out
    of it, and the schema refused as having no value (found by the JSON-Schema-Test-Suite sweep)."""
    dfa = dfa_of(schema)
    assert [t for t in ("0.1", "0.3", "0.4", "1", "2", "3", '"a"', "5") if dfa.matches(t.encode())] == kept
    assert_samples_valid(schema, n=10)


def test_review_cases_of_the_unevaluated_rewrite():
    """A never-failing keyword in an allOf member still evaluates every name for its parent; prefixItems evaluates
    nothing under 2019-09 (it is not a keyword there); a nesting deeper than the walk goes is refused, not a 500."""
    d2019 = "https://json-schema.org/draft/2019-09/schema"
    for schema in (
        {
            "type": "object",
            "allOf": [{"unevaluatedProperties": True}],
            "required": ["a"],
            "unevaluatedProperties": False,
        },
        {"type": "array", "allOf": [{"unevaluatedItems": True}], "minItems": 1, "unevaluatedItems": False},
        {"$schema": d2019, "type": "array", "items": [{"type": "null"}], "unevaluatedItems": False, "minItems": 1},
    ):
        assert_samples_valid(schema, n=20)
    with pytest.raises(ConstraintError, match="unevaluatedItems"):
        dfa_of({"$schema": d2019, "type": "array", "prefixItems": [{}], "unevaluatedItems": False})
    deep: dict = {"type": "string"}
    for _ in range(600):
        deep = {"not": deep}
    with pytest.raises(ConstraintError, match="nested"):
        dfa_of(deep)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "required": [{"a": 1}]},
        {"allOf": [{"minimum": "x"}, {"minimum": 1}], "type": "integer"},
        {"type": "number", "minimum": 1e308, "maximum": 1e308},
        {"type": "integer", "minimum": 10**400},
    ],
)
def test_a_value_of_the_wrong_type_or_range_is_a_refusal_not_a_crash(schema):
    """What the metaschema check (skipped past 10,000 subschemas, never run on the constraint keys) would name."""
    with pytest.raises(ConstraintError, match="wrong type, or a number out of range"):
        dfa_of(schema)
