"""Look-around, ``\\b`` and ``\\p{...}`` in JSON Schema patterns (issue #17 item 2).

A pattern's automaton (over the decoded value) is compared with Python's ``re.search`` on random
strings: exact where the construction is exact (strings without a newline: Python's ``$`` also
matches before a final newline, ECMA-262's does not, and the automaton keeps to the values both
accept), a subset where the module says so (``\\b``, ``\\p``, the left-anchored fallback), and
never a superset. Then the JSON side: every sampled answer validates with ``jsonschema``."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import regex as regex_module  # the locked stack has it (transformers): reads \p{..}, variable look-behinds
from support.automata import steered_walk

from llmserve.constraints import ConstraintError
from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.regex import compile_ast, parse
from llmserve.constraints.schema_strings import SEARCH_EXACT_STATES, pattern_ast
from llmserve.constraints.spec import ConstraintSpec


def decoded(pattern: str):
    node = pattern_ast(pattern)
    return node[1] if node[0] == "dfa" else compile_ast(node)


def reference(pattern: str):
    try:
        return re.compile(pattern)
    except re.error:
        return regex_module.compile(pattern)


def check(pattern: str, alphabet: str, exact: bool, n: int = 3000, seed: int = 0) -> int:
    """Random strings over ``alphabet``: accepted -> ``re.search`` matches; exact: and back."""
    dfa = decoded(pattern)
    ref = reference(pattern)
    rng = random.Random(seed)
    accepted = 0
    for _ in range(n):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        got = dfa.matches(word.encode())
        want = ref.search(word) is not None
        assert not got or want, (pattern, word)  # never a superset
        if exact and "\n" not in word:
            assert got == want, (pattern, word)
        accepted += got
    return accepted


# the corpus's patterns (SchemaStore), then smaller ones for each construct
EXACT = [
    (r"^(?!plugins$)[a-z0-9][a-z0-9+-]*$", "plugins+-a\n"),
    (r"^(?!-)[-a-z0-9]{0,49}[a-z0-9]$", "-ab0"),
    (r"^((?!(c|C)(l|L)(y|Y)(d|D)(e|E)).)*$", "clydeCLYDEx\n"),
    (r"^@([\da-z](?:(?!.*--)[\da-z-]*[\da-z])?)/([\da-z](?:(?!.*--)[\da-z-]*[\da-z])?)$", "@/a-1"),
    (r"^(?!-)(?!.{0,32}--)[a-z0-9-]{1,32}(?<!-)$", "a-b"),
    (r"^(?!@@)[@a-zA-Z0-9_-]+$", "@a_"),
    (r"^(?!variables$)([a-zA-Z][a-zA-Z0-9_]+)$", "variables_"),
    (
        r"^P(?!$)(\d+(?:\.\d+)?Y)?(\d+(?:\.\d+)?M)?(\d+(?:\.\d+)?W)?(\d+(?:\.\d+)?D)?"
        r"(T(?=\d)(\d+(?:\.\d+)?H)?(\d+(?:\.\d+)?M)?(\d+(?:\.\d+)?S)?)?$",
        "P1.2YMWDTHS\n",
    ),
    (r"(?!(^(a|b)$|^xn--|-s3alias$))^[a-z0-9][a-z0-9.-]{1,6}[a-z0-9]$", "abxn-s3alis."),
    (r"^(.*?)\s(warn\s(>=|==|<=|>|<))(?=\s)(.*?)per\s(test|interval)$", "warn >= per test"),
    (r"^\/(([A-z0-9\-\%]+\/)*[A-z0-9\-\%]+$)?", "/a%-"),  # a '$' inside a group
    # one construct each, anchored or not
    (r"a(?=b)", "ab\n"),
    (r"a(?!b)", "ab\n"),
    (r"(?<=a)b", "ab\n"),
    (r"(?<!a)b", "ab\n"),
    (r"^a(?=.*c$)\w+", "abc\n"),
    (r"x(?=y$)", "xy\n"),
    (r"(?<=^|-)x", "x-y"),
    (r"^(?!.*(?:ab|ba)).*$", "ab\n"),
    (r"((?!ab).)+b$", "ab"),
    (r"(?<=[ab]{2})c", "abc"),
    (r"(?<!a.)c", "abc"),
    (r"(?=a)(?=.b)..", "abc"),
    (r"(?!a$)", "a\n"),
    (r"^(?!x$)", "x\n"),
    (r"^[a-z]+(?<!ing)$", "ingab"),
    (r"(?<=(?<!a)b)c", "abc"),  # nested look-behinds
    (r"(?=(?!ab)a)", "abc"),  # nested look-aheads
    (r"^(a(?=b)|b(?<=a.))+$", "ab"),  # inside a repetition
    (r"(?!)", "a"),  # never holds: no value
    # next to a search's .*: nullable items dropped, a repetition read its least number of times
    (r"x{2,}y?", "xy"),
    (r"(?:ab)+c*(?=a)", "abc"),
    (r"b*(a|b){2,3}", "ab"),
]


@pytest.mark.parametrize(("pattern", "alphabet"), EXACT)
def test_look_around_matches_as_python_re_searches(pattern, alphabet):
    if pattern == "(?!)":
        with pytest.raises(ConstraintError, match="no string matches"):
            decoded(pattern)
        return
    check(pattern, alphabet, exact=True)


SUBSETS = [
    (r"\b(?:high|medium|low|HIGH|MEDIUM|LOW)\b", "high low_-é ", "a low."),
    (
        r"\b[0-9a-f]{8}\b-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-\b[0-9a-f]{12}\b",
        "0af-g",
        "0" * 8 + "-0000" * 3 + "-" + "a" * 12,
    ),
    (r"\bfoo\b", "fo _-é", "foo"),
    (r"\Bo\B", "fo _-é", "foo"),
    (r"\B", "a -é", "--"),
    (r"^a\b", "a-b é", "a-"),
    (r"(?<=^v?|\sv?)(?:(?:0|[1-9][0-9]*).){2}(?:0|[1-9][0-9]*)\b", "v01. -a", "v1.0.2"),
]


@pytest.mark.parametrize(("pattern", "alphabet", "value"), SUBSETS)
def test_word_boundaries_generate_only_values_both_dialects_match(pattern, alphabet, value):
    check(pattern, alphabet, exact=False)
    assert decoded(pattern).matches(value.encode()) and reference(pattern).search(value)


def test_a_non_boundary_never_matches_the_empty_value_as_in_python():
    assert re.search(r"^\B$", "") is None  # ECMA-262's \B does match there
    with pytest.raises(ConstraintError, match="no string matches"):
        decoded(r"^\B$")  # only the empty value would
    assert decoded(r"^\B-").matches(b"-") and decoded(r"-\B$").matches(b"-")


def test_a_word_boundary_next_to_ascii_is_exact_and_a_non_ascii_neighbour_is_left_out():
    dfa = decoded(r"\bfoo\b")
    for value in ("foo", "a foo.", "-foo-", "(foo)"):
        assert dfa.matches(value.encode()), value
    for value in ("afoo", "foob", "foo_", "éfoo", "fooé", "foo。"):  # the last: non-word to both, left out
        assert not dfa.matches(value.encode()), value


UNICODE = [
    (
        r"^[\p{Letter}\p{Number}\-_\.]+(/[\p{Letter}\p{Number}\-_\.]+)*$",
        ["abc", "été/x1", "日本/٣", "a b", "/", "a//b"],
    ),
    (r"^\p{Lu}\p{Ll}*$", ["Abc", "Été", "abc", "A1"]),
    (r"^[^\p{L}]+$", ["123", "-_", "a", "é", "1\U00010400"]),
    (r"^\P{N}+$", ["abc", "a1", "٣"]),
    (r"^\p{gc=Nd}+$", ["123", "٣٤", "x"]),
    (r"%[\p{N}\p{L}]+$", ["%a1", "%", "x%é"]),
]


@pytest.mark.parametrize(("pattern", "values"), UNICODE)
def test_unicode_categories_keep_to_the_characters_every_version_agrees_on(pattern, values):
    dfa = decoded(pattern)
    ref = regex_module.compile(pattern)
    for value in values:
        if dfa.matches(value.encode()):
            assert ref.search(value), value
    rng = random.Random(0)
    alphabet = "aZé日٣1-_./ %\u0378\U00010400\u00a0"  # U+0378: unassigned; U+10400: a letter outside the BMP
    for _ in range(2000):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        assert not dfa.matches(word.encode()) or ref.search(word), word
        assert not ("\u0378" in word and dfa.matches(word.encode())) or pattern.startswith("%")


def test_letters_are_those_of_the_basic_multilingual_plane_and_excluded_ones_every_unassigned_one():
    letter = decoded(r"^\p{L}$")
    assert letter.matches("é".encode()) and letter.matches("ж".encode()) and letter.matches("日".encode())
    assert not letter.matches(b"1") and not letter.matches("\U00010400".encode())  # a subset: BMP only
    other = decoded(r"^[^\p{L}]$")
    assert other.matches(b"1") and not other.matches("é".encode())
    assert not other.matches("\u0378".encode())  # unassigned: a letter in a later Unicode, maybe


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        ("^((?:a|\\((?1)??\\))*)$", "recursion"),
        ("(?i)abc", "inline flags"),
        ("(?>a)b", "atomic groups"),
        ("(?P=x)", "back-references"),
        ("(?(1)a|b)", "conditional"),
        (r"\p{Script=Greek}", "general categories only"),
        (r"\p{Emoji}", "unknown Unicode property"),
        ("(?=(?<=a)b)", "look-behind inside a look-ahead"),
        ("(?<=(?=a)a)", "look-ahead inside a look-behind"),
        ("(?<=a$)", "'\\$' inside a look-behind"),
        ("(?=\\bx)", "inside a look-around"),
        ("a^b", "'\\^' and '\\$'"),
    ],
)
def test_what_is_not_regular_or_not_supported_is_refused_by_name(pattern, what):
    with pytest.raises(ConstraintError, match=what):
        ConstraintSpec("json_schema", {"type": "string", "pattern": pattern}).to_dfa()


def test_look_around_outside_json_schema_patterns_is_refused():
    with pytest.raises(ConstraintError, match="JSON Schema patterns only"):
        parse("a(?=b)")
    with pytest.raises(ConstraintError, match=r"unsupported escape \\b"):
        parse(r"\bword")


def test_an_expensive_search_falls_back_to_the_pattern_anchored_at_the_start():
    """``.*`` before a long counted repetition and a ``\\b``: past SEARCH_EXACT_STATES the
    automaton is that of the pattern read from the value's start (a subset of the search). About a
    second of compiling on an idle machine: the time budget is not what this checks (a loaded one ran past
    the default 2 s)."""
    set_limits(Limits(compile_ms=60_000))
    try:
        _check_the_anchored_fallback()
    finally:
        set_limits(None)


def _check_the_anchored_fallback() -> None:
    pattern = r"https?:\/\/(www\.)?[-a-zA-Z0-9@:%._\+~#=]{1,256}\.[a-zA-Z0-9()]{1,6}\b([-a-zA-Z0-9()@:%_\+.~#?&//=]*)"
    dfa = decoded(pattern)
    assert SEARCH_EXACT_STATES < 6000  # the exact automaton has about 6000 states
    assert dfa.matches(b"https://a.io/x") and dfa.matches(b"http://www.a.b")
    assert not dfa.matches(b"see https://a.io")  # matched by the search, left out of the subset
    assert check(pattern, "htps:/w.a(-", exact=False, n=1500) >= 0


# ------------------------------------------------------------------ the JSON side


def samples(schema, n=40, seed=0):
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    rng = random.Random(seed)
    return [json.loads(steered_walk(dfa, rng, 120, stop=0.15).decode("utf-8")) for _ in range(n)]


def _re_reads(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


# patterns Python's re (jsonschema's) cannot read are checked with the regex module above instead
@pytest.mark.parametrize(
    "pattern",
    [p for p, _ in EXACT if p != "(?!)" and _re_reads(p)]
    + [p for p, _, _ in SUBSETS if "(?<=^v?" not in p and _re_reads(p)],
)
def test_every_sampled_answer_validates(pattern):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    for value in samples(schema):
        jsonschema.validate(value, schema)


def test_look_around_patterns_as_property_names():
    schema = {
        "type": "object",
        "patternProperties": {r"^(?!plugins$)[a-z0-9][a-z0-9+-]*$": {"type": "integer"}},
        "additionalProperties": False,
    }
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    assert dfa.matches(b'{"plugin":1}') and not dfa.matches(b'{"plugins":1}')
    for value in samples(schema):
        jsonschema.validate(value, schema)


def test_a_look_around_pattern_reads_the_decoded_value_and_writes_escapes():
    """The automaton over the decoded value is mapped to JSON text: a quote only as \\", a control
    character only escaped, and the look-around sees the decoded character."""
    schema = {"type": "string", "pattern": r'^(?!")[\s\S]{0,3}(?<!\\)$'}
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    assert dfa.matches(b'"a\\"b"')  # a"b
    assert not dfa.matches(b'"\\"ab"')  # starts with a quote
    assert not dfa.matches(b'"ab\\\\"')  # ends with a backslash
    assert dfa.matches(b'"a\\n"') and not dfa.matches(b'"a\nb"')  # a newline only escaped
    assert dfa.matches(b'"\\u0001"') and not dfa.matches(b'"a"b"')  # (U+001F: white space to Python only)
    for value in samples(schema, n=60):
        jsonschema.validate(value, schema)


def test_a_look_around_pattern_holds_with_length_bounds_and_a_not():
    schema = {
        "type": "string",
        "pattern": r"^(?!-)[-a-z0-9]{0,49}[a-z0-9]$",
        "maxLength": 4,
        "not": {"pattern": r"(?<=a)b"},
    }
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    assert dfa.matches(b'"a-c"') and not dfa.matches(b'"ab"') and not dfa.matches(b'"abcde"')
    for value in samples(schema):
        jsonschema.validate(value, schema)


def test_a_look_around_pattern_is_built_once_per_process():
    from llmserve.constraints import schema_strings

    pattern = r"^(?!x)[a-z]{3}(?<!q)$"
    first = pattern_ast(pattern)
    assert pattern_ast(pattern) is first  # the same node, so its JSON encoding is cached too
    assert (pattern, False, schema_strings.limits()) in schema_strings._LOOK_CACHE
    # its excluded reading (what either dialect matches) is another automaton, kept apart
    assert pattern_ast(pattern, excluded=True) is not first


@pytest.mark.parametrize(
    ("schema", "python_refuses", "accepted"),
    [
        ({"type": "string", "pattern": "^(?!a$)"}, "a\n", "ab"),
        ({"type": "string", "pattern": "^(?!null$)[a-z]+"}, "null\n", "nulls"),
        ({"type": "string", "not": {"pattern": "a$"}}, "a\n", "ab"),
        ({"oneOf": [{"type": "string", "pattern": "a$"}, {"type": "string", "pattern": "^a"}]}, "a\n", "ba"),
        ({"type": "string", "pattern": "^(?!$)"}, "\n", "x"),
    ],
)
def test_an_excluded_dollar_also_excludes_pythons_end_before_a_final_newline(schema, python_refuses, accepted):
    """Python's '$' (jsonschema's) also matches before a final newline; where a pattern's matches
    are excluded (a negative look-around, 'not', a oneOf kept apart) the value Python would match
    is excluded too (found in review: each of these was generated and failed validation)."""
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(python_refuses, schema)
    assert not dfa.matches(json.dumps(python_refuses).encode())
    jsonschema.validate(accepted, schema)
    assert dfa.matches(json.dumps(accepted).encode())


def test_a_word_boundary_in_an_excluded_pattern_is_read_as_no_condition():
    """``\\b`` is read as a subset (ASCII neighbours) where required; where excluded that would
    generate values the pattern matches, so it is read there as no condition (a superset)."""
    schema = {"type": "string", "not": {"pattern": "\\bfoo"}}
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    for value in ("foo", "a foo", "éfoo", "xfoo"):  # the last two: no boundary, excluded anyway
        assert not dfa.matches(json.dumps(value).encode())
    assert dfa.matches(b'"fo"')
    for value in samples(schema):
        jsonschema.validate(value, schema)


def test_parsing_a_huge_pattern_counts_against_the_compile_budget():
    """A 50,000-word alternation (a gRPC parameter of a megabyte) parsed for seconds before any budget was counted."""
    pattern = "|".join(f"w{i:07d}" for i in range(200_000))
    set_limits(Limits(compile_ms=50))
    try:
        with pytest.raises(ConstraintError, match="time budget"):
            parse(pattern)
    finally:
        set_limits(None)
