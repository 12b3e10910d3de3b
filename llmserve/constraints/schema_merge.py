"""The conjunction of two JSON schemas as one schema: how ``allOf`` and the branches of
``anyOf``/``oneOf`` combine with the keywords beside them.

``{**parent, **branch}`` is wrong: a branch would overwrite the parent's ``properties`` or
``required`` and the answer could fail the parent. A value must satisfy *both*, so each keyword
combines by its meaning: types intersect, ``required`` unites, lower bounds take the larger, upper
bounds the smaller, ``properties`` merge per name (recursively), patterns accumulate (all must
match), enums intersect, two ``anyOf`` (or two ``oneOf``) become one over every pair of their
branches (exact for ``oneOf`` too: ``_merge_keyword``), ``dependencies`` and ``patternProperties``
(without ``additionalProperties``) merge per name or pattern (one side's patterns, the other side
having none, also follow that side's ``additionalProperties``), two ``format`` both hold, item schemas per position (``_merge_positions``), several ``contains`` all hold (``CONTAINS``). Two
different values of any other keyword cannot be combined here and are refused, naming the keyword. Schemas that admit no value at all raise ``Unsatisfiable``: in an
``anyOf`` or ``oneOf`` that branch is dropped (it matches no value).
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmserve.constraints.errors import ConstraintError

TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
# several ``contains`` that must all hold (the converter's: JSON Schema's keyword takes one schema)
CONTAINS = "x-llmserve-contains"
_DEPENDENCIES = ("dependencies", "dependentSchemas", "dependentRequired")
_LOWER = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_UPPER = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")


# the keywords that take part in validation; any other (title, description, x-*, ...) only
# annotates, and two different values of it are no conflict (the first is kept)
VALIDATION_KEYWORDS = frozenset(
    [
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "format",
        "items",
        "prefixItems",
        "additionalItems",
        "maxItems",
        "minItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "maxProperties",
        "minProperties",
        "required",
        "properties",
        "patternProperties",
        "additionalProperties",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "$ref",
        "unevaluatedItems",
        "unevaluatedProperties",
        "nullable",
        "$dynamicRef",
        "$recursiveRef",
    ]
)


class Unsatisfiable(ConstraintError):
    """No JSON value satisfies the combined schema."""

    code = "unsatisfiable-schema"
    default_hint = "Check the schema: its keywords (or allOf/anyOf branches) contradict each other."


def types_of(schema: dict) -> set[str] | None:
    """The schema's ``type`` as a set (None: any type)."""
    typ = schema.get("type")
    if typ is None:
        return None
    out = {typ} if isinstance(typ, str) else set(typ) if isinstance(typ, list) else None
    if out is None or not out <= set(TYPES):
        raise ConstraintError(f"json_schema: bad type {typ!r}")
    return out


def _meet_types(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    if a is None or b is None:
        return b if a is None else a
    out = a & b
    if ("integer" in a and "number" in b) or ("number" in a and "integer" in b):
        out.add("integer")  # every integer is a number
    if not out:
        raise Unsatisfiable(f"json_schema: types {sorted(a)} and {sorted(b)} have no value in common")
    return out


def canonical(value: Any) -> str:
    """JSON equality as JSON Schema defines it (1 == 1.0; key order does not matter)."""

    def norm(v):
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            return float(v) if isinstance(v, float) and not v.is_integer() else int(v)
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v

    if isinstance(value, str):
        return _encode_str(value)  # what the encoder writes for a string
    return _CANONICAL.encode(norm(value))


# json.dumps(value, sort_keys=True, separators=(",", ":")) with one encoder for every call (dumps
# builds an encoder per call, most of canonical's time in a pairwise oneOf analysis)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_encode_str = json.encoder.encode_basestring_ascii


def values_of(schema: dict) -> list | None:
    """``const`` / ``enum`` as a list of values (None: neither)."""
    if "const" in schema:
        values = [schema["const"]]
        if "enum" in schema:
            allowed = {canonical(v) for v in _enum(schema)}
            values = [v for v in values if canonical(v) in allowed]
        return values
    if "enum" in schema:
        return _enum(schema)
    return None


def _enum(schema: dict) -> list:
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise ConstraintError("json_schema: enum must be a non-empty list")
    return values


def _patterns(schema: dict) -> list[str]:
    p = schema.get("pattern")
    return [] if p is None else list(p) if isinstance(p, list) else [p]


def both(a: Any, b: Any) -> Any:
    """Nested conjunction, left for the converter to resolve when it reaches it (either side may
    still hold a ``$ref`` or an ``allOf``)."""
    if a is False or b is False:
        return False
    if a is None or a is True or a == {}:
        return b
    if b is None or b is True or b == {}:
        return a
    return {"allOf": [a, b]}


def _merge_properties(a: dict, b: dict, out: dict) -> None:
    """Names declared by one side must also satisfy the other side's ``additionalProperties``."""
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    if not pa and not pb:
        return
    required = set(out.get("required", []))
    merged: dict[str, Any] = {}
    for name in [*pa, *(n for n in pb if n not in pa)]:
        sides = []
        for mine, other, other_props in ((pa, b, pb), (pb, a, pa)):
            if name in mine:
                sides.append(mine[name])
                if name in other_props:
                    continue
                # the other side's patterns it matches value it there, not its additionalProperties
                matching = [v for p, v in (other.get("patternProperties") or {}).items() if _search(p, name)]
                if matching:
                    sides += matching
                elif "additionalProperties" in other:
                    sides.append(other["additionalProperties"])
        schema: Any = sides[0]
        for s in sides[1:]:
            schema = both(schema, s)
        if schema is False and name in required and types_of(out) == {"object"}:
            # only objects fail it: every other type still satisfies both sides
            raise Unsatisfiable(f"json_schema: required property {name!r} is not allowed by additionalProperties")
        # a name no value is allowed for stays declared as false: dropped, it would be valued by the
        # merged additionalProperties (any value, unless that is false)
        merged[name] = schema
    out["properties"] = merged


def _search(pattern: Any, name: str) -> bool:
    """Whether a patternProperties pattern matches a declared name (as ``jsonschema._search``)."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"json_schema: patternProperties pattern {pattern!r} must be a string")
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise ConstraintError(f"json_schema: patternProperties {pattern!r}: {exc}") from None


def _merge_pattern_sides(a: dict, b: dict, out: dict) -> None:
    """Names one side's ``patternProperties`` match are additional on the other side when it has no
    patterns: their values must also satisfy its ``additionalProperties`` (the merged schema's
    ``additionalProperties`` no longer reaches them, the patterns do)."""
    for mine, other in ((a, b), (b, a)):
        patterns = mine.get("patternProperties")
        if not isinstance(patterns, dict) or not patterns or other.get("patternProperties"):
            continue
        extra = other.get("additionalProperties", True)
        if extra is True or extra == {}:
            continue
        declared = [n for n in other.get("properties") or {} if any(_search(p, n) for p in patterns)]
        if not declared:
            out["patternProperties"] = {p: both(s, extra) for p, s in patterns.items()}
            continue
        # a name the other side declares is not additional there, yet the converter applies every
        # pattern a declared name matches: additionalProperties goes to a second pattern per
        # pattern that leaves those names out (a name matching both follows both schemas)
        names = "|".join(re.escape(n) for n in declared)
        out["patternProperties"] = {
            **patterns,
            **{f"^(?!(?:{names})$)[\\s\\S]*(?:{p})": extra for p in patterns},
        }


def merge(a: Any, b: Any) -> dict:
    """A schema whose values are exactly those satisfying both ``a`` and ``b`` (both already free
    of ``$ref`` and ``allOf`` at the top; nested ones are left as ``allOf`` for the converter)."""
    if a is True or a == {}:
        return b if isinstance(b, dict) else {}
    if b is True or b == {}:
        return a if isinstance(a, dict) else {}
    if a is False or b is False:
        raise Unsatisfiable("json_schema: a false schema admits no value")
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise ConstraintError("json_schema: a schema must be an object or a boolean")
    out = dict(a)
    positional = _positional(a) or _positional(b)
    for key, value in b.items():
        if positional and key in _ITEMS:
            continue  # _merge_positions below
        if key not in out:
            out[key] = value
        elif key not in ("properties", "const", "enum", "contains", CONTAINS):  # those below
            out[key] = _merge_keyword(key, out[key], value, a, b)
    if positional:
        _merge_positions(a, b, out)
    _merge_pattern_sides(a, b, out)
    _merge_properties(a, b, out)
    _merge_contains(a, b, out)
    values_a, values_b = values_of(a), values_of(b)
    if values_a is not None and values_b is not None:
        allowed = {canonical(v) for v in values_b}
        kept = [v for v in values_a if canonical(v) in allowed]
        if not kept:
            raise Unsatisfiable("json_schema: enum/const values have nothing in common")
        out.pop("const", None)
        out["enum"] = kept
    if out.get("type", "") is None:
        del out["type"]
    return out


_ITEMS = ("items", "prefixItems", "additionalItems")


def _positional(schema: dict) -> bool:
    return isinstance(schema.get("prefixItems"), list) or isinstance(schema.get("items"), list)


def _positions(schema: dict) -> tuple[list, Any]:
    """An array schema's item schemas by position: the leading ones (``prefixItems``, or draft 4's
    ``items`` list) and the one every later item follows (``items`` after them, ``additionalItems``)."""
    items = schema.get("items")
    if isinstance(schema.get("prefixItems"), list):
        return list(schema["prefixItems"]), True if items is None or isinstance(items, list) else items
    if isinstance(items, list):
        return list(items), schema.get("additionalItems", True)
    return [], True if items is None else items


def _merge_positions(a: dict, b: dict, out: dict) -> None:
    """``items``/``prefixItems`` of two schemas of which one is positional: each position follows
    both sides' schema for it (``{**a, **b}`` would let one side's leading items skip the other's
    ``items``); written as ``prefixItems`` and ``items`` after them."""
    (pa, ra), (pb, rb) = _positions(a), _positions(b)
    prefix = [both(pa[k] if k < len(pa) else ra, pb[k] if k < len(pb) else rb) for k in range(max(len(pa), len(pb)))]
    for key in _ITEMS:
        out.pop(key, None)
    out["prefixItems"] = prefix
    rest = both(ra, rb)
    if rest is not True:
        out["items"] = rest


def _contains_list(schema: dict) -> list:
    return ([schema["contains"]] if "contains" in schema else []) + list(schema.get(CONTAINS, []))


def _merge_contains(a: dict, b: dict, out: dict) -> None:
    """Each ``contains`` of both sides must hold: one is kept as ``contains``, several as the list
    ``CONTAINS`` (an array with an item matching each)."""
    found: dict[str, Any] = {}
    for sub in [*_contains_list(a), *_contains_list(b)]:
        found.setdefault(canonical(sub), sub)
    out.pop("contains", None)
    out.pop(CONTAINS, None)
    if len(found) == 1:
        out["contains"] = next(iter(found.values()))
    elif found:
        out[CONTAINS] = list(found.values())


def _merge_dependencies(key: str, mine: dict, value: dict) -> dict:
    """Two ``dependencies`` (or ``dependentRequired``/``dependentSchemas``): per name, both hold; two
    lists of names unite, a list with a schema is that schema and ``required`` of the list."""
    out = dict(mine)
    for name, dep in value.items():
        if name not in out:
            out[name] = dep
        elif isinstance(out[name], list) and isinstance(dep, list):
            out[name] = list(dict.fromkeys([*out[name], *dep]))
        elif key == "dependentRequired":
            raise ConstraintError(f"json_schema: {key} of {name!r} must be a list of names")
        else:
            out[name] = both(_dependency_schema(out[name]), _dependency_schema(dep))
    return out


def _dependency_schema(dep: Any) -> Any:
    return {"required": dep} if isinstance(dep, list) else dep


def _merge_named(key: str, mine: Any, value: Any, a: dict, b: dict) -> Any:
    """Two ``format``, ``patternProperties`` or dependencies (``_merge_keyword``)."""
    if key == "format" and isinstance(mine, (str, list)) and isinstance(value, (str, list)):
        # both hold: the converter intersects the formats it knows (the others are annotations)
        formats = list(dict.fromkeys([*_as_list(mine), *_as_list(value)]))
        return formats[0] if len(formats) == 1 else formats
    if key == "patternProperties" and isinstance(mine, dict) and isinstance(value, dict):
        if a.get("additionalProperties", True) is not True or b.get("additionalProperties", True) is not True:
            # one side's additionalProperties covers the names the other side's patterns match
            return _same(key, mine, value)
        # a name matching patterns of both sides follows every one of their schemas (the converter
        # applies each matching pattern)
        return {**mine, **{p: both(mine[p], v) if p in mine else v for p, v in value.items()}}
    if key in _DEPENDENCIES and isinstance(mine, dict) and isinstance(value, dict):
        return _merge_dependencies(key, mine, value)
    return _same(key, mine, value)


def _merge_keyword(key: str, mine: Any, value: Any, a: dict, b: dict) -> Any:
    """The conjunction of one keyword's two values (``a`` and ``b``: the schemas they come from)."""
    if key in ("format", "patternProperties", *_DEPENDENCIES):
        return _merge_named(key, mine, value, a, b)
    if key == "type":
        return sorted(_meet_types(types_of(a), types_of(b)) or []) or None
    if key == "required":
        return list(dict.fromkeys([*mine, *value]))
    if key in _LOWER and not isinstance(mine, bool) and not isinstance(value, bool):
        return max(mine, value)
    if key in _UPPER and not isinstance(mine, bool) and not isinstance(value, bool):
        return min(mine, value)
    if key == "pattern":
        return list(dict.fromkeys([*_patterns(a), *_patterns(b)]))
    if key == "contentSchema":  # a string's JSON text (jsonschema._json_content): valid against both
        return both(mine, value)
    if key in ("items", "additionalItems", "additionalProperties"):
        return both(mine, value) if key == "additionalProperties" or isinstance(mine, dict) else _same(key, mine, value)
    if key == "anyOf":
        # (A1 | A2) & (B1 | B2): every pair, as an anyOf of the two lists' conjunctions
        return [{"allOf": [x, y]} for x in mine for y in value]
    if key == "oneOf":
        # oneOf(A1..An) & oneOf(B1..Bm) == oneOf(Ai & Bj over every pair), exactly: a value satisfies
        # |{i: v in Ai}| * |{j: v in Bj}| of the pairs, and a product of two counts is 1 only when
        # both are 1. The converter's oneOf then keeps the pairs it can tell apart, as for any oneOf.
        return [{"allOf": [x, y]} for x in mine for y in value]
    if key == "not":  # not A and not B: not (A or B)
        return {"anyOf": [mine, value]}
    if key in ("x-llmserve-not", "x-llmserve-absent"):  # the converter's, from a 'not': both hold
        return [*mine, *(v for v in value if v not in mine)]
    if key not in VALIDATION_KEYWORDS:
        return mine
    return _same(key, mine, value)


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list) else [value]


def _same(key: str, a: Any, b: Any) -> Any:
    if canonical(a) != canonical(b):
        raise ConstraintError(f"json_schema: allOf with two different values of {key!r} is not supported")
    return a
