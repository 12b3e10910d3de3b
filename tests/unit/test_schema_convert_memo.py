"""The conversion's memos (one conversion's string intersections, a oneOf analysis's pairwise
answers, canonical's shared encoder) answer as the work they save would."""

from __future__ import annotations

import json
import math

import pytest

from llmserve.constraints import jsonschema as js
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.regex import compile_ast, serialize_ast
from llmserve.constraints.schema_merge import canonical
from llmserve.constraints.schema_strings import string_ast


def _norm(v):
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return float(v) if isinstance(v, float) and not v.is_integer() else int(v)
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    return v


@pytest.mark.parametrize(
    "value",
    [
        'a\u00e9"\\\n\x01',
        "",
        "\U0001d11e",
        1,
        1.0,
        -0.0,
        1.5,
        1e300,
        math.inf,
        True,
        False,
        None,
        [1, {"b": 2, "a": [1.0]}],
    ],
)
def test_canonical_writes_what_json_dumps_wrote(value):
    assert canonical(value) == json.dumps(_norm(value), sort_keys=True, separators=(",", ":"))


def test_a_string_intersection_met_again_is_the_one_built():
    memo: dict = {}
    first = string_ast(["^[a-z]+$"], None, 2, 5, memo=memo)
    again = string_ast(["^[a-z]+$"], None, 2, 5, memo=memo)
    assert len(memo) == 1 and again[1][1] is first[1][1]
    other = string_ast(["^[a-z]+$"], None, 2, 6, memo=memo)  # other bounds: another automaton
    assert len(memo) == 2 and other[1][1] is not first[1][1]
    for tree in (first, other):
        dfa = compile_ast(tree)
        assert dfa.matches(b'"abcde"') and not dfa.matches(b'"a"') and not dfa.matches(b'"ab1"')
    assert not compile_ast(first).matches(b'"abcdef"') and compile_ast(other).matches(b'"abcdef"')


def test_a_plain_string_met_again_is_the_tree_built():
    """Strings without an intersection too: large schemas have thousands with the same bounds."""
    memo: dict = {}
    first = string_ast([], None, 0, 64, memo=memo)
    assert string_ast([], None, 0, 64, memo=memo) is first and len(memo) == 1
    assert string_ast([], "date", 0, None, memo=memo) is not first and len(memo) == 2
    dfa = compile_ast(first)
    assert dfa.matches(b'"' + b"x" * 64 + b'"') and not dfa.matches(b'"' + b"x" * 65 + b'"')


def test_a_refused_string_intersection_is_refused_again_alike():
    memo: dict = {}
    messages = []
    for _ in range(2):
        with pytest.raises(ConstraintError) as exc:
            string_ast(["^[a-z]+$"], None, 0, 0, memo=memo)  # at most 0 characters, one at least
        messages.append(exc.value.message)
    assert messages[0] == messages[1] and not memo


SCHEMAS = [
    {"type": "string", "enum": ["a", "b"]},
    {"type": "string", "const": "b"},
    {"enum": ["c", 1, None]},
    {"type": "integer"},
    {"type": ["number", "null"]},
    {"type": "object", "properties": {"k": {"const": "x"}, "v": {"type": "string"}}, "required": ["k"]},
    {"type": "object", "properties": {"k": {"const": "y"}}, "required": ["k"], "additionalProperties": False},
    {"type": "object", "properties": {"w": {"type": "number"}}, "required": ["w"]},
    {"allOf": [{"type": "string"}, {"maxLength": 1}]},
    {"type": "array", "items": {"type": "string"}, "minItems": 1},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "string", "pattern": "^a"},
    {},
]


def test_the_pairwise_answers_in_an_analysis_are_those_without_it():
    plain = [[(js._disjoint(a, b), js._excludes(a, b)) for b in SCHEMAS] for a in SCHEMAS]
    with js._analysis():
        for _ in range(2):  # the second round from the memo
            assert [[(js._disjoint(a, b), js._excludes(a, b)) for b in SCHEMAS] for a in SCHEMAS] == plain
    assert js._memo() is None  # gone with the analysis


def test_an_error_in_an_analysis_is_raised_each_time():
    bad = {"type": "strin"}
    with js._analysis():
        for _ in range(2):
            with pytest.raises(ConstraintError, match="bad type"):
                js._excludes({"type": "string"}, bad)


def test_a_large_one_of_converts_as_its_branches_say():
    branches = [
        {
            "type": "object",
            "properties": {"kind": {"const": f"k{i}"}, "n": {"type": "integer"}, "shared": {"type": "string"}},
            "required": ["kind"],
            "additionalProperties": False,
        }
        for i in range(60)
    ]
    schema = {"oneOf": [*branches, {"type": "string", "enum": ["x", "y"]}, {"type": "string", "const": "z"}]}
    dfa = js.schema_to_dfa(schema)
    assert dfa.matches(b'{"kind":"k7","n":1}') and dfa.matches(b'"z"') and dfa.matches(b'"x"')
    assert not dfa.matches(b'{"kind":"k60"}') and not dfa.matches(b'"w"')


def test_a_reference_met_on_two_paths_is_built_once(monkeypatch):
    big = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 1500}}, "required": ["text"]}
    schema = {
        "$defs": {"big": big, "w1": {"$ref": "#/$defs/big"}, "w2": {"$ref": "#/$defs/big"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/w1"}, "b": {"$ref": "#/$defs/w2"}},
        "required": ["a", "b"],
    }
    built = []
    original = js.compile_words

    def counting(words, **kw):
        built.append(words)
        return original(words, **kw)

    monkeypatch.setattr(js, "compile_words", counting)
    dfa = js.schema_to_dfa(schema)
    assert len(built) == 1  # big, converted on the paths w1 and w2, built once (w1, w2: as built)
    assert dfa.matches(b'{"a":{"text":"x"},"b":{"text":""}}')
    assert not dfa.matches(('{"a":{"text":"' + "x" * 1501 + '"},"b":{"text":""}}').encode())


RULE = {"oneOf": [{"enum": [0, 1, 2]}, {"type": "array", "items": [{"enum": [0, 1, 2]}], "minItems": 1}]}
RULES = {
    "$defs": {"rule": RULE},
    "type": "object",
    # as linters' schemas write them: a reference beside its description, hundreds of times
    "properties": {f"r{i}": {"$ref": "#/$defs/rule", "description": f"rule {i}"} for i in range(40)},
}


def test_a_reference_beside_annotations_converts_once(monkeypatch):
    calls = []
    original = js._Converter._branches

    def counting(self, schema, depth, refs):
        calls.append(refs)
        return original(self, schema, depth, refs)

    monkeypatch.setattr(js._Converter, "_branches", counting)
    dfa = js.schema_to_dfa(RULES)
    assert len(calls) == 1  # the rule's oneOf, once for 40 uses
    assert dfa.matches(b'{"r0":2,"r39":[1]}') and not dfa.matches(b'{"r0":3}')


def test_a_one_of_met_again_as_the_same_objects_answers_as_first_analysed(monkeypatch):
    """Uses of a rule with a constraining keyword beside the reference are not the reference alone:
    their oneOf is analysed at each use, found again by its branch objects; the tree is the one
    built without that memo."""
    schema = json.loads(json.dumps(RULES))
    for i in range(0, 40, 2):
        schema["properties"][f"r{i}"]["maxItems"] = 1
    conv = js._Converter(js._parsed(schema), embed_at=None)
    with_memo = serialize_ast(js._convert(conv, js._parsed(schema)))
    assert conv.one_of_seen
    original = js._Converter._one_of

    def forgetting(self, merged, plain, depth):
        self.one_of_seen.clear()
        return original(self, merged, plain, depth)

    monkeypatch.setattr(js._Converter, "_one_of", forgetting)
    without = serialize_ast(js._convert(js._Converter(js._parsed(schema), embed_at=None), js._parsed(schema)))
    assert with_memo.tolist() == without.tolist()


def test_a_reference_beside_if_then_keeps_its_condition():
    """``if``/``then`` beside a ``$ref`` constrain the value: they were once taken for annotations
    and dropped, and the engine answered objects the schema refuses."""
    import jsonschema as validator

    schema = {
        "$defs": {"o": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
        "$ref": "#/$defs/o",
        "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
        "then": {"required": ["b"]},
    }
    dfa = js.schema_to_dfa(schema)
    assert not validator.Draft202012Validator(schema).is_valid({"a": 1})
    assert not dfa.matches(b'{"a":1}')
    assert dfa.matches(b'{"a":1,"b":2}')


def _nested(levels: int, inner: dict) -> dict:
    for _ in range(levels):
        inner = {"type": "object", "properties": {"x": inner}}
    return inner


# a reference met along paths that hold the references inside it a different number of times
# (recursion unrolled from each), a branch that is a reference, a subset (if/then) inside one, and
# one met shallow and again where its nesting goes past MAX_DEPTH
TREE = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}
ONCE_SCHEMAS = {
    "recursion on two paths": {
        "$defs": {
            "tree": {**TREE, "properties": {**TREE["properties"], "tip": {"$ref": "#/$defs/tip"}}},
            "tip": {"anyOf": [{"$ref": "#/$defs/tree"}, {"type": "null"}]},
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/tree"}, "b": {"$ref": "#/$defs/tip"}, "c": {"$ref": "#/$defs/tip"}},
    },
    "branches that are references": {
        "$defs": {
            "gh": {"type": "object", "properties": {"owner": {"type": "string"}}, "required": ["owner"]},
            "s3": {"type": "object", "properties": {"bucket": {"type": "string"}}, "additionalProperties": False},
            "publish": {"anyOf": [{"$ref": "#/$defs/gh"}, {"$ref": "#/$defs/s3"}, {"type": "null"}]},
        },
        "type": "object",
        "properties": {
            f"p{i}": {"anyOf": [{"$ref": "#/$defs/gh"}, {"$ref": "#/$defs/s3"}, {"$ref": "#/$defs/publish"}]}
            for i in range(6)
        },
    },
    "a subset inside a reference": {
        "$defs": {
            "c": {
                "type": "object",
                "properties": {"k": {"type": "integer"}, "v": {"type": "string"}},
                "if": {"properties": {"k": {"const": 1}}, "required": ["k"]},
                "then": {"required": ["v"]},
            }
        },
        "type": "object",
        "properties": {
            "a": {"oneOf": [{"$ref": "#/$defs/c"}, {"type": "string"}]},
            "b": {"not": {"anyOf": [{"$ref": "#/$defs/c"}]}},
            "d": {"anyOf": [{"$ref": "#/$defs/c"}, {"type": "integer"}]},
        },
    },
    # a oneOf's analysis catches the nesting refusal of a branch built near MAX_DEPTH and leaves the
    # optional property out: the tree built there is not the one a shallower use builds
    "a nesting refusal caught far down, then used near the top": {
        "$defs": {
            "deep": {
                "type": "object",
                "properties": {
                    "p": {
                        "oneOf": [
                            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                            {
                                "type": "object",
                                "properties": {"a": {"type": "string", "pattern": "^x"}},
                                "required": ["a"],
                            },
                        ]
                    }
                },
            }
        },
        "type": "object",
        "properties": {"far": _nested(28, {"$ref": "#/$defs/deep"}), "near": {"$ref": "#/$defs/deep"}},
    },
    "met again past MAX_DEPTH": {
        "$defs": {"deep": _nested(6, {"type": "string"})},
        "type": "object",
        "properties": {
            "shallow": {"anyOf": [{"$ref": "#/$defs/deep"}, {"type": "null"}]},
            "far": _nested(js.MAX_DEPTH - 6, {"anyOf": [{"$ref": "#/$defs/deep"}, {"type": "null"}]}),
        },
    },
}


def _words_or_refusal(schema) -> list | str:
    try:
        return js.schema_words(schema).tolist()
    except ConstraintError as exc:
        return exc.message


@pytest.mark.parametrize("name", ONCE_SCHEMAS)
def test_a_tree_built_once_serves_each_path_as_a_build_there_would(name, monkeypatch):
    schema = ONCE_SCHEMAS[name]
    with_memo = _words_or_refusal(schema)
    original = js._Converter._once

    def building(self, kept, *args):
        kept.clear()  # nothing built before is found: every use builds
        return original(self, kept, *args)

    monkeypatch.setattr(js._Converter, "_once", building)
    assert with_memo == _words_or_refusal(schema)
    if name == "met again past MAX_DEPTH":
        assert "nesting deeper than" in with_memo


def test_a_branch_that_is_a_reference_is_converted_once_for_its_uses(monkeypatch):
    converted = []
    original = js._Converter.convert

    def counting(self, schema, depth=0, refs=()):
        converted.append(id(schema))
        return original(self, schema, depth, refs)

    monkeypatch.setattr(js._Converter, "convert", counting)
    schema = js._parsed(ONCE_SCHEMAS["branches that are references"])
    dfa = js.schema_to_dfa(schema)
    assert converted.count(id(schema["$defs"]["gh"])) == 1  # 12 uses: 6 as a branch, 6 in "publish"
    assert dfa.matches(b'{"p0":{"owner":"o"},"p5":null}') and not dfa.matches(b'{"p1":{"bucket":"b","x":1}}')


def test_a_tree_found_again_counts_what_its_build_counted():
    """A use served by a tree built before answers, to the conversion around it, as a build would:
    the subsets counted (a ``not`` or ``oneOf`` around it reads them), the references met (a tree
    around it is kept with them) and how deep it nests."""
    schema = js._parsed(
        {
            "$defs": {
                "c": {
                    **ONCE_SCHEMAS["a subset inside a reference"]["$defs"]["c"],
                    "properties": {"n": {"$ref": "#/$defs/n"}},
                },
                "n": {"type": "object", "properties": {"v": {"type": "string"}}},
                "x": {},
            }
        }
    )
    conv = js._Converter(schema, embed_at=None)

    def use(refs):
        inexact, checked, conv.deepest = conv.inexact, len(conv.checked), 0
        tree = conv.convert({"$ref": "#/$defs/c"}, 3, refs)
        return tree, conv.inexact - inexact, sorted(set(conv.checked[checked:])), conv.deepest

    built = use(())
    assert built[1] > 0 and built[2] == ["#/$defs/c", "#/$defs/n"]
    assert use(("#/$defs/x",)) == built and len(conv.converted["#/$defs/c"]) == 1  # found, not built
    assert use(("#/$defs/n",)) == built and len(conv.converted["#/$defs/c"]) == 2  # n held once more: built
