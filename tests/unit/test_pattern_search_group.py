"""A ``pattern`` is a search (JSON Schema): alternatives that end open share one ``.*`` after them,
``(?:a|b).*``, instead of one each, ``a.*|b.*``. Same values, so the same minimal automaton; but
with one ``.*`` each the automaton keeps a place in the value after a match for each alternative
that matched, and its subsets multiply (seconds to build, or past the state limit, for patterns of
many alternatives that SchemaStore's schemas hold)."""

from __future__ import annotations

import random
import re
import time

import numpy as np
import pytest

from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.regex import compile_ast, parse
from llmserve.constraints.schema_strings import _ANY, pattern_ast

# SchemaStore's hosts schema (1fffbe764e42): a host's operating system type
OS_NAMES = (
    r"^lin|^lnx$|^win|^ms.*win|^microsoft.*w|^oob$|^out|^vmware|^mgmt|^management|^esx|^blade|^net|"
    r"^switch|^sto|^san|vms|tru64|osf|hp.*ux|aix|rs6000|^sun|^ora|sol"
)
# a CSS length's unit, unanchored (refused before: more than 65,536 states)
UNITS = r"(em|ex|ch|vw|vh|cm|mm|in|pt|pc|px|rem|vmin|vmax|%)"

PATTERNS = [
    r"abc|x.*y|q+",
    r"^a|b|c$|d",
    r"a*|bc",  # a branch that matches nothing: the search matches every value
    r"[0-9]{2}|[a-f]{3}|^zz$",
    r"(x|y)z|w",
    r"((a|b)|c$)|d",
    r"ab|(?=c)cd|ef",  # look-around keeps its own reading
    UNITS,
    OS_NAMES,
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_search_matches_what_re_search_finds(pattern):
    dfa = compile_ast(pattern_ast(pattern)) if "(?=" not in pattern else None
    node = pattern_ast(pattern)
    if dfa is None:  # a look-around pattern is an automaton already
        assert node[0] == "dfa"
        dfa = node[1]
    rng = random.Random(pattern)
    letters = sorted(set(re.sub(r"[^a-z0-9%]", "", pattern)) | {"-", "_"})
    for _ in range(400):
        value = "".join(rng.choice(letters) for _ in range(rng.randint(0, 9)))
        assert dfa.matches(value.encode()) is bool(re.search(pattern, value)), (pattern, value)


@pytest.mark.parametrize("pattern", [r"abc|x.*y|q+", r"a*|bc", r"(vms|tru64|osf|hp.*ux|aix)"])
def test_one_shared_tail_is_the_automaton_of_one_search_each(pattern):
    tree = parse(pattern, schema=True)
    while tree[0] == "cat" and len(tree[1]) == 1:  # a group around the alternation
        tree = tree[1][0]
    each = ("alt", [("cat", [_ANY, branch, _ANY]) for branch in tree[1]])
    grouped, separate = compile_ast(pattern_ast(pattern)), compile_ast(each)
    np.testing.assert_array_equal(grouped.table, separate.table)  # minimal automata: same values
    np.testing.assert_array_equal(grouped.accept, separate.accept)


@pytest.mark.parametrize("pattern", [OS_NAMES, UNITS])
def test_many_open_alternatives_build_within_a_small_budget(pattern):
    set_limits(Limits(compile_ms=500))  # one tail each: 1.7 s, or over the state limit
    try:
        started = time.monotonic()
        dfa = compile_ast(pattern_ast(pattern, started), started=started)
    finally:
        set_limits(None)
    assert dfa.num_states < 300
