"""A ``pattern`` is a search (JSON Schema): its unanchored alternatives are searched for as one
group, ``.*(?:a|b).*``, not as one search each, ``.*a.*|.*b.*``. Same values, so the same minimal
automaton; but separate searches each keep their own place after a match, and the subsets of their
automaton multiply (seconds to build for a pattern of seven such alternatives)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.regex import compile_ast, parse
from llmserve.constraints.schema_strings import _with_left, _with_right, pattern_ast

# SchemaStore's Ansible-like hosts schema (1fffbe764e42): a host's operating system type
OS_NAMES = (
    r"^lin|^lnx$|^win|^ms.*win|^microsoft.*w|^oob$|^out|^vmware|^mgmt|^management|^esx|^blade|^net|"
    r"^switch|^sto|^san|vms|tru64|osf|hp.*ux|aix|rs6000|^sun|^ora|sol"
)

PATTERNS = [
    r"abc|x.*y|q+",
    r"^a|b|c$|d",
    r"a*|bc",  # a branch that matches nothing: the search matches every value
    r"(?=a)ab|cd|ef",  # look-around stays a search of its own
    r"[0-9]{2}|[a-f]{3}|^zz$",
    r"foo",
]


def _one_search_each(pattern: str):
    return _with_right(_with_left(parse(pattern, schema=True)))


@pytest.mark.parametrize("pattern", [p for p in PATTERNS if "(?=" not in p])
def test_one_group_is_the_same_automaton_as_one_search_each(pattern):
    grouped, separate = compile_ast(pattern_ast(pattern)), compile_ast(_one_search_each(pattern))
    np.testing.assert_array_equal(grouped.table, separate.table)  # minimal automata: same language
    np.testing.assert_array_equal(grouped.accept, separate.accept)


def test_look_around_alternatives_still_match_as_searches():
    dfa = compile_ast(pattern_ast(PATTERNS[3]))
    for value, ok in [("xxabyy", True), ("acd", True), ("ef", True), ("xaxx", False), ("a", False)]:
        assert dfa.matches(value.encode()) is ok, value


def test_many_unanchored_alternatives_build_within_a_small_budget():
    set_limits(Limits(compile_ms=500))  # one search each took 1.7 s here
    try:
        started = time.monotonic()
        dfa = compile_ast(pattern_ast(OS_NAMES, started), started=started)
    finally:
        set_limits(None)
    for value, ok in [("linux", True), ("hp-ux", True), ("hpx", False), ("my-hpux-box", True), ("xsolaris", True)]:
        assert dfa.matches(value.encode()) is ok, value
    assert dfa.matches(b"sun4") and not dfa.matches(b"asun") and dfa.matches(b"asol")
