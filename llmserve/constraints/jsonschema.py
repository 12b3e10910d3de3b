"""JSON Schema to a regular language over compact JSON.

Output is compact JSON (no whitespace between tokens, ``,`` and ``:`` separators) with object
properties in the schema's order; optional properties may be left out. Compactness matters on a
random or weak model: with whitespace allowed, it can emit whitespace until ``max_tokens``.

The language is always a *subset* of what the schema accepts, so every answer validates; where the
subset is narrower than the schema it says so here:

* ``type`` (or a list), ``enum``/``const`` (values also checked against the keywords beside them;
  an integral float such as 1.0 is answered ``1``, the same value, which draft 4 also counts as an
  integer),
  ``nullable`` (OpenAPI: null too; JSON Schema does not know it, so null is never generated for it:
  answers valid to both readings; a ``not`` of one excludes null), ``$ref`` into the document (``$defs``, ``definitions``, any JSON pointer),
  recursive ones unrolled ``MAX_RECURSION`` levels deep (deeper optional members, branches and
  array items are not generated; a schema that requires deeper nesting is refused), ``allOf``/``anyOf``/``oneOf`` combined with the keywords beside them
  (``schema_merge.py``; two ``oneOf`` in one ``allOf`` as one ``oneOf`` over the pairs of their
  branches, exact); ``oneOf`` generates only answers that match exactly one branch, since
  "exactly one" in general is not regular: a branch is generated when its answers cannot match any
  other (different types, listed values the other refuses, a discriminating property, a required
  name the other lacks or forbids), after narrowing it where that separates it (requiring a
  discriminating property, never generating a name another branch requires, arrays of disjoint items
  non-empty, leaving out of a branch the types another branch accepts, the strings/booleans/null
  another branch lists (of the value, or of a property both declare) and the strings another
  string branch's pattern matches); a branch's types include those its own ``anyOf``/``oneOf``
  branches have (``$ref`` resolved). A branch that may still overlap another is generated as itself
  and not each of those others (``_Converter._apart``: A and not B and not C, each ``not`` turned
  into conditions that imply it, as below: one of B's properties present with a value failing B's
  schema for it, one of B's required names never generated, B's listed values, patterns or types
  excluded; a subset), or is left out when no such condition fits; a ``oneOf`` with no branch left
  is refused. Two branches that are the same schema match nothing (neither is generated). A branch
  normalized as a subset (``if``, ``not``, recursion cut short) is taken to admit every value, as
  its real values are not known. String values are checked against a pattern with Python's ``re``.
* ``if``/``then``/``else``: answers satisfy ``if`` and ``then`` (``else`` with ``if: false``);
  values that fail ``if`` are not generated (a subset). Several in one ``allOf`` whose ``if``s
  exclude each other by one property's value (an if-chain on a discriminator) are one branch each:
  that ``if`` (its properties present) and ``then``, and every other ``else`` (``_if_chain``);
  other combinations hold every ``if`` at once; one that cannot hold with the others (its merge
  fails, or a required property it constrains is left no value) is served by its ``else`` and a
  negation of its ``if`` (as ``not`` below; ``_Converter._all_of``), or the conflict is refused by
  name.
* ``not``: turned into conditions that imply it (``_Converter.negate``): excluded string, boolean
  and null values (every JSON spelling of them) and patterns by the complement automaton (exact),
  ``required`` as one of those names never generated, ``type`` as the other types, ``properties``
  as that property present with a value failing its schema, ``anyOf``/``oneOf`` branch by branch;
  a subset where the ``not`` has more keywords. Other forms are refused by name.
* strings: ``pattern`` (a search over the decoded value, JSON escapes handled; look-around
  anywhere (``(?=``, ``(?!``, ``(?<=``, ``(?<!``, nested, inside groups and repetitions) and ``$``
  inside the pattern, exact; a look-behind inside a look-ahead or the reverse is refused;
  ``\\b``/``\\B`` over ASCII neighbours and ``\\p{..}`` general categories over the Basic
  Multilingual Plane, subsets; see ``schema_strings.py``), ``format`` (every format JSON Schema
  defines: date, time, date-time, duration, email, idn-email, hostname, idn-hostname, ipv4, ipv6,
  uri, uri-reference, iri, iri-reference, uri-template, uuid, json-pointer, relative-json-pointer, regex; several as a subset
  of their values, URIs as http(s) web URLs; two of an ``allOf`` both hold; and the formats
  pydantic writes for its types: ipvanyaddress, ipvanyinterface, ipvanynetwork, ipv4/ipv6
  interface and network, uuid1-5, name-email, base64/base64url, color, as values those types read
  back; multi-host-uri, which does not say which schemes its DSN types take, is refused by name),
  ``minLength``/``maxLength``, all together
  (``schema_strings.py``); where no string generated is left, the value is not generated
  (``Unsatisfiable``: an optional property is left out). A ``format``
  outside those (``int32``, ``password``, ...) leaves the string unconstrained:
  a decision, not an oversight. In 2019-09/2020-12 ``format`` is an annotation unless a
  format-assertion vocabulary is declared, and validators (``jsonschema`` among them) ignore formats
  they do not know, so every such string validates.
* integers and numbers with ``minimum``/``maximum``/``exclusive*`` and a whole ``multipleOf``
  (integers only; a fraction is refused) (``schema_numbers.py``).
* objects: declared ``properties`` with ``required``; only declared properties are generated when
  there are any (as in OpenAI's strict mode), whatever ``additionalProperties`` says; without
  ``properties``, members whose values follow ``additionalProperties`` (a schema, or any JSON value
  when it is true or absent), or, with ``patternProperties``, members whose names match one pattern
  (and none of the others, when there are several) and ``propertyNames``, valued by its schema;
  ``patternProperties`` apply to the declared names they match; ``unevaluatedProperties`` and
  ``unevaluatedItems`` where only ``$ref``/``allOf`` are applied in place (``schema_unevaluated.py``;
  refused beside a conditional one, ``patternProperties`` or, for items, ``contains``: which subschema
  evaluated a name depends on the answer); ``minProperties`` above the
  required ones requires the first optional properties (without declared properties, above 1 it is
  refused: free member names could repeat, and a repeated name counts once), ``maxProperties``
  below the declared ones leaves out the optional properties past it (subsets).
* arrays: ``items`` (any JSON value when absent), ``prefixItems`` (or draft 4's ``items`` list),
  ``minItems``/``maxItems``; ``uniqueItems: true`` as arrays of at most one item, or, with
  ``minItems`` > 1, of distinct values the item schema lists (its ``enum``/``const`` or those of its
  ``anyOf``/``oneOf`` branches), in their listed order, at most ``MAX_DISTINCT`` arrays (else
  refused); ``contains`` as arrays whose first items match it (``minContains`` of them, each also
  following the schema of its position; with ``maxContains`` the others do not match it; several
  ``contains`` of an ``allOf``, up to ``MAX_CONTAINS``, one leading item each): a subset, the
  matching items could be anywhere (``_Converter._contains``).
* a schema dependency (``dependencies``/``dependentSchemas``) of a required name applies to the
  object, merged into it (exact); an optional name with a dependency that is not certain to hold is
  never generated (a subset).
* an unconstrained value (``{}``, ``true``, a free-form member) is any compact JSON value nested at
  most ``ANY_DEPTH`` deep.

When the automaton of all that is over the state limit (``LLMSERVE_CONSTRAINT_MAX_STATES``), a
narrower subset is built instead, within what is left of the compile time budget
(``schema_to_dfa``, ``NARROW_*``): unconstrained values nested one level, no recursion, strings at
most 256 characters where ``maxLength`` is larger. A flat automaton holds a copy of each of those
per use, so they are what make real schemas large; still valid answers, fewer of them. A schema
over the limit even so is refused naming the limit.

Keywords that only annotate (``title``, ``description``, ``id``, ``x-*``, ``markdownDescription``,
...) and keywords outside the JSON Schema vocabulary are ignored, as validators ignore them. Every
other keyword that would change the accepted language and is not supported is refused with a
``ConstraintError`` naming it, never ignored. Drafts 4 to 2020-12 are read alike where they agree
and as the forms above where they differ; a ``$schema`` naming draft 3 (at the root or in a
subschema, which validators honour) is refused, since draft 3's ``required: true``,
``divisibleBy``, ``extends`` and ``disallow`` would otherwise be ignored.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from llmserve.constraints.dfa_ops import intersect
from llmserve.constraints.errors import ConstraintError, no_string_left
from llmserve.constraints.json_text import read_json_text
from llmserve.constraints.limits import limits
from llmserve.constraints.native import native as core
from llmserve.constraints.regex import (
    ByteDFA,
    SizeMemo,
    _time_budget_error,
    ast_words,
    compile_ast,
    compile_words,
    expanded_size,
    lazy_words,
    literal,
    new_size_memo,
    parse,
    serialized,
)
from llmserve.constraints.schema_merge import CONTAINS, Unsatisfiable, both, canonical, merge, types_of, values_of
from llmserve.constraints.schema_numbers import BOUND_KEYS, NUMBER, number_ast
from llmserve.constraints.schema_strings import (
    ANY_CHAR,
    BASE64_FORMATS,
    QUOTE,
    encode,
    pattern_ast,
    split_lookaheads,
    string_ast,
)
from llmserve.constraints.schema_unevaluated import expand_unevaluated

log = logging.getLogger("llmserve.constraints")

MAX_DEPTH = 32
# A $ref target whose tree would expand to more NFA states than this is built into its own minimal
# automaton once and embedded as it is: every use then costs that automaton's states, not the
# expansion of its regular expression again (a free-form value's tree expands to ~150k states, its
# automaton has a few hundred).
EMBED_AT = 4000
# A recursive $ref is unrolled: a reference may appear this many times on the path from the root;
# one level deeper it admits no value, so an optional property, an anyOf branch or array items that
# would go deeper are left out (a subset: every answer still validates). See ``convert``.
MAX_RECURSION = 3
# an if-chain copies the object around it once per 'if' (``_if_chain``): longer ones hold every
# 'if' at once instead
MAX_IF_CHAIN = 8
# how deep _disjoint looks into nested allOf and properties
MAX_DISJOINT_DEPTH = 6
# uniqueItems with minItems > 1: arrays of distinct listed values, at most this many
MAX_DISTINCT = 256
# several 'contains' of an allOf are one leading item each (``_Converter._contains``)
MAX_CONTAINS = 8
ANY_DEPTH = 3  # nesting of an unconstrained value (each level multiplies the automaton's states)
# The narrower subset ``schema_to_dfa`` builds when the schema's automaton is over the state limit:
# an automaton cannot share a sub-automaton between its uses, so its size is the sum over every use
# of a $ref target, an unconstrained value, a recursion level or a counted length. These three
# shrink each use (every answer of the narrower language is an answer of the wider one, so still
# valid); what is left over the limit is refused as before.
WIDE_SHARE = 0.5  # of the compile time budget, for the automaton as converted (schema_to_dfa)
NARROW_ANY_DEPTH = 1  # unconstrained values: scalars, or arrays/objects of scalars
NARROW_RECURSION = 1  # no recursion: a $ref met again inside its own target admits no value
NARROW_MAX_LENGTH = 256  # strings at most this long (or minLength) under a larger maxLength: each
# counted character costs ~13 states (UTF-8 lead/continuation bytes, escapes), maxLength 4000 52k

# keywords each type reads; a keyword of another type says nothing about this one (JSON Schema:
# ``minLength`` does not constrain a number), so it is dropped from that type's branch
_TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format", "contentMediaType", "contentEncoding", "contentSchema"},
    "number": {*BOUND_KEYS, "multipleOf"},
    "integer": {*BOUND_KEYS, "multipleOf"},
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
    },
    "array": {
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedItems",
        CONTAINS,
    },
    "boolean": set(),
    "null": set(),
}
_ALL_TYPE_KEYWORDS = set().union(*_TYPE_KEYWORDS.values())
# the vocabulary that may change validation and that no branch below implements
_UNSUPPORTED = {"$dynamicRef", "$recursiveRef"}
# internal keywords a ``not`` becomes (``_Converter.negate``): JSON values whose text is excluded
# (["value", v] for a string, boolean or null; ["pattern", p] for strings that match p), and
# property names never generated; merged by union (schema_merge.py)
NOT_TEXT = "x-llmserve-not"
ABSENT = "x-llmserve-absent"
# keywords of a type that no branch below implements (refused by name when present): the unevaluated keywords
# schema_unevaluated.py could not rewrite (what a subschema "evaluated" is lost once it is merged into its parent:
# a oneOf branch would see its siblings' names as its own, and a 'not' adds names nothing evaluates), refused
# rather than served unsoundly
_UNSUPPORTED_OF_TYPE = {
    "array": {"unevaluatedItems"},
    "object": {"unevaluatedProperties"},
}
# per type: the other types' keywords (left out of its branch) and its own keywords not implemented
_OTHER_TYPES_KEYWORDS = {typ: _ALL_TYPE_KEYWORDS - keys for typ, keys in _TYPE_KEYWORDS.items()}
_REFUSED_OF_TYPE = {typ: keys & _UNSUPPORTED_OF_TYPE.get(typ, set()) for typ, keys in _TYPE_KEYWORDS.items()}
_STRUCTURE = {
    *("type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf", "nullable", "not", "if", "then", "else"),
    *(NOT_TEXT, ABSENT),
}


@dataclass(frozen=True, slots=True)
class _Converted:
    """A tree built once (``_Converter._once``), with the references checked for recursion
    while it was built (``inside``), how often the path it was reached by held each (``counts``),
    and the subsets its conversion counted (``inexact``)."""

    tree: tuple
    inside: tuple[str, ...]
    counts: tuple[int, ...]
    inexact: int
    deeper: int  # how much deeper than where it was built its conversion nested
    too_deep: int  # nesting refusals its build raised (and an analysis caught)
    at: int | None  # with some: the depth it was built at, the only one it serves (None: any)
    held: tuple = ()  # what the tree was built from, kept alive where it is known by its identity


# the keywords of a string that holds another document (_json_content)
_CONTENT = ("contentMediaType", "contentSchema", "contentEncoding")


def _member_step(name: str) -> str:
    return f".{name}" if name.isidentifier() else f"[{json.dumps(name, ensure_ascii=False)}]"


def _at(exc: ConstraintError, step: str) -> None:
    """``exc`` with where in the answer it arose, one step further out: its message ends "(at $.a.b[*])", a JSON
    path, so that a refusal of a large schema names the field at fault. Not for the limits of a whole automaton (its
    size, its time budget): where they were passed is not where they were spent."""
    if "constraint too large" in exc.message or "time budget" in exc.message:
        return
    located = step + getattr(exc, "located", "")
    base = getattr(exc, "unlocated", exc.message)
    exc.located, exc.unlocated = located, base  # type: ignore[attr-defined]
    exc.message = f"{base} (at ${located})"
    exc.args = (exc.message,)


def _lit(text: str):
    return literal(text)


def _integral(value: Any) -> Any:
    """``value`` with its integral floats as ints: 1.0 and 1 are one JSON Schema value, but draft 4
    (a schema's ``$schema``, at its root or in a subschema) counts only 1 as an integer, so an
    integer schema listing 1.0 is answered "1", and one listing 1e20 all its digits."""
    if isinstance(value, float) and value.is_integer():  # NaN and infinities are not
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


# one encoder for every value: json.dumps with options builds a new one per call (10x the cost, paid
# for each property name and enum value of a schema)
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dumps(value: Any) -> str:
    try:
        return _COMPACT.encode(value if isinstance(value, str) else _integral(value))
    except ValueError:  # Python's json reads NaN and Infinity, which no JSON text may hold
        raise ConstraintError(f"json_schema: {value!r} is not a JSON value (NaN and Infinity are not JSON)") from None


def _cat(*items):
    return ("cat", list(items))


def _alt(branches: list):
    return branches[0] if len(branches) == 1 else ("alt", branches)


def _string_any():
    return _cat(QUOTE, ("rep", encode(ANY_CHAR), 0, None), QUOTE)


_ANY_DFA: dict[int, ByteDFA] = {}


def any_value_node(depth: int = ANY_DEPTH) -> tuple:
    """``any_value(depth)`` as an embedded automaton, built once per process."""
    dfa = _ANY_DFA.get(depth)
    if dfa is None:
        dfa = _ANY_DFA[depth] = compile_ast(any_value(depth))
    return ("dfa", dfa)


def any_value(depth: int = ANY_DEPTH):
    """Any compact JSON value nested at most ``depth`` deep (arrays and objects count one each)."""
    scalars = [_string_any(), parse(NUMBER), _lit("true"), _lit("false"), _lit("null")]
    if depth <= 0:
        return ("alt", scalars)
    inner = any_value(depth - 1)
    array = _cat(_lit("["), ("list", inner, 0, None), _lit("]"))
    member = _cat(_string_any(), _lit(":"), inner)
    obj = _cat(_lit("{"), ("list", member, 0, None), _lit("}"))
    return ("alt", [*scalars, array, obj])


class _Converter:
    def __init__(
        self,
        root: Any,
        if_chains: bool = True,
        started: float | None = None,
        narrow: bool = False,
        embed_at: int | None = EMBED_AT,
    ):
        self.root = root
        # a $ref tree expanding past this is built into an automaton of its own (None: never)
        self.embed_at = embed_at
        self.narrow = narrow  # the NARROW_* subset (schema_to_dfa's last try)
        self.max_recursion = NARROW_RECURSION if narrow else MAX_RECURSION
        self.if_chains = if_chains  # _if_chain in use (schema_to_dfa retries without when too large)
        self.chained = False  # whether some if-chain was served as branches
        # normalizing steps that keep only a subset of a schema's values (if/then/else, an if-chain,
        # 'not'): a schema normalized through one cannot be negated soundly (``_negations``)
        self.inexact = 0
        # $ref -> its converted trees, each built once and shared by every use: a schema whose
        # references fan out (A uses B twice, B uses C twice, ...) costs its size to convert, not
        # 2^depth. The expanded size (each use counts) is bounded before anything is built
        # (regex.compile_ast). A tree depends on the path of references it is reached by only
        # through how often that path holds the references met inside it (``_check_recursion``),
        # so it is kept with those and serves every path that holds them as often (_Converted).
        self.converted: dict[str, list[_Converted]] = {}
        # the same for a branch of anyOf/oneOf that is a reference's target, by the target's identity
        self.branch_trees: dict[int, list[_Converted]] = {}
        self.checked: list[str] = []  # every reference checked for recursion, in order
        self.deepest = 0  # the deepest ``convert`` reached (a tree built once counts where it is used)
        # nesting refusals raised so far: an analysis may catch one (``_fillable``), and a tree built
        # around it then depends on the depth it was built at (``_once`` reuses it only there)
        self.too_deep = 0
        self.one_of_memo: dict[tuple, tuple] = {}  # _one_of's results by its branches
        # the same, by the identity of the branch objects (held in the value, so that their ids stay
        # theirs): a $ref'd oneOf met again arrives as the same objects, and its key above costs a
        # canonical text per branch (most of a conversion for schemas with hundreds of such uses)
        self.one_of_seen: dict[tuple, tuple] = {}
        self.strings: dict[tuple, tuple] = {}  # string_ast's strings by their conditions
        self.embedded: dict[tuple, ByteDFA] = {}  # _embedded's automata by their trees
        # expanded_size's counts by node, to the NFA state limit (above EMBED_AT): the same counts
        # serve both the choice to embed and the limit's check before a build
        self.sizes = new_size_memo()
        self.size_cap = max(limits().max_nfa_states, EMBED_AT)
        self._any: tuple | None = None
        # automata built along the way share the compile time budget, counted from here
        self.started = time.monotonic() if started is None else started
        self.budget_ms = limits().compile_ms
        self.deadline = self.started + self.budget_ms / 1000

    def size_memo(self) -> SizeMemo | None:
        """``sizes`` where a check against the NFA state limit may read it (the limits in force
        are the ones it was counted to)."""
        return self.sizes if limits().max_nfa_states == self.size_cap else None

    def fail(self, what: str) -> ConstraintError:
        return ConstraintError(f"json_schema: {what}")

    def any(self):
        if self._any is None:
            self._any = any_value_node(NARROW_ANY_DEPTH if self.narrow else ANY_DEPTH)
        return self._any

    def resolve(self, ref: Any):
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.fail(f"only local $ref is supported, got {ref!r}")
        node = _pointer(self.root, ref)
        if node is _UNRESOLVED:
            raise self.fail(f"$ref {ref!r} does not resolve")
        return node

    # ------------------------------------------------------------------ normalising

    def normalize(self, schema: Any, refs: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """``schema`` without ``$ref`` or ``allOf`` at its top (merged into one schema), and the
        references followed to get there (a reference met again is recursion)."""
        for _ in range(MAX_DEPTH):
            if not isinstance(schema, dict):
                return schema, refs
            if "$ref" in schema:
                ref = schema["$ref"]
                self._check_recursion(ref, refs)
                refs = (*refs, ref)
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                target, refs = self.normalize(self.resolve(ref), refs)
                schema = self._merge(target, rest) if _constrains(rest) else target
                continue
            if "if" in schema or "then" in schema or "else" in schema:
                if "if" in schema:
                    self.inexact += 1
                schema = _conditional(schema)
                continue
            if "allOf" in schema:
                subs = schema["allOf"]
                if not isinstance(subs, list) or not subs:
                    raise self.fail("allOf must be a non-empty list")
                chain = _if_chain(schema) if self.if_chains else None
                if chain is not None:
                    self.chained = True
                    self.inexact += 1
                    schema = chain
                    continue
                schema, refs = self._all_of({k: v for k, v in schema.items() if k != "allOf"}, subs, refs)
                continue
            if "not" in schema:
                schema = self.negate(schema, refs)
                continue
            return schema, refs
        raise self.fail(f"$ref/allOf chain deeper than {MAX_DEPTH}")

    def _all_of(self, base: dict, subs: list, refs: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """``allOf``: its members merged into ``base``. A member with ``if``/``then``/``else`` is
        served as ``if`` and ``then``; where that cannot hold together with the rest (merging fails,
        or a required property it constrains is left without a value), as ``else`` and a schema
        implying not ``if`` (``_otherwise``) instead: both are subsets of the conditional's values."""
        conditional = [k for k, sub in enumerate(subs) if isinstance(sub, dict) and "if" in sub]
        otherwise: set[int] = set()
        for _ in range(len(conditional) + 1):
            out, out_refs, touched = base, refs, {}
            for k, sub in enumerate(subs):
                if k in otherwise:
                    part, out_refs = self._otherwise(sub, out, out_refs)
                    out = self._merge(out, part)
                    continue
                norm, out_refs = self.normalize(sub, out_refs)
                try:
                    out = self._merge(out, norm)
                except ConstraintError as exc:
                    if k not in conditional:
                        raise self._all_of_error(exc, len(conditional)) from None
                    try:
                        part, out_refs = self._otherwise(sub, out, out_refs)
                        out = self._merge(out, part)
                    except ConstraintError:
                        raise self._all_of_error(exc, len(conditional)) from None
                    otherwise.add(k)
                    continue
                if k in conditional:
                    for part in (sub["if"], sub.get("then")):
                        for name in (part.get("properties") or {}) if isinstance(part, dict) else {}:
                            touched[name] = k
            empty = self._emptied(out, touched, out_refs)
            if empty is None or empty in otherwise:
                return out, out_refs
            otherwise.add(empty)
        return out, out_refs

    def _all_of_error(self, exc: ConstraintError, conditional: int) -> ConstraintError:
        if not conditional:
            return exc
        if isinstance(exc, Unsatisfiable):
            return Unsatisfiable(
                "json_schema: if/then/else generates only values that satisfy its 'if' (a subset), or its 'else' "
                "with a negation of 'if', and no value satisfies them here together with the rest of the schema"
            )
        if conditional < 2:
            return exc
        return self.fail(
            f"allOf with {conditional} if/then/else: served as an if-chain only when each 'if' "
            "excludes the others by one property's value (e.g. different const or enum values of "
            "the same property); these 'if's may hold together, and holding them all at once "
            f"failed: {exc.message.removeprefix('json_schema: ')}"
        )

    def _otherwise(self, cond: dict, base: dict, refs: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """A conditional's values that fail its ``if``: its ``else`` (and its other keywords) with a
        schema implying not ``if`` (a subset; refused where ``if`` cannot be negated)."""
        self.inexact += 1
        if cond["if"] is True:
            raise Unsatisfiable("json_schema: 'if' true: the 'else' never applies")
        not_if, _ = self._not_of(self._normalized_exactly(cond["if"], refs), base, refs)
        rest = {k: v for k, v in cond.items() if k not in ("if", "then", "else")}
        parts = [x for x in (rest, cond.get("else", True)) if x is not True and x != {}]
        if not parts:
            return not_if, refs
        other, refs = self.normalize({"allOf": parts}, refs)
        return self._merge(not_if, other), refs

    def _emptied(self, out: Any, touched: dict, refs: tuple[str, ...]) -> int | None:
        """The conditional whose ``if``/``then`` constrains a required property of ``out`` that no
        value is left for, or None."""
        if not isinstance(out, dict) or not touched:
            return None
        props = out.get("properties") or {}
        for name in out.get("required", []):
            if name in touched and name in props:
                try:
                    self.convert(props[name], 1, refs)
                except Unsatisfiable:
                    return touched[name]
                except ConstraintError:
                    continue
        return None

    def negate(self, schema: dict, refs: tuple[str, ...]) -> Any:
        """``schema`` with its ``not`` turned into conditions that imply it (a subset where exactness
        is out of reach: which values *fail* a schema is not regular to generate in general):

        * ``anyOf``/``oneOf`` inside: a value failing every branch fails them; each is negated;
        * ``const``/``enum`` of strings, booleans, null: those values' every JSON text is excluded
          (numbers, arrays and objects have many texts per value: refused);
        * ``required``: an object without one of those names (one the schema does not require);
        * ``properties``: an object holding the first of them, valued against its schema;
        * ``pattern``: a string whose decoded value the pattern does not match (exact);
        * ``contains``: an array no item of which matches it;
        * ``type``: the other types (a subset when the ``not`` has more keywords).

        Each is exact where the ``not`` holds that keyword alone (``_not_of`` says which); where it is
        a subset, the schema normalized through it counts as a subset (``inexact``), and a ``not``
        of a schema normalized as a subset is refused (its negation would admit its values).

        Anything else is refused by name."""
        rest = {k: v for k, v in schema.items() if k != "not"}
        n = self._normalized_exactly(schema["not"], refs)
        try:
            out, exact = self._not_of(n, rest, refs)
        except Unsatisfiable:
            if n is not True and not (isinstance(n, dict) and not _constrains(n)):
                # the negation came out empty only as far as its subset goes (not {oneOf: [true, B],
                # type: number} still admits the numbers B matches): a oneOf must not take this
                # branch for one that matches nothing
                self.inexact += 1
            raise
        if not exact:
            self.inexact += 1  # what is generated is a subset of the values failing 'not'
        return self._merge(rest, out)

    def _normalized_exactly(self, schema: Any, refs: tuple[str, ...]) -> Any:
        """``schema`` normalized, refused when that kept only a subset of its values (the converter
        serves if/then/else and some 'not' as a subset): the negation of a subset would admit values
        of the schema. False when no value satisfies it: its negation is every value, not none."""
        before = self.inexact
        try:
            n, _ = self.normalize(schema, refs)
        except Unsatisfiable:
            if self.inexact == before:
                return False
            n = None
        if self.inexact != before:
            raise self.fail("'not' of a schema with if/then/else (or a 'not' served as a subset) is not supported")
        return n

    def _not_of(self, n: Any, base: dict, refs: tuple[str, ...]) -> tuple[Any, bool]:
        """A schema implying not ``n``, and whether together with ``base`` it admits exactly the
        values of ``base`` that fail ``n`` (else a subset of them)."""
        if n is False:
            return {}, True
        if n is True or (isinstance(n, dict) and not _constrains(n)):
            raise Unsatisfiable("json_schema: 'not' of a schema every value satisfies")
        if not isinstance(n, dict):
            raise self.fail("'not' must be a schema")
        keys = {k for k in n if _constrains({k: n[k]})}
        n_types = types_of(n)
        base_types = types_of(base) if isinstance(base, dict) else None

        def alone(key: str, typ: str) -> bool:
            # n is that keyword alone (which only other values of typ fail), or with type typ where
            # base admits no other type: its negation below is exact
            return keys <= {key, "type"} and (n_types is None or n_types == base_types == {typ})

        if n.get("nullable") is True:  # null is one of n's values too
            without, _ = self._not_of({k: v for k, v in n.items() if k != "nullable"}, base, refs)
            return self._merge(without, {NOT_TEXT: [["value", None]]}), False
        for key in ("anyOf", "oneOf"):
            if isinstance(n.get(key), list) and n[key]:
                return self._not_of_each(key, n[key], keys == {key}, base, refs)
        listed = _values_negation(n, keys, n_types)
        if listed is not None:
            return listed
        names = [r for r in n.get("required", []) if isinstance(r, str) and r not in base.get("required", [])]
        if names and (n_types is None or "object" in n_types):
            return {"type": "object", ABSENT: names[:1]}, alone("required", "object") and len(names) == 1
        props = n.get("properties")
        if isinstance(props, dict) and props and (n_types is None or "object" in n_types):
            # an object whose property k is present with a value that fails k's schema
            return _property_negation(props, base), alone("properties", "object") and len(props) == 1
        patterns = n.get("pattern")
        if patterns and (n_types is None or "string" in n_types):
            patterns = patterns if isinstance(patterns, list) else [patterns]
            exact = alone("pattern", "string") and len(patterns) == 1
            return {"type": "string", NOT_TEXT: [["pattern", p] for p in patterns]}, exact
        if "contains" in n and not {"minContains", "maxContains"} & keys and (n_types is None or "array" in n_types):
            # an array no item of which matches (the empty one too)
            return {"type": "array", "items": {"not": n["contains"]}}, alone("contains", "array")
        if n_types is not None:
            exact = keys == {"type"} and ("integer" not in n_types or "number" in n_types)
            return {"type": _other_types(n_types)}, exact
        raise self.fail(
            f"'not' of {sorted(k for k in n if _constrains({k: n[k]}))} is not supported (supported: type, "
            "const/enum of strings, booleans or null, pattern, required, properties, contains, and anyOf/oneOf of "
            "those)"
        )

    def _not_of_each(self, key: str, subs: list, exact: bool, base: dict, refs: tuple[str, ...]) -> tuple[Any, bool]:
        """A value failing every branch of an ``anyOf``/``oneOf``: exactly failing an ``anyOf`` of
        them, or a ``oneOf`` whose branches no value shares (``exact`` given: nothing beside it),
        when each negation is exact."""
        if key == "oneOf":
            exact = exact and all(_disjoint(x, y) for i, x in enumerate(subs) for y in subs[i + 1 :])
        out: Any = {}
        for sub in subs:
            sub_out, sub_exact = self._not_of(self._normalized_exactly(sub, refs), base, refs)
            out = self._merge(out, sub_out)
            exact = exact and sub_exact
        return out, exact

    def exclude(self, node: tuple, items: list) -> tuple:
        """``node`` less the JSON texts ``items`` describe (NOT_TEXT): the product with the
        complement of their automaton. Strings are excluded in every encoding the converter
        generates (``encode``), so no escaped spelling of an excluded value slips through."""
        alts = []
        for kind, v in items:
            if kind == "pattern":
                alts.append(_cat(QUOTE, encode(pattern_ast(v, excluded=True)), QUOTE))
            elif isinstance(v, str):
                alts.append(_cat(QUOTE, encode(literal(v)), QUOTE))
            else:
                alts.append(_lit(_dumps(v)))
        try:
            excluded = compile_ast(("alt", alts), started=self.started)
        except ConstraintError as exc:
            if "matches no string" in exc.message:
                return node  # nothing to exclude
            raise
        try:
            dfa = intersect([compile_ast(node, started=self.started), _complement(excluded)], started=self.started)
        except ConstraintError as exc:
            if no_string_left(exc):
                raise Unsatisfiable("json_schema: no value is left once 'not' is applied") from None
            raise
        return ("dfa", dfa)

    def _embeds(self, tree: tuple) -> bool:
        """Whether a reference's tree is built into an automaton of its own (EMBED_AT)."""
        if self.embed_at is None or tree[0] == "dfa":
            return False
        return expanded_size(tree, self.size_cap, self.sizes) > self.embed_at

    def _embedded(self, tree: tuple) -> ByteDFA:
        """``compile_ast(tree)``, built once per conversion for each tree: a reference met on paths
        that count its references differently converts on each (``converted``) to trees that may be
        the same, whose automaton is then
        found by the tree's serialized form (what the builder reads, so equal forms build equal
        automata), with the limits in force. Only automata built are kept: a refusal is met again
        as it was."""
        words = serialized(tree, started=self.started, sizes=self.size_memo())
        key = (words.tobytes(), limits())
        found = self.embedded.get(key)
        if found is None:
            found = self.embedded[key] = compile_words(words, started=self.started, classes=True)
        return found

    def _reference(self, ref: str, depth: int, refs: tuple[str, ...]):
        """The tree of ``ref`` reached along ``refs``."""
        self._check_recursion(ref, refs)
        kept = self.converted.setdefault(ref, [])
        return self._once(kept, depth, refs, partial(self._reference_tree, ref, depth, refs))

    def _reference_tree(self, ref: str, depth: int, refs: tuple[str, ...]):
        tree = self.convert(self.resolve(ref), depth + 1, (*refs, ref))
        # a large tree is built once, here; one built already stays as it is
        return ("dfa", self._embedded(tree)) if self._embeds(tree) else tree

    def _once(self, kept: list[_Converted], depth: int, refs: tuple[str, ...], build: Callable[[], tuple], *held: Any):
        """``build()``'s tree (converting from ``depth``), built once for every path of references
        that holds the references met inside it as often as ``refs`` does (the first such path's
        tree, with the subsets its conversion counted), where it nests within MAX_DEPTH as a build
        there would (one whose build met the limit and went on without the value, only at the depth
        it was built at); ``kept`` holds the trees built, with ``held`` alive beside them."""
        for done in kept:
            if (
                depth + done.deeper <= MAX_DEPTH
                and done.at in (None, depth)
                and tuple(map(refs.count, done.inside)) == done.counts
            ):
                self.checked += done.inside  # the paths around this one meet them too
                self.inexact += done.inexact
                self.too_deep += done.too_deep
                self.deepest = max(self.deepest, depth + done.deeper)
                return done.tree
        start, before, outer, refused = len(self.checked), self.inexact, self.deepest, self.too_deep
        self.deepest = depth
        try:
            tree = build()
            deeper = self.deepest - depth
        finally:
            self.deepest = max(outer, self.deepest)
        inside = tuple(dict.fromkeys(self.checked[start:]))
        too_deep = self.too_deep - refused
        kept.append(
            _Converted(
                tree,
                inside,
                tuple(map(refs.count, inside)),
                self.inexact - before,
                deeper,
                too_deep,
                depth if too_deep else None,
                held,
            )
        )
        return tree

    def _check_recursion(self, ref: Any, refs: tuple[str, ...]) -> None:
        """Bounded-depth recursion (MAX_RECURSION): past it the reference admits no value."""
        self.checked.append(ref)
        if refs.count(ref) >= self.max_recursion:
            raise Unsatisfiable(
                f"json_schema: recursive $ref {ref!r} is unrolled {self.max_recursion} levels deep, and the schema "
                "requires a deeper value"
            )

    def _merge(self, a: Any, b: Any) -> Any:
        if a is False or b is False:
            raise Unsatisfiable("json_schema: a false schema admits no value")
        return merge(a, b)

    # ------------------------------------------------------------------ converting

    def convert(self, schema: Any, depth: int = 0, refs: tuple[str, ...] = ()):
        if time.monotonic() > self.deadline:  # converting is part of compiling: one budget for both
            raise _time_budget_error(self.budget_ms)
        if depth > MAX_DEPTH:
            self.too_deep += 1
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        if depth > self.deepest:
            self.deepest = depth
        if isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and _annotates_only(schema, besides="$ref"):
            return self._reference(schema["$ref"], depth, refs)
        schema, refs = self.normalize(schema, refs)
        if schema is True:
            return self.any()
        if schema is False:
            raise Unsatisfiable("json_schema: a false schema admits no value")
        if not isinstance(schema, dict):
            raise self.fail(f"schema must be an object or a boolean, got {type(schema).__name__}")
        unsupported = [key for key in schema if key in _UNSUPPORTED]
        if unsupported:
            raise self.fail(f"keyword {unsupported[0]!r} is not supported")
        if NOT_TEXT in schema:
            rest = {k: v for k, v in schema.items() if k != NOT_TEXT}
            return self.exclude(self.convert(rest, depth + 1, refs), schema[NOT_TEXT])
        if schema.get("nullable") is True:
            # OpenAPI's null beside the type, an unknown keyword (so no null) to JSON Schema: answers
            # from the rest are valid to both readings, a null would fail JSON Schema's validators
            return self.convert({k: v for k, v in schema.items() if k != "nullable"}, depth + 1, refs)
        if "anyOf" in schema or "oneOf" in schema:
            return self._branches(schema, depth, refs)
        values = values_of(schema)
        if values is not None:
            return self._values(values, schema, depth, refs)
        return self._types(schema, depth, refs)

    def _types(self, schema: dict, depth: int, refs):
        """The schema's types (given or implied by its keywords), each with its own keywords; a type
        no value satisfies is left out."""
        types = types_of(schema)
        if types is None:
            types = self._implied_types(schema)
            if types is None:
                return self.any()
        if "integer" in types and "number" in types:
            types = types - {"integer"}
        order = [t for t in ("object", "array", "string", "integer", "number", "boolean", "null") if t in types]
        branches = []
        for t in order:
            try:
                branches.append(self._typed(t, schema, depth, refs))
            except Unsatisfiable:
                if len(order) == 1:
                    raise
        if not branches:
            raise Unsatisfiable(f"json_schema: no type of {order} is satisfiable")
        return _alt(branches)

    def _implied_types(self, schema: dict) -> set[str] | None:
        """Without ``type``: the types whose keywords appear (the others are unconstrained; generating
        only these is a subset), or None when nothing constrains the value."""
        found = {t for t, keys in _TYPE_KEYWORDS.items() if keys & set(schema) and t != "integer"}
        return found or None

    def _typed(self, typ: str, schema: dict, depth: int, refs):
        others = _OTHER_TYPES_KEYWORDS[typ]
        own = {k: v for k, v in schema.items() if k not in others}
        unsupported = own.keys() & _REFUSED_OF_TYPE[typ]
        if unsupported:
            raise self.fail(f"keyword(s) {sorted(unsupported)} for type {typ!r} are not supported")
        return getattr(self, "_" + typ)(own, depth, refs)

    def _branches(self, schema: dict, depth: int, refs):
        """``anyOf``/``oneOf``: each branch merged with the keywords beside it (never overwriting
        them); branches that cannot be satisfied together with them are dropped."""
        key = "anyOf" if "anyOf" in schema else "oneOf"
        subs = schema[key]
        if not isinstance(subs, list) or not subs:
            raise self.fail(f"{key} must be a non-empty list")
        base = {k: v for k, v in schema.items() if k != key}
        merged: list = []
        plain: list = []  # each branch as normalized, with its references and whether that was exact
        for sub in subs:
            before = self.inexact
            try:  # a branch no value satisfies (an allOf of two types, ...) counts for no value
                sub, sub_refs = self.normalize(sub, refs)
                merged.append((self._merge(base, sub) if _constrains(base) else sub, sub_refs))
                plain.append((sub, sub_refs, self.inexact == before))
            except Unsatisfiable as exc:
                if key == "oneOf" and (self.inexact != before or "recursive $ref" in exc.message):
                    # empty only as far as the converter's subset goes: other values may match it
                    merged.append((None, refs))
                    plain.append((None, refs, False))
                continue
        if not any(m is not None for m, _ in merged):
            raise Unsatisfiable(f"json_schema: no branch of {key} is satisfiable together with the keywords beside it")
        if key == "oneOf":
            merged = self._one_of(merged, plain, depth)
        reused = not _constrains(base)  # then a branch that is a reference is its target, as it is
        branches = []
        for m, sub_refs in merged:
            try:
                if reused and sub_refs is not refs:
                    kept = self.branch_trees.setdefault(id(m), [])
                    build = partial(self.convert, m, depth + 1, sub_refs)
                    branches.append(self._once(kept, depth + 1, sub_refs, build, m))
                else:
                    branches.append(self.convert(m, depth + 1, sub_refs))
            except Unsatisfiable:
                continue
        if not branches:
            raise Unsatisfiable(f"json_schema: no branch of {key} is satisfiable")
        return _alt(branches)

    def _one_of(self, merged: list, plain: list, depth: int) -> list:
        """``oneOf``: the branches to generate, each narrowed so that its answers match no other
        branch. A branch the analysis of ``_exclusive_branches`` tells apart is kept as there; any
        other becomes itself and not each branch it may overlap (``_apart``: A and not B and not C,
        with each 'not' turned into conditions that imply it), or is left out when that cannot be
        expressed. Two branches alike (the same schema) match the same values: neither is generated.
        A branch normalized through a subset (if/then/else, 'not', recursion cut short) may admit
        values its schema here does not: the others see it as admitting every value."""
        seen = (
            tuple(id(m) for m, _ in merged),
            tuple(sub_refs for _, sub_refs in merged),
            tuple((id(sub), exact) for sub, _, exact in plain),
            depth,
        )
        return self._replayed(self.one_of_seen, seen, lambda: self._one_of_new(merged, plain, depth), merged, plain)

    def _replayed(self, table: dict, key: tuple, compute: Callable[[], list], *held: Any) -> list:
        """``compute()``, kept in ``table`` under ``key`` (with ``held``, kept alive beside it); a
        result found there is given again with the inexactness its computation counted and the
        references it checked for recursion (a reference's tree around it depends on them)."""
        found = table.get(key)
        if found is not None:
            self.inexact += found[1]
            self.checked += found[2]
            return list(found[0])
        before, start = self.inexact, len(self.checked)
        kept = compute()
        table[key] = (tuple(kept), self.inexact - before, tuple(dict.fromkeys(self.checked[start:])), *held)
        return kept

    def _one_of_new(self, merged: list, plain: list, depth: int) -> list:
        """``_one_of`` for branch objects not seen before (they may still be equal to some seen)."""
        listed = _one_of_values(merged, plain)
        if listed is not None:
            return listed
        typed = [
            self._item_types(self._branch_types(m, sub_refs), sub_refs) if m is not None else {}
            for m, sub_refs in merged
        ]
        views = [t if exact else {} for t, (_, _, exact) in zip(typed, plain, strict=True)]
        keys = [canonical(m) if m is not None else None for m, _ in merged]
        # a $ref'd oneOf is met once per use: its analysis is pairwise over the branches (and the
        # negations it builds), so the same branches seen again reuse it, with its inexactness
        memo = (
            tuple(keys),
            tuple(canonical(v) for v in views),
            tuple(sub_refs for _, sub_refs in merged),
            tuple((canonical(sub) if sub is not None else None, exact) for sub, _, exact in plain),
            depth,
        )

        def analysed() -> list:
            with _analysis():
                return self._one_of_apart(merged, plain, depth, typed, views, keys)

        return self._replayed(self.one_of_memo, memo, analysed)

    def _one_of_apart(self, merged: list, plain: list, depth: int, typed: list, views: list, keys: list) -> list:
        n = len(merged)
        kept: list = []
        failures: list[ConstraintError] = []
        for i, (m, sub_refs) in enumerate(merged):
            if m is None:
                continue
            if keys.count(keys[i]) > 1:
                failures.append(Unsatisfiable("json_schema: two oneOf branches are the same schema"))
                continue
            others = [views[j] for j in range(n) if j != i]
            narrowed = _narrowed(typed[i], others)
            if all(_excludes(narrowed, views[j]) for j in range(n) if j != i):
                kept.append((m if narrowed is typed[i] else narrowed, sub_refs))
                continue
            try:
                kept.append((self._apart(i, narrowed, plain, views, depth, sub_refs), sub_refs))
            except ConstraintError as exc:
                failures.append(exc)
        if not kept:
            if all(isinstance(exc, Unsatisfiable) for exc in failures):
                raise Unsatisfiable(
                    "json_schema: no oneOf branch can be generated apart from the others (every value of each "
                    f"may match another; first: {failures[0].message.removeprefix('json_schema: ') if failures else ''})"
                )
            raise ConstraintError(
                "json_schema: oneOf branches that a value could match both of are not supported "
                "(give them different types, different const/enum values of a required property, "
                "or each a required property the others do not declare)"
            )
        return kept

    def _apart(self, i: int, current: dict, plain: list, views: list, depth: int, refs) -> Any:
        """Branch ``i`` of a ``oneOf`` (``current``) and not every other branch it may overlap: the
        conjunction with a schema that implies each one's negation (``_negations``), chosen so the
        branch keeps values. Adding a negation may add names to the branch, so the others are
        checked again until each is excluded or negated. Sound: an answer satisfies branch i and
        fails every other branch."""
        done: set[int] = set()
        if current is True:  # a 'true' branch: the negations merge into an object schema
            current = {}
        while True:
            pending = [j for j in range(len(plain)) if j != i and j not in done and not _excludes(current, views[j])]
            if not pending:
                return current
            for j in pending:
                sub, sub_refs, exact = plain[j]
                if not exact:
                    raise Unsatisfiable(
                        "json_schema: a oneOf branch normalized as a subset (if/then/else, not, recursion) cannot be "
                        "negated to tell the others apart from it"
                    )
                current = self._and_not(current, sub, sub_refs, depth, refs)
                done.add(j)

    def _and_not(self, current: dict, n: Any, n_refs, depth: int, refs) -> dict:
        """``current`` and a schema implying not ``n``: the first of ``_negations`` that merges with
        it and leaves the values it adds satisfiable."""
        for cand, check in self._negations(n, current, n_refs):
            try:
                trial = self._merge(current, cand)
            except ConstraintError:
                continue
            if check is None or self._fillable(trial, check, depth, refs):
                return trial
        raise Unsatisfiable("json_schema: a oneOf branch cannot be told apart from another one it may overlap")

    def _fillable(self, trial: dict, check: tuple, depth: int, refs) -> bool:
        """Whether what a negation added to ``trial`` still leaves a value (a cheap check of that part)."""
        kind = check[0]
        if kind == "absent":
            return check[1] not in trial.get("required", [])
        if kind == "text":
            values = values_of(trial)
            return values is None or not all(_text_excluded(v, trial.get(NOT_TEXT) or []) for v in values)
        if kind == "string" and types_of(trial) != {"string"}:
            return True
        if kind == "property":
            hi = trial.get("maxProperties")
            if isinstance(hi, int) and not isinstance(hi, bool) and len(set(trial.get("required", []))) > hi:
                return False
            part = (trial.get("properties") or {}).get(check[1], True)
        else:
            part = trial
        try:
            self.convert(part, depth + 1, refs)
        except ConstraintError:
            return False
        return True

    def _negations(self, n: Any, base: dict, refs: tuple[str, ...]):
        """Schemas each of which implies not ``n`` (``n`` normalized exactly), with what to check of
        its merge with ``base`` (``_fillable``), in the order ``_and_not`` tries them: ``n``'s
        ``anyOf``/``oneOf`` branch by branch (twin ``oneOf`` branches match nothing and are left
        out), its listed strings/booleans/null excluded, one of its required names never generated,
        one of its properties present with a value failing its schema (the names ``base`` requires or
        declares first), one of its patterns not matched, no item matching its ``contains``, and the
        other types. A ``nullable`` ``n`` admits null too: every one excludes it."""
        if n is False:
            yield {}, None
            return
        if not isinstance(n, dict) or not _constrains(n):
            return
        null_too = n.get("nullable") is True

        def out(c: dict) -> dict:
            return {**c, NOT_TEXT: [*c.get(NOT_TEXT, []), ["value", None]]} if null_too else c

        for key in ("anyOf", "oneOf"):
            subs = n.get(key)
            if not isinstance(subs, list) or not subs:
                continue
            combined = self._branches_negation(key, subs, base, refs)
            if combined is not None:
                yield out(combined), ("whole",) if _generated_types(base) in ({"string"}, {"boolean"}) else None
        values = values_of(n)
        if values is not None and all(v is None or isinstance(v, (str, bool)) for v in values):
            yield out({NOT_TEXT: [["value", v] for v in values]}), ("text",)
        n_types = types_of(n)
        if n_types is None or "object" in n_types:
            for cand, check in _object_negations(n, base):
                yield out(cand), check
        if n_types is None or "string" in n_types:
            for p in _patterns_of(n):
                yield out({"type": "string", NOT_TEXT: [["pattern", p]]}), ("string",)
        if (n_types is None or "array" in n_types) and "contains" in n and not {"minContains", "maxContains"} & set(n):
            # an array no item of which matches (the empty one too) fails 'contains'
            yield out({"type": "array", "items": {"not": n["contains"]}}), None
        if n_types is not None:
            try:
                yield out({"type": _other_types(n_types)}), None
            except Unsatisfiable:
                pass

    def _branches_negation(self, key: str, subs: list, base: dict, refs) -> dict | None:
        """A schema failing every branch of ``anyOf``/``oneOf`` ``subs`` (so failing it), or None."""
        normalized = []
        for sub in subs:
            before = self.inexact
            try:
                sub, sub_refs = self.normalize(sub, refs)
            except ConstraintError:
                return None
            if self.inexact != before:
                return None
            normalized.append((sub, sub_refs))
        if key == "oneOf":
            # two alike branches: every value of one matches both, so fails the oneOf; what fails the
            # others fails it
            keys = [canonical(sub) for sub, _ in normalized]
            normalized = [x for x, k in zip(normalized, keys, strict=True) if keys.count(k) == 1]
        acc: dict = {}
        for sub, sub_refs in normalized:
            for cand, _ in self._negations(sub, self._merge(base, acc) if acc else base, sub_refs):
                try:
                    self._merge(base, self._merge(acc, cand))
                except ConstraintError:
                    continue
                acc = self._merge(acc, cand)
                break
            else:
                return None
        return acc

    def _branch_types(self, schema: Any, refs: tuple[str, ...], depth: int = 0) -> Any:
        """``schema`` with the ``type`` its ``anyOf``/``oneOf`` implies when it has none: the union
        of its branches' types (given, or of their listed values), references resolved. Equivalent
        (every value satisfying the branches has one of those types); used only to tell ``oneOf``
        branches apart, unchanged where a branch's types are unknown."""
        if not isinstance(schema, dict) or types_of(schema) is not None or depth > 4 or "nullable" in schema:
            return schema
        values = values_of(schema)
        if values is not None:
            return {**schema, "type": sorted({_json_type(v) for v in values})} if values else schema
        key = "anyOf" if "anyOf" in schema else "oneOf" if "oneOf" in schema else None
        subs = schema.get(key) if key else None
        if not isinstance(subs, list) or not subs:
            return schema
        types: set[str] = set()
        for sub in subs:
            # a branch normalized as a subset ('not', if/then/else) may have values of types its
            # subset lacks: only the type it states bounds them (only analysed here, the subset
            # counts where the branch is converted)
            before = self.inexact
            stated = types_of(sub) if isinstance(sub, dict) and "nullable" not in sub else None
            try:
                sub, sub_refs = self.normalize(sub, refs)
            except Unsatisfiable:
                if self.inexact == before:
                    continue
                sub = None
            if self.inexact != before:
                self.inexact = before
                if stated is None:
                    return schema
                types |= stated
                continue
            if sub is False:
                continue
            if isinstance(sub, dict) and "nullable" in sub:
                return schema  # OpenAPI's nullable: null too, whatever its type says
            sub_types = types_of(self._branch_types(sub, sub_refs, depth + 1)) if isinstance(sub, dict) else None
            if sub_types is None:
                return schema
            types |= sub_types
        return {**schema, "type": sorted(types)} if types else schema

    def _item_types(self, schema: Any, refs: tuple[str, ...]) -> Any:
        """``schema`` whose ``items`` is a ``$ref``, with the target's types beside it in an
        ``allOf``: equivalent (they are the target's own types), so that ``oneOf`` branches of arrays
        can be told apart by their items (``_non_empty_if_items_exclusive``)."""
        items = schema.get("items") if isinstance(schema, dict) else None
        if not isinstance(items, dict) or "$ref" not in items:
            return schema
        before = self.inexact
        try:
            target, target_refs = self.normalize(items, refs)
        except ConstraintError:
            self.inexact = before
            return schema
        typed = self._branch_types(target, target_refs) if isinstance(target, dict) else None
        types = types_of(typed) if isinstance(typed, dict) else None
        if self.inexact != before:  # a subset's types: the target's values may have others
            self.inexact = before
            return schema
        if not types:
            return schema
        return {**schema, "items": {"allOf": [items, {"type": sorted(types)}]}}

    def _values(self, values: list, schema: dict, depth: int, refs):
        """``const``/``enum``: the listed values that also satisfy the keywords beside them."""
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        beside = {k for k in rest if _constrains({k: rest[k]})}
        if rest and beside <= {"type", *BOUND_KEYS}:
            # a type and bounds beside the values (the common case): checked as values, without an automaton (the
            # number automaton of the bounds is a subset, which would leave out a listed 0.1 beside minimum 0.1)
            types = types_of(rest) if "type" in beside else None
            values = [v for v in values if _of_types(v, types) and _within_bounds(v, rest)]
        elif _constrains(rest):
            dfa = compile_ast(self.convert(rest, depth + 1, refs), started=self.started)
            kept = [v for v in values if dfa.matches(_dumps(v).encode())]
            if not kept and any(k in rest for k in _CONTENT):
                # a listed string that is not JSON text beside contentMediaType: an annotation, the values stand
                dfa = compile_ast(
                    self.convert({k: v for k, v in rest.items() if k not in _CONTENT}, depth + 1, refs),
                    started=self.started,
                )
                kept = [v for v in values if dfa.matches(_dumps(v).encode())]
            values = kept
        if _constrains(rest) and not values:
            raise Unsatisfiable("json_schema: no enum/const value satisfies the keywords beside it")
        return _alt([_lit(_dumps(v)) for v in values])

    def _null(self, schema, depth, refs):
        return _lit("null")

    def _boolean(self, schema, depth, refs):
        return ("alt", [_lit("true"), _lit("false")])

    def _integer(self, schema, depth, refs):
        return number_ast(schema, integer=True)

    def _number(self, schema, depth, refs):
        return number_ast(schema, integer=False)

    def _string(self, schema, depth, refs):
        pattern = schema.get("pattern")
        patterns = [] if pattern is None else list(pattern) if isinstance(pattern, list) else [pattern]
        fmt = schema.get("format")
        lo = _count(schema, "minLength", 0)
        hi = _count(schema, "maxLength", None)
        formats = fmt if isinstance(fmt, list) else [fmt]  # several: an allOf's (schema_merge)
        if lo > 0 and any(f in BASE64_FORMATS for f in formats):
            # pydantic's Annotated[Base64Bytes, Field(min_length=N)] counts the decoded bytes: text of at least
            # 4*ceil((N+2)/3) characters decodes to N bytes or more, which holds for both readings where it fits
            decoded = 4 * -(-(lo + 2) // 3)
            if hi is None or decoded <= hi:
                lo = decoded
        if self.narrow and hi is not None and hi > max(lo, NARROW_MAX_LENGTH):
            hi = max(lo, NARROW_MAX_LENGTH)
        # look-aheads at a pattern's anchored start: patterns that must (not) match too
        must, must_not = [], []
        for p in patterns:
            rest, pos, neg = split_lookaheads(p) if isinstance(p, str) else (p, [], [])
            must += [q for q in (rest, *pos) if q != "^"]
            must_not += neg
        content = self._json_content(schema, depth, refs)
        try:
            node = string_ast(must, formats[0], lo, hi, started=self.started, memo=self.strings)
            if content is not None:
                plain = not must and all(f is None for f in formats) and lo == 0 and hi is None
                node = self._holding_json(node, content, plain)
            for other in formats[1:]:
                both_dfa = intersect(
                    [
                        compile_ast(node),
                        compile_ast(string_ast([], other, 0, None, started=self.started, memo=self.strings)),
                    ],
                    started=self.started,
                )
                node = ("dfa", both_dfa)
        except ConstraintError as exc:
            if no_string_left(exc):
                # none is left of the strings generated for these patterns, formats (some served as
                # a subset of their values) and lengths: the value is not generated
                raise Unsatisfiable(exc.message) from None
            raise
        return self.exclude(node, [["pattern", q] for q in must_not]) if must_not else node

    def _holding_json(self, node: tuple, content: Any, plain: bool) -> tuple:
        """The string ``node`` (its own keywords) holding the JSON text ``content``; ``plain``: it has none. Where
        no JSON text meets its keywords (a format, a pattern), they stand alone: contentMediaType annotates."""
        text = _cat(QUOTE, encode(content), QUOTE)
        if plain:
            return text
        try:
            return ("dfa", intersect([compile_ast(text), compile_ast(node)], started=self.started))
        except ConstraintError as exc:
            if no_string_left(exc):
                return node
            raise

    def _json_content(self, schema: dict, depth: int, refs) -> Any:
        """The tree of the JSON text a string holds when the schema says it holds JSON (``contentMediaType``
        application/json, not under a ``contentEncoding``), valid against its ``contentSchema`` (default: any
        value): pydantic's ``Json[T]`` reads the string back as a ``T``. JSON Schema makes both keywords
        annotations, so any string would validate; JSON text of the content schema is a subset that does."""
        if schema.get("contentMediaType") != "application/json" or schema.get("contentEncoding") is not None:
            return None
        try:
            return self.convert(schema.get("contentSchema", True), depth + 1, refs)
        except Unsatisfiable:
            return None  # no JSON text fits the content schema: an annotation, the string's own keywords stand

    def _array(self, schema, depth, refs):
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems")
        lo = _count(schema, "minItems", 0)
        hi = _count(schema, "maxItems", None)
        if schema.get("uniqueItems") is True:
            # a regular language cannot remember which items it produced; arrays of at most one
            # item are always unique (a subset)
            if lo > 1:
                return self._distinct(schema, items, prefix, lo, hi, depth, refs)
            hi = 1 if hi is None else min(hi, 1)
        prefix = prefix or []
        if not isinstance(prefix, list):
            raise self.fail("prefixItems must be a list")
        if "contains" in schema or CONTAINS in schema:
            prefix, items, lo = self._contains(schema, prefix, items, lo, hi)
        if hi is not None and hi < lo:
            raise Unsatisfiable("json_schema: maxItems < minItems")
        heads = []
        for k, p in enumerate(prefix[: hi if hi is not None else len(prefix)]):
            try:
                heads.append(self.convert(p, depth + 1, refs))
            except ConstraintError as exc:
                if not isinstance(exc, Unsatisfiable) or k < lo:
                    _at(exc, f"[{k}]")
                    raise
                hi = k  # no array reaches this position
                break
        item = None
        if items is not False and (hi is None or hi > len(heads)):
            try:
                item = self.convert(True if items is None else items, depth + 1, refs)
            except ConstraintError as exc:
                if not isinstance(exc, Unsatisfiable) or lo > len(heads):
                    _at(exc, "[*]")
                    raise
        return _cat(_lit("["), _sequence(heads, item, lo, hi), _lit("]"))

    def _distinct(self, schema: dict, items: Any, prefix: Any, lo: int, hi: int | None, depth: int, refs) -> tuple:
        """``uniqueItems`` with ``minItems`` > 1: when the item schema lists values (``enum``/``const``,
        booleans and null, or branches of an ``anyOf``/``oneOf`` that do), arrays of distinct ones among them that the
        item schema admits, in the order listed (a subset: other orders and unlisted values are not
        generated; at most MAX_DISTINCT arrays). Refused otherwise."""
        if prefix or any(k in schema for k in ("contains", CONTAINS)) or not isinstance(items, dict):
            raise self.fail("uniqueItems with minItems > 1 is not supported")
        target, target_refs = self.normalize(items, refs)
        listed = values_of(target) if isinstance(target, dict) else None
        types = types_of(target) if isinstance(target, dict) else None
        if listed is None and types and types <= {"boolean", "null"}:  # they list themselves
            listed = [v for t, vs in (("boolean", [False, True]), ("null", [None])) if t in types for v in vs]
        if listed is None and isinstance(target, dict):
            subs = target.get("anyOf") or target.get("oneOf") or []
            listed = []
            for sub in subs if isinstance(subs, list) else []:
                try:
                    sub, _ = self.normalize(sub, target_refs)
                except ConstraintError:
                    continue
                listed += (values_of(sub) or []) if isinstance(sub, dict) else []
        if not listed:
            raise self.fail("uniqueItems with minItems > 1 is not supported (only for items that list their values)")
        admits = compile_ast(self.convert(items, depth + 1, refs), started=self.started)
        distinct: dict[str, Any] = {}
        for v in listed:
            if admits.matches(_dumps(v).encode()):
                distinct.setdefault(canonical(v), v)
        values = list(distinct.values())
        top = len(values) if hi is None else min(hi, len(values))
        if top < lo:
            raise Unsatisfiable(f"json_schema: fewer than {lo} distinct items the item schema admits")
        if sum(math.comb(len(values), k) for k in range(lo, top + 1)) > MAX_DISTINCT:
            raise self.fail(f"uniqueItems with minItems > 1: more than {MAX_DISTINCT} arrays of distinct listed items")
        arrays = [
            _lit("[" + ",".join(_dumps(v) for v in chosen) + "]")
            for k in range(lo, top + 1)
            for chosen in itertools.combinations(values, k)
        ]
        return _alt(arrays)

    def _contains(self, schema: dict, prefix: list, items: Any, lo: int, hi: int | None) -> tuple[list, Any, int]:
        """``contains`` (and ``minContains``/``maxContains``, or several ``contains`` of an allOf):
        the first items match it (as many as ``minContains``, one per ``contains`` when several, or
        one item matching them all when at most one item is allowed), each also following the schema
        of its position; with ``maxContains`` the other items do not match it (its negation, as
        ``not``). A subset: the matching items could be anywhere. Returns the positional schemas,
        the schema of the items after them, and the fewest items."""
        wanted = _contains_of(schema)
        least = _count(schema, "minContains", 1)
        most = _count(schema, "maxContains", None)
        if len(wanted) > MAX_CONTAINS:
            raise self.fail(f"more than {MAX_CONTAINS} 'contains' in one allOf are not supported")
        if len(wanted) > 1 and ("minContains" in schema or "maxContains" in schema):
            raise self.fail("minContains/maxContains with several 'contains' in an allOf are not supported")
        if most is not None and most < least:
            raise Unsatisfiable("json_schema: maxContains < minContains")
        heads = wanted * least if len(wanted) == 1 else wanted
        if len(heads) > 1 and hi is not None and hi < len(heads) and len(wanted) > 1:
            heads = [{"allOf": wanted}]  # one item matching every 'contains'
        rest = True if items is None else items

        def at(k: int) -> Any:
            return prefix[k] if k < len(prefix) else rest

        out = [both(at(k), sub) for k, sub in enumerate(heads)] + prefix[len(heads) :]
        if most is not None:
            # the items past the matching ones must not match: maxContains counts every match
            other = {"not": wanted[0]}
            out = out[: len(heads)] + [both(p, other) for p in out[len(heads) :]]
            rest = both(rest, other)
        return out, rest, max(lo, len(heads))

    def _object(self, schema, depth, refs):
        dependent = self._required_dependency(schema, refs)
        if dependent is not None:
            return self.convert(dependent, depth + 1, refs)
        props, required = self._declared(schema, depth, refs)
        lo = _count(schema, "minProperties", 0)
        hi = _count(schema, "maxProperties", None)
        if not props:
            return self._free_members(schema, depth, refs, lo, hi)
        kvs = []
        for name, sub in props.items():
            try:
                value = self.convert(sub, depth + 1, refs)
            except ConstraintError as exc:
                if isinstance(exc, Unsatisfiable) and name not in required:
                    continue  # an optional property no value can fill: never generated
                _at(exc, _member_step(name))
                raise
            kvs.append((name in required, _cat(_lit(_dumps(name) + ":"), value)))
        n_required = sum(1 for req, _ in kvs if req)
        if hi is not None and hi < len(kvs):
            # maxProperties: the required properties and the first optional ones up to it (a subset:
            # every answer holds at most that many; the members automaton does not count)
            if n_required > hi:
                raise Unsatisfiable(f"json_schema: {n_required} required properties and maxProperties {hi}")
            room = hi - n_required
            kvs = [(req, kv) for k, (req, kv) in enumerate(kvs) if req or sum(not r for r, _ in kvs[:k]) < room]
        at_least_one = lo == 1 and n_required == 0  # minProperties 1: the empty object is left out
        if at_least_one and not kvs:
            raise Unsatisfiable("json_schema: minProperties 1 and no property can be generated")
        if lo > n_required and not at_least_one:
            # minProperties: the first optional properties required up to it (a subset)
            optional = [k for k, (req, _) in enumerate(kvs) if not req]
            if len(optional) < lo - n_required:
                raise self.fail("minProperties beyond the properties that can be generated is not supported")
            first = set(optional[: lo - n_required])
            kvs = [(req or k in first, kv) for k, (req, kv) in enumerate(kvs)]
        return _cat(_lit("{"), _members(kvs, at_least_one), _lit("}"))

    def _required_dependency(self, schema: dict, refs) -> dict | None:
        """A schema dependency (``dependencies``/``dependentSchemas``) of a required name always
        applies: the object schema merged with it, that dependency removed (exact), or None when
        there is none."""
        required = schema.get("required", [])
        for key in ("dependencies", "dependentSchemas"):
            deps = schema.get(key)
            if not isinstance(deps, dict):
                continue
            for name, dep in deps.items():
                if name not in required or isinstance(dep, list) or not _constrains(dep):
                    continue
                rest = {**schema, "type": "object", key: {k: v for k, v in deps.items() if k != name}}
                target, _ = self.normalize(dep, refs)
                return self._merge(rest, target)
        return None

    def _declared_as_given(self, schema: dict) -> tuple[dict, list]:
        declared, required = schema.get("properties") or {}, schema.get("required", [])
        if not isinstance(declared, dict) or not isinstance(required, list):
            # the metaschema check, which names these, is skipped for a very large schema (constraint_keys.py)
            raise self.fail("'properties' must be an object and 'required' a list of names")
        return dict(declared), list(dict.fromkeys(required))

    def _declared(self, schema: dict, depth: int, refs) -> tuple[dict, list]:
        """The properties an answer may hold (name -> schema) and the required ones: the declared
        ones with the patternProperties they match, required names not declared (valued by
        additionalProperties), less the names propertyNames refuses and the optional names whose
        dependencies are not certain to be there (never generating those is a subset)."""
        props, required = self._declared_as_given(schema)
        additional = _additional(schema)
        patterns = schema.get("patternProperties") or {}
        deps = _dependencies_by_name(schema)
        for name in required:  # a required name's required dependencies are required too
            for dep in deps.get(name, []):
                if isinstance(dep, list):
                    required += [d for d in dep if d not in required]
                elif dep is not True and dep != {}:
                    raise self.fail(f"a schema dependency of the required property {name!r} is not supported")
        # after the required dependencies: a name they require cannot be left out
        _drop_absent(schema, props, required)
        for name in required:
            if name not in props:
                if additional is False and not any(_search(p, name) for p in patterns):
                    raise Unsatisfiable(f"json_schema: required property {name!r} is not allowed")
                props[name] = True if additional is False else additional
        for name, sub in list(props.items()):
            matching = [s for p, s in patterns.items() if _search(p, name)]
            if matching:
                props[name] = {"allOf": [sub, *matching]}
            if name not in required and not _certain(deps.get(name, []), required):
                del props[name]
        if "propertyNames" in schema and props:
            tree = self._property_names(schema, depth, refs)
            names = compile_ast(tree, started=self.started) if tree is not None else None
            for name in list(props):
                if names is None or not names.matches(_dumps(name).encode()):
                    if name in required:
                        raise Unsatisfiable(f"json_schema: required property {name!r} fails propertyNames")
                    del props[name]
        return props, required

    def _free_members(self, schema: dict, depth: int, refs, lo: int, hi: int | None):
        """No declared property: members whose names are free (or follow the one patternProperties
        pattern, or propertyNames) and whose values follow additionalProperties."""
        additional = _additional(schema)
        patterns = schema.get("patternProperties") or {}
        self._no_dependencies(schema)
        if list(patterns) == [""] and additional is False:
            # JSON Schema: "" matches every name. jsonschema (4.26) joins the patterns with "|" and,
            # the result being empty, counts every member as additional, refused here: answers
            # must validate there too, so only the empty object is generated (a subset)
            patterns = {}
        if lo > 1 and (patterns or (additional is not False and hi != 0)):
            # a member automaton cannot keep names apart: {"a":1,"a":2} parses to one member
            raise self.fail(
                "minProperties above 1 on an object without declared properties is not supported (member names could "
                "repeat); declare the properties"
            )
        if len(patterns) > 1:
            return self._pattern_members(schema, patterns, depth, refs, lo, hi)
        if patterns:
            ((pattern, value_schema),) = patterns.items()
            try:
                key = self._named(
                    string_ast([pattern], None, 0, None, started=self.started, memo=self.strings), schema, depth, refs
                )
            except Unsatisfiable:
                if lo > 0:
                    raise
                return _lit("{}")
        elif additional is False or hi == 0:
            if lo > 0:
                raise Unsatisfiable("json_schema: minProperties > 0 with no property allowed")
            return _lit("{}")
        else:
            value_schema = additional
            key = self._property_names(schema, depth, refs) if "propertyNames" in schema else _string_any()
            if key is None:
                if lo > 0:
                    raise Unsatisfiable("json_schema: minProperties > 0 and propertyNames admits no name")
                return _lit("{}")
        if schema.get(ABSENT):
            key = self.exclude(key, [["value", name] for name in schema[ABSENT]])
        try:
            value = self.convert(value_schema, depth + 1, refs)
        except Unsatisfiable:
            if lo > 0:
                raise
            return _lit("{}")
        return _cat(_lit("{"), _sequence([], _cat(key, _lit(":"), value), lo, hi), _lit("}"))

    def _no_dependencies(self, schema: dict) -> None:
        for kw in ("dependencies", "dependentSchemas", "dependentRequired"):
            if kw in schema:
                raise self.fail(f"{kw!r} on an object without properties is not supported")

    def _property_names(self, schema: dict, depth: int, refs) -> Any:
        """The names ``propertyNames`` admits (JSON strings), or None when it admits none: a names schema of
        another type (pydantic writes ``dict[IntEnum, X]`` so) leaves only the empty object, not no value."""
        try:
            return self.convert({"allOf": [{"type": "string"}, schema["propertyNames"]]}, depth + 1, refs)
        except Unsatisfiable:
            return None

    def _named(self, key: tuple, schema: dict, depth: int, refs) -> tuple:
        """``key`` (member names, as JSON strings) less the names ``propertyNames`` refuses: the
        product of the two automata (exact)."""
        if "propertyNames" not in schema:
            return key
        names = self._property_names(schema, depth, refs)
        if names is None:
            raise Unsatisfiable("json_schema: propertyNames admits no name")
        try:
            dfa = intersect(
                [compile_ast(key, started=self.started), compile_ast(names, started=self.started)], started=self.started
            )
        except ConstraintError as exc:
            if no_string_left(exc):
                raise Unsatisfiable("json_schema: no name matches both patternProperties and propertyNames") from None
            raise
        return ("dfa", dfa)

    def _pattern_members(self, schema: dict, patterns: dict, depth: int, refs, lo: int, hi: int | None):
        """Several ``patternProperties`` and no declared property: each member's name matches one
        pattern and none of the others (the complement of their automaton: a name several patterns
        match would owe its value to each of their schemas), valued by that pattern's schema. Names
        no pattern matches (``additionalProperties``) are not generated: a subset."""
        members = []
        for pattern, value_schema in patterns.items():
            others = [["pattern", q] for q in patterns if q != pattern]
            others += [["value", name] for name in schema.get(ABSENT, [])]
            try:
                key = self.exclude(
                    string_ast([pattern], None, 0, None, started=self.started, memo=self.strings), others
                )
                key = self._named(key, schema, depth, refs)
                members.append(_cat(key, _lit(":"), self.convert(value_schema, depth + 1, refs)))
            except Unsatisfiable:
                continue
        if not members:
            if lo > 0:
                raise Unsatisfiable("json_schema: minProperties > 0 and no patternProperties member can be generated")
            return _lit("{}")
        return _cat(_lit("{"), _sequence([], _alt(members), lo, hi), _lit("}"))


def _contains_of(schema: dict) -> list:
    return ([schema["contains"]] if "contains" in schema else []) + list(schema.get(CONTAINS, []))


def _if_chain(schema: dict) -> dict | None:
    """``allOf`` with several ``if``/``then``/``else`` whose ``if``s exclude each other (an
    if-chain on one discriminator: ``if: {properties: {kind: {const: "a"}}}``, then ``"b"``, ...),
    as an ``anyOf`` with one branch per ``if``: that ``if`` (its properties required), its ``then``,
    and the ``else`` of every other, which fails there. Sound: a value of branch i satisfies
    ``if`` i, and holds a property whose value the other ``if``s refuse. Values that satisfy none of
    the ``if``s are not generated (a subset). None when the ``if``s may overlap."""
    subs = schema["allOf"]
    conds = [sub for sub in subs if isinstance(sub, dict) and isinstance(sub.get("if"), dict)]
    if not 2 <= len(conds) <= MAX_IF_CHAIN:
        return None
    strict = [_props_required(c["if"]) for c in conds]
    for i, a in enumerate(strict):
        if not all(_fails(a, c["if"]) for j, c in enumerate(conds) if j != i):
            return None
    others = [sub for sub in subs if not any(sub is c for c in conds)]
    base = {k: v for k, v in schema.items() if k != "allOf"}

    def plain(c: dict) -> dict:
        return {k: v for k, v in c.items() if k not in ("if", "then", "else")}

    branches = []
    for i, c in enumerate(conds):
        parts = [base, *others, *(plain(d) for d in conds), strict[i], c.get("then", True)]
        parts += [d.get("else", True) for j, d in enumerate(conds) if j != i]
        branches.append({"allOf": parts})
    return {"anyOf": branches}


def _props_required(cond: dict) -> dict:
    """``cond`` for objects only, with the properties it names required (a subset of it: a value
    that is not an object satisfies every ``if`` of properties, so it must not be generated)."""
    props = cond.get("properties")
    if not isinstance(props, dict) or not props:
        return cond
    return {**cond, "type": "object", "required": list(dict.fromkeys([*cond.get("required", []), *props]))}


def _fails(a: dict, b: Any) -> bool:
    """Whether every value of ``a`` fails ``b``: ``a`` requires a property whose values ``b``'s
    schema for it refuses (so ``b`` fails whether or not it requires the property)."""
    if not isinstance(b, dict):
        return b is False
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    return any(
        k in pb and isinstance(pa.get(k), dict) and isinstance(pb[k], dict) and _disjoint(pa[k], pb[k])
        for k in a.get("required", [])
    )


def _object_negations(n: dict, base: dict):
    """``_Converter._negations`` of an object schema ``n``: one of its required names never generated
    (one ``base`` does not require), or one of its properties present with a value failing its schema."""
    for name in n.get("required", []):
        if isinstance(name, str) and name not in base.get("required", []):
            yield {"type": "object", ABSENT: [name]}, ("absent", name)
    props = n.get("properties")
    if isinstance(props, dict):
        for k in _negation_order(props, base):
            yield {"type": "object", "required": [k], "properties": {k: {"not": props[k]}}}, ("property", k)


def _values_negation(n: dict, keys: set[str], n_types: set[str] | None) -> tuple[dict, bool] | None:
    """``_Converter._not_of`` of listed values (excluded texts, exact when nothing else constrains)
    and of excluded texts (those values, exactly); None when ``n`` lists none."""
    if keys == {NOT_TEXT} and all(kind == "value" for kind, _ in n[NOT_TEXT]):
        return {"enum": [v for _, v in n[NOT_TEXT]]}, True
    values = values_of(n)
    if values is None:
        return None
    if not all(v is None or isinstance(v, (str, bool)) for v in values):
        raise ConstraintError("json_schema: 'not' with const/enum numbers, arrays or objects is not supported")
    typed = n_types is None or all(_json_type(v) in n_types for v in values)
    return {NOT_TEXT: [["value", v] for v in values]}, keys <= {"enum", "const", "type"} and typed


def _property_negation(props: dict, base: dict) -> dict:
    """An object whose first property of ``props`` is present with a value failing its schema."""
    k, sub = next(iter(props.items()))
    return {"type": "object", "required": [k], "properties": {k: {"not": sub}}}


def _additional(schema: dict) -> Any:
    """The schema of the members no declared name or pattern covers."""
    return schema.get("additionalProperties", True)


def _negation_order(props: dict, base: dict) -> list[str]:
    """The names of ``props`` to try negating first: those ``base`` requires, then those it declares,
    then the others; never one whose schema in ``base`` is the same (its value could not fail it),
    one ``base`` refuses, or one ``base`` never generates."""
    base_props = base.get("properties") or {}
    required = base.get("required", [])
    absent = base.get(ABSENT, [])
    names = []
    for k, sub in props.items():
        if k in absent or base_props.get(k, True) is False or sub is True or sub == {}:
            continue
        if k in base_props and canonical(base_props[k]) == canonical(sub):
            continue
        if k not in base_props and base.get("additionalProperties", True) is False:
            continue  # a name base refuses
        names.append(k)
    return sorted(names, key=lambda k: 0 if k in required else 1 if k in base_props else 2)


def _patterns_of(schema: dict) -> list[str]:
    pattern = schema.get("pattern")
    patterns = pattern if isinstance(pattern, list) else [pattern] if pattern is not None else []
    return [p for p in patterns if isinstance(p, str)]


def _dependencies_by_name(schema: dict) -> dict[str, list]:
    """Each name's dependencies, of every keyword: one name can have a list and a schema, and both hold."""
    deps: dict[str, list] = {}
    for key in ("dependencies", "dependentSchemas", "dependentRequired"):
        for name, dep in (schema.get(key) or {}).items():
            deps.setdefault(name, []).append(dep)
    return deps


def _certain(deps: list, required: list) -> bool:
    """Whether a name's dependencies hold in every answer: each a list of required names, or no constraint."""
    return all(dep is True or dep == {} or (isinstance(dep, list) and all(d in required for d in dep)) for dep in deps)


def _drop_absent(schema: dict, props: dict, required: list) -> None:
    """The names a ``not`` of ``required`` excludes (ABSENT) are never generated."""
    for name in schema.get(ABSENT, []):
        if name in required:
            raise Unsatisfiable(f"json_schema: property {name!r} is required and excluded by 'not'")
        props.pop(name, None)


def _other_types(types: set[str]) -> list[str]:
    """The JSON types a value of none of ``types`` may have (a number answer may be an integer)."""
    left = {"object", "array", "string", "number", "integer", "boolean", "null"} - types
    if "integer" in types:
        left.discard("number")
    if "number" in types:
        left.discard("integer")
    if not left:
        raise Unsatisfiable("json_schema: 'not' excludes every type")
    return sorted(left)


def _complement(dfa: ByteDFA) -> ByteDFA:
    """Every byte string ``dfa`` refuses: a sink state takes the missing transitions, acceptance
    flips (every state still reaches acceptance: the sink accepts)."""
    n = dfa.num_states
    table = np.vstack([np.where(dfa.table < 0, n, dfa.table), np.full((1, 256), n)]).astype(np.int32)
    accept = np.append(1 - np.asarray(dfa.accept, dtype=np.uint8), 1).astype(np.uint8)
    return ByteDFA(table, accept, dfa.start)


def _conditional(schema: dict) -> dict:
    """``if``/``then``/``else`` as a conjunction: the answers generated satisfy ``if`` and so must
    satisfy ``then`` (``else`` never applies to them); with ``if: false`` they must satisfy ``else``.
    Answers that fail ``if`` are not generated (a subset: which values fail a schema is not
    something this converter can generate). ``then``/``else`` without ``if`` have no effect."""
    rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    if "if" not in schema:
        return rest
    cond = schema["if"]
    if cond is False:
        return {"allOf": [rest, schema.get("else", True)]}
    if _constrains(rest):
        # the conditional as a member of its own: an allOf may serve it by its 'else' (_all_of)
        return {"allOf": [rest, {k: v for k, v in schema.items() if k in ("if", "then", "else")}]}
    return {"allOf": [cond, schema.get("then", True)]}


def _of_types(value: Any, types: set[str] | None) -> bool:
    kind = _json_type(value)
    return types is None or kind in types or (kind == "integer" and "number" in types)


def _within_bounds(value: Any, schema: dict) -> bool:
    """Whether a listed value meets the bounds beside it (they apply to numbers only), compared as jsonschema
    compares them; draft 4's boolean exclusiveMinimum/exclusiveMaximum make minimum/maximum strict."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True

    def number(x: Any) -> float | None:
        return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    for bound, strict, below in (("minimum", "exclusiveMinimum", False), ("maximum", "exclusiveMaximum", True)):
        given, exclusive = number(schema.get(bound)), schema.get(strict)
        if given is not None and (
            (value > given if below else value < given) or (exclusive is True and value == given)
        ):
            return False
        limit = number(exclusive)
        if limit is not None and (value >= limit if below else value <= limit):
            return False
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _may_admit(schema: dict, value: Any) -> bool:
    """False only when ``schema`` certainly refuses ``value``: by its type, or, for a string, by its
    length bounds or a pattern (read by Python's ``re``, as the ``jsonschema`` validator does; a
    pattern it cannot read decides nothing)."""
    types = types_of(schema)
    t = _json_type(value)
    if types is not None and t not in types and not (t == "integer" and "number" in types):
        return False
    if _excluded_by_not(schema.get("not"), value):
        return False
    if _text_excluded(value, schema.get(NOT_TEXT) or []):
        return False
    if not isinstance(value, str):
        return True
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if (isinstance(lo, int) and len(value) < lo) or (isinstance(hi, int) and len(value) > hi):
        return False
    pattern = schema.get("pattern")
    for p in pattern if isinstance(pattern, list) else [pattern] if isinstance(pattern, str) else []:
        try:
            if re.search(p, value) is None:
                return False
        except re.error:
            continue
    return True


def _count(schema: dict, key: str, default: int | None) -> Any:
    value = schema.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
        raise ConstraintError(f"json_schema: {key} must be a non-negative integer, got {value!r}")
    return int(value)


def _search(pattern: str, name: str) -> bool:
    """Whether a patternProperties pattern matches a declared name (names are fixed strings: Python's
    ``re`` reads the common ECMA-262 subset alike)."""
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise ConstraintError(f"json_schema: patternProperties {pattern!r}: {exc}") from None


def _annotates_only(schema: dict, besides: str | None = None) -> bool:
    """Whether every keyword of ``schema`` (but ``besides``) only annotates: a ``$ref`` beside its
    ``description``, as schemas in the wild write most references, is the reference alone."""
    return not any(k in _STRUCTURE or k in _ALL_TYPE_KEYWORDS or k in _UNSUPPORTED for k in schema if k != besides)


def _constrains(schema: Any) -> bool:
    """Whether ``schema`` has any keyword that may reject a value."""
    if not isinstance(schema, dict):
        return schema is False
    return not _annotates_only(schema)


def _one_of_values(merged: list, plain: list) -> list | None:
    """A ``oneOf`` whose every branch only lists values (``const``/``enum``, with a ``type`` at most), as
    one branch of the values exactly one branch lists (a value two list matches both, so no answer);
    None for any other ``oneOf``. The pairwise analysis would reach the same values at a cost
    quadratic in the branches (a linter's hundred rule names: ~60 ms)."""
    counts: dict[str, int] = {}
    values: dict[str, list] = {}
    for (m, _), (_, _, exact) in zip(merged, plain, strict=True):
        if not exact or not isinstance(m, dict):
            return None
        listed = values_of(m)
        if listed is None or _constrains({k: v for k, v in m.items() if k not in ("const", "enum", "type")}):
            return None
        types = types_of(m)
        if types is not None:
            listed = [v for v in listed if _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)]
        own: dict[str, list] = {}
        for v in listed:  # every spelling of a value (1 and 1.0), as the branch's own enum gives
            own.setdefault(canonical(v), []).append(v)
        for key, spellings in own.items():
            counts[key] = counts.get(key, 0) + 1
            values[key] = spellings
    once = [v for k, n in counts.items() if n == 1 for v in values[k]]
    if not once:
        raise Unsatisfiable("json_schema: every value a oneOf lists is listed by two of its branches")
    return [({"enum": once}, merged[0][1])]


def _exclusive_branches(merged: list[tuple[Any, Any]], typed: list[Any] | None = None) -> list[tuple[Any, Any]]:
    """``oneOf``: the branches whose generated answers cannot match any other branch, so that every
    answer matches exactly one. A branch that might overlap another is not generated (a subset: its
    values are still valid through the branches kept, or are left out); refused when none is left.
    ``typed``: the branches with the types their ``anyOf``/``oneOf`` imply (``_branch_types``), to
    tell them apart; a branch is converted as given unless it had to be narrowed (``_narrowed``)."""
    views = typed if typed is not None else [m for m, _ in merged]
    schemas = []
    for i, (m, _) in enumerate(merged):
        others = [o for j, o in enumerate(views) if j != i]
        narrowed = _narrowed(views[i], others)
        schemas.append(m if narrowed is views[i] else narrowed)
    kept = [
        (schemas[i], refs)
        for i, (_, refs) in enumerate(merged)
        if all(_excludes(_view(schemas[i], merged[i][0], views[i]), other) for j, other in enumerate(views) if j != i)
    ]
    if not kept:
        raise ConstraintError(
            "json_schema: oneOf branches that a value could match both of are not supported "
            "(give them different types, different const/enum values of a required property, "
            "or each a required property the others do not declare)"
        )
    return kept


def _excluded_by_not(negated: Any, value: Any) -> bool:
    """Whether a ``not`` of nothing but listed values (``const``/``enum``) lists ``value``."""
    if not isinstance(negated, dict) or any(
        _constrains({k: v}) for k, v in negated.items() if k not in ("enum", "const")
    ):
        return False
    return canonical(value) in {canonical(v) for v in values_of(negated) or []}


def _readable(pattern: Any) -> bool:
    """Whether ``pattern`` is a string the converter can build an automaton of (to exclude it)."""
    if not isinstance(pattern, str):
        return False
    try:
        pattern_ast(pattern)
    except ConstraintError:
        return False
    return True


def _scalar_values(schema: Any) -> list | None:
    """The listed values of ``schema`` when they are all strings, booleans or null (texts that a
    NOT_TEXT item can exclude exactly)."""
    if not isinstance(schema, dict):
        return None
    values = values_of(schema)
    if not values or not all(v is None or isinstance(v, (str, bool)) for v in values):
        return None
    return values


def _text_excluded(value: Any, excluded: list) -> bool:
    """Whether NOT_TEXT items ``excluded`` hold the string, boolean or null ``value``."""
    if value is not None and not isinstance(value, (str, bool)):
        return False
    return any(x[0] == "value" and type(x[1]) is type(value) and x[1] == value for x in excluded)


def _view(schema: Any, given: Any, typed: Any) -> Any:
    """The analysis view of a converted branch: its typed view when it is converted as given."""
    return typed if schema is given else schema


def _narrowed(a: Any, others: list) -> Any:
    """Branch ``a`` of a ``oneOf`` narrowed (a subset of it) so that its answers fail the other
    branches where that is in reach: arrays of exclusive items non-empty, objects separated by a
    property (``_separated``), the types another branch accepts left out (``_own_types``), the
    listed strings/booleans/null of another branch and the strings another branch's pattern
    requires excluded (``_excluding_texts``)."""
    out = _non_empty_if_items_exclusive(a, others)
    out = _separated(out, others)
    out = _own_types(out, others)
    out = _excluding_texts(out, others)
    return out


def _widen(types: set[str]) -> set[str]:
    return types | ({"integer"} if "number" in types else set())


def _own_types(a: Any, others: list) -> Any:
    """``a`` with several types keeps those no other branch accepts (when every other branch says
    which types it accepts and some type of ``a`` is left)."""
    if not isinstance(a, dict):
        return a
    types = types_of(a)
    if types is None or len(types) < 2:
        return a
    taken: set[str] = set()
    for b in others:
        if b is False:
            continue
        tb = types_of(b) if isinstance(b, dict) else None
        if tb is None:
            return a
        taken |= _widen(tb)
    own = {t for t in types if t not in taken and not (t == "number" and "integer" in taken)}
    if not own or own == types:
        return a
    return {**a, "type": sorted(own)}


def _excluding_texts(a: Any, others: list) -> Any:
    """Scalar branch ``a`` (strings, booleans, null) less the texts that would match another branch:
    that branch's listed strings/booleans/null, or, for a string branch against a string-only
    branch with a ``pattern``, the strings that pattern matches (exact: ``_Converter.exclude``)."""
    if not isinstance(a, dict):
        return a
    types = _generated_types(a)
    if types is None or not types <= {"string", "boolean", "null"}:
        return a
    items: list = []
    for b in others:
        if not isinstance(b, dict) or _excludes(a, b):
            continue
        values = values_of(b)
        if values is not None and all(v is None or isinstance(v, (str, bool)) for v in values):
            items += [["value", v] for v in values]
        elif types == {"string"} and types_of(b) == {"string"} and _readable(b.get("pattern")):
            items.append(["pattern", b["pattern"]])
    if not items:
        return a
    return {**a, NOT_TEXT: [*a.get(NOT_TEXT, []), *(x for x in items if x not in a.get(NOT_TEXT, []))]}


def _non_empty_if_items_exclusive(a: Any, others: list) -> Any:
    """``a`` with ``minItems`` at least 1 when it is an array schema whose items exclude the items of
    every other array branch (the empty array matches them all)."""
    if (
        not isinstance(a, dict)
        or types_of(a) != {"array"}
        or not isinstance(a.get("items"), dict)
        or "prefixItems" in a
    ):
        return a
    arrays = [o for o in others if isinstance(o, dict) and "array" in (types_of(o) or {"array"})]
    if not all(
        isinstance(o.get("items"), dict) and "prefixItems" not in o and _disjoint(a["items"], o["items"])
        for o in arrays
    ):
        return a
    if isinstance(a.get("minItems"), int) and a["minItems"] >= 1:
        return a
    return {**a, "minItems": 1}


def _separated(a: Any, others: list) -> Any:
    """Object branch ``a`` narrowed (a subset of it) so that its answers fail each other branch it
    may overlap: a property both declare with disjoint schemas becomes required in ``a``, or else a
    name the other requires and ``a`` does not is never generated in ``a`` (``a``'s answers hold
    only the names it declares)."""
    if not isinstance(a, dict) or _generated_types(a) != {"object"} or not a.get("properties"):
        return a
    for b in others:
        if not isinstance(b, dict) or _excludes(a, b):
            continue
        props, b_props = a["properties"], b.get("properties") or {}
        required = list(a.get("required", []))
        shared = [n for n in props if n in b_props and props[n] is not False and _disjoint(props[n], b_props[n])]
        if not shared and b.get("additionalProperties") is False and not b.get("patternProperties"):
            shared = [n for n in props if n not in b_props and props[n] is not False]  # b refuses these names
        if shared:
            a = {**a, "required": [*required, shared[0]]}
            continue
        missing = [n for n in b.get("required", []) if isinstance(n, str) and n not in required]
        if missing:
            a = {**a, "properties": {**props, missing[0]: False}}
            continue
        listed = [
            n
            for n in props
            if isinstance(props[n], dict)
            and _scalar_values(b_props.get(n))
            and not any(n in (a.get(k) or {}) for k in ("dependencies", "dependentSchemas", "dependentRequired"))
            and n not in a.get(ABSENT, [])
            and not _only_listed(props[n], _scalar_values(b_props[n]) or [])
        ]
        if listed:
            # a holds that property with none of the values b's schema for it lists
            n = listed[0]
            items = [["value", v] for v in _scalar_values(b_props[n]) or []]
            a = {
                **a,
                "required": [*required, n] if n not in required else required,
                "properties": {**props, n: {**props[n], NOT_TEXT: [*props[n].get(NOT_TEXT, []), *items]}},
            }
            continue
    return a


def _only_listed(schema: dict, values: list) -> bool:
    """Whether ``schema`` lists values and every one of them is among ``values``."""
    own = values_of(schema)
    return own is not None and all(any(canonical(v) == canonical(w) for w in values) for v in own)


def _generated_types(schema: dict) -> set[str] | None:
    """The types the converter generates for ``schema`` (its ``type``, or else those its keywords
    imply, as ``_Converter._implied_types``; memoized in an analysis: not to be changed)."""
    return _memoized("g", _generated_types_now, schema)


def _generated_types_now(schema: dict) -> set[str] | None:
    types = _types_of(schema)
    if types is None and "anyOf" not in schema and "oneOf" not in schema and values_of(schema) is None:
        types = {t for t, keys in _TYPE_KEYWORDS.items() if keys & set(schema) and t != "integer"} or None
    return types


# A oneOf's analysis is pairwise over its branches (a few hundred make it a million pairs of
# ``_excludes``/``_disjoint``, each asked again as a branch is narrowed): while one runs
# (``_analysis``), their answers and each schema's types and listed values are kept by the
# identity of the schemas asked about, which the memo holds (so no identity is reused while it
# lives; schemas are never changed once built). Only answers are kept: an error (a bad ``type``)
# is raised again each time, as without the memo.
_ANALYSIS = threading.local()


@contextmanager
def _analysis() -> Iterator[None]:
    if getattr(_ANALYSIS, "memo", None) is not None:
        yield  # an analysis inside another (a branch converted while negating): one memo
        return
    _ANALYSIS.memo = {}
    try:
        yield
    finally:
        _ANALYSIS.memo = None


def _memo() -> dict | None:
    return getattr(_ANALYSIS, "memo", None)


def _memoized(kind: str, fn, a: dict, b: Any = None, depth: int = 0):
    memo = _memo()
    if memo is None:
        return fn(a) if b is None else fn(a, b, depth)
    key = (kind, id(a), id(b), depth)
    hit = memo.get(key)
    if hit is not None:
        return hit[0]
    out = fn(a) if b is None else fn(a, b, depth)
    memo[key] = (out, a, b)
    return out


def _types_of(schema: dict) -> set[str] | None:
    """``types_of`` (memoized in an analysis: the set returned is shared, never to be changed)."""
    return _memoized("t", types_of, schema)


def _value_keys(schema: dict) -> set[str] | None:
    """The ``canonical`` forms of the schema's listed values (None: it lists none)."""
    return _memoized("v", _value_keys_now, schema)


def _value_keys_now(schema: dict) -> set[str] | None:
    values = values_of(schema)
    return None if values is None else {canonical(v) for v in values}


def _excludes(a: Any, b: Any) -> bool:
    """Whether every answer generated for schema ``a`` fails schema ``b``."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return _disjoint(a, b)
    return _memoized("x", _excludes_now, a, b)


def _excludes_now(a: dict, b: dict, _depth: int = 0) -> bool:
    if _disjoint(a, b):
        return True
    generated, accepted = _generated_types(a), _types_of(b)
    if generated is not None and accepted is not None and not _widen(generated) & _widen(accepted):
        return True  # a's answers have types b refuses
    excluded = a.get(NOT_TEXT) or []
    values = values_of(b)
    if values and all(_text_excluded(v, excluded) for v in values):
        return True  # b admits only texts a never generates
    if generated == {"string"} and accepted == {"string"} and ["pattern", b.get("pattern")] in excluded:
        return True  # a's strings do not match b's pattern
    if generated == {"array"} and isinstance(a.get("minItems"), int) and a["minItems"] >= 1:
        # a's arrays hold an item, and no item of a's can be an item of b's
        items_a, items_b = a.get("items"), b.get("items")
        positional = "prefixItems" in a or "prefixItems" in b
        if isinstance(items_a, dict) and isinstance(items_b, dict) and not positional and _disjoint(items_a, items_b):
            return True
    if generated != {"object"}:
        return False
    # a's answers hold only a's declared or required names (when it declares any; a property whose
    # schema is false is never generated)
    props = a.get("properties") or {}
    names = {n for n, v in props.items() if v is not False} | set(a.get("required", []))
    added = _dependency_names(a)
    if props and added is not None and any(n not in names | added for n in b.get("required", [])):
        return True
    # a requires a name whose value b's schema for it cannot take
    b_props = b.get("properties") or {}
    for n in a.get("required", []):
        if n in props and n in b_props and _disjoint(props[n], b_props[n]):
            return True
    # a requires a name b does not allow
    if b.get("additionalProperties") is False and not b.get("patternProperties"):
        return any(n not in b_props for n in a.get("required", []))
    return False


def _dependency_names(schema: dict) -> set[str] | None:
    """The names the dependencies of ``schema`` may add to its answers (a required name's are merged
    in, ``_Converter._required_dependency``), or None when a dependency is too involved to tell."""
    names: set[str] = set()
    for key in ("dependencies", "dependentSchemas", "dependentRequired"):
        deps = schema.get(key)
        if not isinstance(deps, dict):
            continue
        for dep in deps.values():
            if isinstance(dep, list):
                names |= {n for n in dep if isinstance(n, str)}
            elif isinstance(dep, dict) and {k for k in dep if _constrains({k: dep[k]})} <= {
                "type",
                "properties",
                "required",
            }:
                names |= set(dep.get("properties") or {}) | {n for n in dep.get("required", []) if isinstance(n, str)}
            elif dep is not False and dep is not True:
                return None
    return names


def _disjoint(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether no value satisfies both: different types, different const/enum values, or a
    discriminator (a property both require, with disjoint schemas). Looks ``MAX_DISJOINT_DEPTH``
    allOf/property levels deep (merged schemas nest allOf: every level tries both sides), and
    answers False (not known) past that."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a is False or b is False
    if depth > MAX_DISJOINT_DEPTH:
        return False
    return _memoized("d", _disjoint_now, a, b, depth)


def _disjoint_now(a: dict, b: dict, depth: int) -> bool:
    # a member of an allOf admits every value the whole does: disjoint from it, the whole is too
    for x, y in ((a, b), (b, a)):
        subs = x.get("allOf")
        if isinstance(subs, list) and any(_disjoint(sub, y, depth + 1) for sub in subs):
            return True
    ta, tb = _types_of(a), _types_of(b)
    shared = None  # the types both admit (None: not known, any)
    if ta is not None and tb is not None:
        wa = ta | ({"integer"} if "number" in ta else set())
        wb = tb | ({"integer"} if "number" in tb else set())
        shared = wa & wb
        if not shared:
            return True
    ka, kb = _value_keys(a), _value_keys(b)
    if ka is not None and kb is not None and not ka & kb:
        return True
    va, vb = values_of(a), values_of(b)
    for values, other in ((va, b), (vb, a)):  # listed values none of which the other admits
        # (_may_admit: by type, length, pattern, 'not' of those values, or the texts a 'not' excludes)
        if values is not None and not any(_may_admit(other, v) for v in values):
            return True
    if shared is None or shared - {"object"}:
        return False  # a discriminator only tells objects apart: any other value passes both
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    for name in set(a.get("required", [])) & set(b.get("required", [])):
        sa, sb = pa.get(name), pb.get(name)
        if isinstance(sa, dict) and isinstance(sb, dict) and _disjoint(sa, sb, depth + 1):
            return True
    return False


def _sequence(heads: list, item, lo: int, hi: int | None) -> tuple:
    """Comma-separated elements, ``lo`` to ``hi`` of them (``hi`` None: unbounded): the ``heads`` in
    order (positional), then ``item`` repeated (``item`` None: nothing after the heads)."""
    n = len(heads)
    if item is None and lo > n:
        raise Unsatisfiable("json_schema: minItems beyond the items allowed")
    if hi is not None and lo > hi:  # (minProperties over maxProperties reaches here unchecked)
        raise Unsatisfiable("json_schema: more elements required than allowed")
    rest: tuple = ("cat", [])
    if item is not None and (hi is None or hi > n):
        rest = ("rep", _cat(_lit(","), item), max(lo - n, 0), None if hi is None else hi - n)
    for k in range(n - 1, 0, -1):  # each head after the first, after a comma; leaving one out ends the list
        node = _cat(_lit(","), heads[k], rest)
        rest = ("rep", node, 0, 1) if k >= lo else node
    if n > 0:
        first = _cat(heads[0], rest)
    elif item is not None and hi != 0:
        return ("list", item, lo, hi)  # item once, not twice (before and after a comma)
    else:
        return ("cat", [])
    return ("rep", first, 0, 1) if lo == 0 else first


def _members(kvs: list[tuple[bool, tuple]], at_least_one: bool = False) -> tuple:
    """The members of an object: the properties in declared order, each optional one present or
    not, comma-separated. Linear in the number of properties.

    Reading left to right, two things matter after property i: whether some property was emitted
    already (the next one then needs a comma) and, if none was, whether that is still allowed (no
    required property was passed). ``some`` is the language of member lists over properties 0..i
    that emitted at least one property, ``none_ok`` whether emitting none is still possible:

        some' = some (,kv_i)?  |  kv_i    (kv_i optional; the second branch only while none_ok)
        some' = some ,kv_i     |  kv_i    (kv_i required; likewise)

    Each step wraps the previous ``some`` once, so the expression (and the automaton built from it)
    grows linearly; enumerating which optional properties appear would be exponential.
    """
    if not kvs:
        return ("cat", [])
    # the regular expression above writes kv_i twice (first member, or after a comma): nested
    # objects then doubled per level in the automaton's construction; the "members" node builds
    # that automaton with each kv_i once (regex.py, _NFA.members)
    return ("members", [(bool(req), kv) for req, kv in kvs], bool(at_least_one))


def _parsed(schema: Any) -> Any:
    if isinstance(schema, (str, bytes)):
        schema = read_json_text(schema, "json_schema")
    _refuse_draft_3(schema)
    try:
        return expand_unevaluated(schema, partial(_written_target, schema))
    except RecursionError:  # a $ref chain through the walk's scopes: the converter refuses such nesting too
        raise ConstraintError("json_schema: nested too deeply") from None


def _written_target(root: Any, ref: Any) -> Any:
    """A local reference's target in the schema as written (ConstraintError for any other)."""
    target = _pointer(root, ref) if isinstance(ref, str) and ref.startswith("#") else _UNRESOLVED
    if target is _UNRESOLVED:
        raise ConstraintError(f"json_schema: $ref {ref!r} is not a local reference that resolves")
    return target


_UNRESOLVED = object()


def _pointer(root: Any, ref: str) -> Any:
    """What the local reference ``ref`` ("#/..."") points at in ``root``, or _UNRESOLVED."""
    node = root
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        # a $ref is a URI: its fragment's pointer is percent-encoded (RFC 6901 section 6,
        # "%3A" for ":"); a name that holds a '%' itself is tried as written first
        decoded = urllib.parse.unquote(part)
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and decoded in node:
            node = node[decoded]
        else:
            return _UNRESOLVED
    return node


# where a schema holds subschemas: one, a list of them, or a map of names to them (``items`` and
# draft 3's ``extends`` take a schema or a list; ``dependencies`` maps to schemas or name lists)
_SUBSCHEMA = {
    "items", "additionalItems", "additionalProperties", "propertyNames", "contains", "not", "if", "then",
    "else", "unevaluatedItems", "unevaluatedProperties", "extends",
}  # fmt: skip
_SUBSCHEMAS = {"allOf", "anyOf", "oneOf", "prefixItems", "items", "extends"}
_SUBSCHEMA_MAP = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
# the draft 3 meta-schemas' addresses, as validators recognise them
_DRAFT_3 = re.compile(r"^https?://json-schema\.org/draft-03/(hyper-)?schema#?$")


def _refuse_draft_3(schema: Any) -> None:
    """Draft 3 means other things by keywords the later drafts share or ignore (``"required": true``
    on a property, ``divisibleBy``, ``extends``, ``disallow``, ``type: "any"``): a schema or subschema
    whose ``$schema`` names it would be served under the wrong rules, so it is refused. Validators
    (``jsonschema`` among them) apply a subschema's own ``$schema``, so every subschema is looked
    at: those under the keywords that hold subschemas and those local references point at. What
    other keywords hold (values, annotations, ``x-*``) is not a schema to a validator."""
    stack, seen = [schema], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        declared = node.get("$schema")
        if isinstance(declared, str) and _DRAFT_3.match(declared):
            raise ConstraintError(
                f"json_schema: $schema {declared!r} is draft 3, which is not supported (its 'required': true, "
                "'divisibleBy', 'extends' and 'disallow' mean what later drafts do not); rewrite the schema "
                "for draft 4 or later and name that draft"
            )
        for key, value in node.items():
            if key in _SUBSCHEMA and isinstance(value, dict):
                stack.append(value)
            if key in _SUBSCHEMAS and isinstance(value, list):
                stack.extend(value)
            if key in _SUBSCHEMA_MAP and isinstance(value, dict):
                stack.extend(value.values())
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                stack.append(_pointer(schema, value))


def _convert(converter: _Converter, schema: Any) -> tuple:
    try:
        return converter.convert(schema)
    except RecursionError:
        raise ConstraintError("json_schema: nested too deeply") from None
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError):
        # a keyword holding a value of another type than JSON Schema gives it (the metaschema check, which names
        # it, is skipped for a very large schema and never runs on the constraint keys), or a number past what a
        # float holds: the client's schema, not a server fault; logged, as a converter bug would look the same
        log.warning("json_schema: a schema failed to convert", exc_info=True)
        raise ConstraintError(
            "json_schema: a keyword holds a value of the wrong type, or a number out of range: check the schema "
            "against its metaschema"
        ) from None


def schema_to_ast(schema, *, if_chains: bool = True) -> tuple:
    schema = _parsed(schema)
    return _convert(_Converter(schema, if_chains), schema)


def schema_words(schema, *, started: float | None = None) -> np.ndarray:
    """The schema's tree serialised for the core (``regex.ast_words``), what an automaton built as it
    is walked (``regex.lazy_words``) or a whole one (``regex.compile_words``) is built from, within
    the compile time budget counted from ``started``. References are inlined, not built into
    automata of their own (EMBED_AT): an embedded automaton is a whole construction, where an inlined
    tree costs NFA states, built in linear time, and only the states walks reach are built. When the
    inlined tree is over the NFA state limit, references are embedded as ``schema_to_dfa`` embeds
    them. There is no narrower subset here (schema_to_dfa's last try, past the limits or MAX_DEPTH):
    a schema that needs one is refused (``too_large`` says which refusals a caller may retry with
    ``schema_to_dfa``)."""
    schema = _parsed(schema)
    started = time.monotonic() if started is None else started
    inlined = _Converter(schema, started=started, embed_at=None)
    try:
        return ast_words(_convert(inlined, schema), started=started, sizes=inlined.size_memo())
    except ConstraintError as exc:
        if not too_large(exc) or "time budget" in exc.message:
            raise
    embedding = _Converter(schema, started=started)
    return ast_words(_convert(embedding, schema), started=started, sizes=embedding.size_memo())


def schema_to_lazy(schema, *, started: float | None = None) -> core.LazyDfa:
    """The schema's automaton built as it is walked: ``regex.lazy_words`` of ``schema_words``."""
    started = time.monotonic() if started is None else started
    return lazy_words(schema_words(schema, started=started), started=started)


def too_large(exc: ConstraintError) -> bool:
    """Whether a narrower subset may fit where ``exc`` refused: the limits, and nesting (recursion
    unrolled MAX_RECURSION levels deep nests the converter that many times over)."""
    return any(
        what in exc.message
        for what in ("constraint too large", "time budget", f"nesting deeper than {MAX_DEPTH}", "nested too deeply")
    )


def schema_to_dfa(schema, backend: str = "native", *, started: float | None = None, build=compile_ast) -> ByteDFA:
    """The schema's automaton, within one compile time budget, trying narrower subsets when it is
    too large or too slow:

    1. as converted, within the first WIDE_SHARE of the budget; when an if-chain (``_if_chain``) is
       in use, which copies the object around it once per ``if``, within half of that;
    2. after an if-chain, holding every ``if`` at once (the narrower subset), within the first
       WIDE_SHARE of the budget too;
    3. the NARROW_* subset (unconstrained values, recursion and long maxLength made smaller), within
       what is left of the budget, also when the tries above nested deeper than MAX_DEPTH: refused,
       as the wider tries were, when that is too large too. A schema too large for the first tries
       thus still has at least the rest of the budget for its subset.

    ``build``: the whole automaton's builder, called as ``regex.compile_ast`` is (with the converter's
    ``sizes`` memo); the automata embedded along the way are built by ``regex.compile_words``."""
    schema = _parsed(schema)
    started = time.monotonic() if started is None else started
    # the schema as given gets WIDE_SHARE of the budget (half of it with an if-chain, which has a
    # second try), so that a schema too large for it is still built narrowed in the rest: "started"
    # earlier by the rest (the embedded automata the converter builds count against it too)
    budget_s = limits().compile_ms / 1000
    wide_started = started - (1 - WIDE_SHARE) * budget_s
    converter = _Converter(schema, started=wide_started)
    try:
        ast = _convert(converter, schema)
        at = wide_started if not converter.chained else wide_started - WIDE_SHARE / 2 * budget_s
        return build(ast, backend, started=at, sizes=converter.size_memo())
    except ConstraintError as exc:
        if not too_large(exc):
            raise
        first = exc
    if converter.chained:
        try:
            unchained = _Converter(schema, False, wide_started)
            ast = _convert(unchained, schema)
            return build(ast, backend, started=wide_started, sizes=unchained.size_memo())
        except ConstraintError as exc:
            if not too_large(exc):
                raise
            first = exc
    if time.monotonic() - started > limits().compile_ms / 1000:
        raise first  # no time left to try: the first refusal says why
    try:
        narrow = _Converter(schema, False, started, narrow=True)
        narrowed = build(_convert(narrow, schema), backend, started=started, sizes=narrow.size_memo())
    except ConstraintError:
        # the schema as the client sent it is what the refusal names (its size), not the subset
        raise first from None
    # answers stay valid, but the language is smaller than the schema's: an operator must be able to see it
    log.warning(
        "constraint: the schema's automaton is over the limit (%s); serving its narrower subset: free-form values "
        "%d level deep, no recursion, strings at most %d characters where maxLength allows more",
        first.message.splitlines()[0],
        NARROW_ANY_DEPTH,
        NARROW_MAX_LENGTH,
    )
    return narrowed
