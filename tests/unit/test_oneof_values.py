"""A ``oneOf`` whose branches only list values (a linter's rule names, each a ``const`` with its
description) is served as the values exactly one branch lists, without the pairwise analysis: at
least what that analysis serves, and JSON Schema's answer for every listed value."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmserve.constraints import ConstraintError
from llmserve.constraints import jsonschema as js
from llmserve.constraints.spec import ConstraintSpec

POOL = ["a", "b", "DL3000", 'q"', 1, 1.0, 2, 2.5, True, False, None, [1], {"k": "v"}]
TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]


@st.composite
def branches(draw):
    values = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=3))
    branch: dict = {"const": values[0]} if len(values) == 1 and draw(st.booleans()) else {"enum": values}
    if draw(st.booleans()):
        branch["type"] = draw(st.sampled_from(TYPES))
    if draw(st.booleans()):
        branch["description"] = "a rule"
    return branch


def automaton(schema, pairwise: bool, monkeypatch):
    with monkeypatch.context() as m:
        if pairwise:
            m.setattr(js, "_one_of_values", lambda merged, plain: None)
        return ConstraintSpec("json_schema", schema).to_dfa()


@settings(max_examples=200, deadline=None)
@given(st.lists(branches(), min_size=2, max_size=5), st.sampled_from([None, "string", ["string", "number"]]))
def test_listed_values_are_served_as_the_pairwise_analysis_serves_them(branches_, outer_type):
    monkeypatch = pytest.MonkeyPatch()
    schema: dict = {"oneOf": branches_}
    if outer_type is not None:
        schema["type"] = outer_type
    try:
        fast = automaton(schema, False, monkeypatch)
    except ConstraintError:
        with pytest.raises(ConstraintError):  # refused only where the analysis refuses too
            automaton(schema, True, monkeypatch)
        return
    try:
        slow = automaton(schema, True, monkeypatch)
    except ConstraintError:  # the analysis may refuse what it cannot tell apart ([["a", 1], ["b", 1]])
        slow = None
    validator = jsonschema.Draft202012Validator(schema)
    for value in POOL:
        text = json.dumps(value, separators=(",", ":"))
        # the analysis serves a subset where it cannot tell branches apart (it leaves out "b" of
        # [["a"], ["b", 1]]): what it serves is served here too
        assert slow is None or fast.matches(text.encode()) or not slow.matches(text.encode()), text
        if isinstance(value, (str, bool)) or value is None:
            assert fast.matches(text.encode()) == validator.is_valid(value), text
        elif fast.matches(text.encode()):  # a number, array or object: one spelling of it is served
            assert validator.is_valid(value), text


def test_a_hundred_rule_names_take_no_pairwise_analysis(monkeypatch):
    rules = [{"const": f"DL{3000 + i}", "description": f"rule {i}"} for i in range(100)]
    schema = {"type": "array", "items": {"type": "string", "oneOf": rules}}
    monkeypatch.setattr(js, "_excludes", lambda *a: pytest.fail("the pairwise analysis ran"))
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    assert dfa.matches(b'["DL3000","DL3099"]')
    assert not dfa.matches(b'["DL3100"]')


def test_a_value_two_branches_list_is_no_answer():
    schema = {"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}, {"const": "d", "type": "integer"}]}
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    assert [dfa.matches(json.dumps(v).encode()) for v in "abcd"] == [True, False, True, False]


@pytest.mark.parametrize(
    "schema",
    [
        {"oneOf": [{"const": float("nan")}, {"const": "a"}]},
        {"enum": [1, float("inf")]},
        {"type": "object", "properties": {"x": {"const": {"a": [float("-inf")]}}}},
    ],
)
def test_nan_and_infinity_are_refused_not_generated(schema):
    """Python's json reads NaN and Infinity (a request body may hold them); no JSON text may."""
    with pytest.raises(ConstraintError, match="NaN and Infinity are not JSON"):
        ConstraintSpec("json_schema", schema).to_dfa()
