"""JSON Schema (the common subset) to a regular language over compact JSON.

Output is compact JSON (no whitespace between tokens, ``,`` and ``:`` separators) with object
properties in the schema's order; optional properties may be left out. Compactness matters on a
random or weak model: with whitespace allowed, it can emit whitespace until ``max_tokens``.

Supported: ``type`` string/number/integer/boolean/null/object/array (or a list of those), ``enum``,
``const``, ``properties`` + ``required``, ``items`` with ``minItems``/``maxItems``, string
``minLength``/``maxLength``/``pattern``/``format`` (date, date-time, time, email, uuid), ``anyOf``/``oneOf``,
non-recursive ``$ref`` into ``$defs``/``definitions``, nesting. Anything else that would change the
accepted language is rejected with a ``ConstraintError`` rather than ignored.

Generated objects hold only the declared properties, whatever ``additionalProperties`` says (as in
OpenAI's strict mode and xgrammar's default): the language is a subset of what the schema accepts,
so every output still validates. llguidance, by contrast, follows the JSON Schema default and lets
a model add undeclared properties when ``additionalProperties`` is absent.
"""

from __future__ import annotations

import json

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.regex import literal, parse

MAX_DEPTH = 32

_STR_CHAR = (
    "alt",
    [
        ("set", [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]),
        (
            "cat",
            [
                ("set", [(0x5C, 0x5C)]),
                (
                    "alt",
                    [
                        ("set", [(ord(c), ord(c)) for c in '"\\/bfnrt']),
                        (
                            "cat",
                            [("set", [(ord("u"), ord("u"))])]
                            + [("set", [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)])] * 4,
                        ),
                    ],
                ),
            ],
        ),
    ],
)
_QUOTE = ("set", [(0x22, 0x22)])
_INT = parse(r"-?(0|[1-9][0-9]{0,15})")
_NUMBER = parse(r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?")
_FORMATS = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "time": r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?",
    "date-time": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
    "email": r"[a-zA-Z0-9_.+-]{1,64}@[a-zA-Z0-9-]{1,63}(\.[a-zA-Z0-9-]{1,63}){1,4}",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
}
# keywords that only annotate (never change the language); additionalProperties only widens it,
# and generation stays within the declared properties (see the module doc)
_ANNOTATIONS = {
    "title",
    "description",
    "examples",
    "default",
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "deprecated",
    "readOnly",
    "writeOnly",
    "additionalProperties",
}


def _cat(*items):
    return ("cat", list(items))


def _lit(text):
    return literal(text)


class _Converter:
    def __init__(self, root: dict):
        self.root = root
        # $ref -> its converted tree, built once and shared by every use: a schema whose references
        # fan out (A uses B twice, B uses C twice, ...) costs its size to convert, not 2^depth.
        # The expanded size (each use counts) is bounded before anything is built (regex.compile_ast).
        self.converted: dict[str, tuple] = {}

    def fail(self, what: str) -> ConstraintError:
        return ConstraintError(f"json_schema: {what}")

    def resolve(self, ref: str):
        if not ref.startswith("#/"):
            raise self.fail(f"only local $ref is supported, got {ref!r}")
        node = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise self.fail(f"$ref {ref!r} does not resolve")
            node = node[part]
        return node

    def convert(self, schema, depth: int = 0, refs: tuple[str, ...] = ()):
        self._check_node(schema, depth)
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in refs:
                raise self.fail(f"recursive $ref {ref!r} is not supported")
            if ref not in self.converted:
                self.converted[ref] = self.convert(self.resolve(ref), depth + 1, (*refs, ref))
            return self.converted[ref]
        if "const" in schema or "enum" in schema:
            return self._values(schema)
        combined = self._combination(schema, depth, refs)
        if combined is not None:
            return combined
        typ = schema.get("type")
        if isinstance(typ, list):
            return ("alt", [self.convert({**schema, "type": t}, depth + 1, refs) for t in typ])
        typ = self._implied_type(schema) if typ is None else typ
        handler = getattr(self, "_" + str(typ), None)
        if handler is None:
            raise self.fail(f"unsupported type {typ!r}")
        return handler(schema, depth, refs)

    def _check_node(self, schema, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        if schema is True or schema == {}:
            raise self.fail("an unconstrained value ({} or true) is not a regular language; give it a type")
        if not isinstance(schema, dict):
            raise self.fail(f"schema must be an object, got {type(schema).__name__}")

    def _values(self, schema: dict):
        """``const`` or ``enum``: the listed JSON values, compact."""
        if "const" in schema:
            return _lit(json.dumps(schema["const"], separators=(",", ":"), ensure_ascii=False))
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise self.fail("enum must be a non-empty list")
        return ("alt", [_lit(json.dumps(v, separators=(",", ":"), ensure_ascii=False)) for v in values])

    def _combination(self, schema: dict, depth: int, refs: tuple[str, ...]):
        """``anyOf``/``oneOf`` (each branch with the rest of the schema), or None when neither is there."""
        for key in ("anyOf", "oneOf"):
            if key in schema:
                subs = schema[key]
                if not isinstance(subs, list) or not subs:
                    raise self.fail(f"{key} must be a non-empty list")
                base = {k: v for k, v in schema.items() if k != key}
                return ("alt", [self.convert({**base, **s}, depth + 1, refs) for s in subs])
        if "allOf" in schema:
            raise self.fail("allOf is not supported")
        return None

    def _implied_type(self, schema: dict) -> str:
        if "properties" in schema:
            return "object"
        if "items" in schema:
            return "array"
        raise self.fail(f"schema without a type: {json.dumps(schema)[:80]}")

    def _check(self, schema, allowed):
        extra = set(schema) - allowed - _ANNOTATIONS - {"type"}
        if extra:
            raise self.fail(f"unsupported keyword(s) {sorted(extra)} for type {schema.get('type')!r}")

    def _null(self, schema, depth, refs):
        self._check(schema, set())
        return _lit("null")

    def _boolean(self, schema, depth, refs):
        self._check(schema, set())
        return ("alt", [_lit("true"), _lit("false")])

    def _integer(self, schema, depth, refs):
        self._check(schema, set())
        return _INT

    def _number(self, schema, depth, refs):
        self._check(schema, set())
        return _NUMBER

    def _string(self, schema, depth, refs):
        self._check(schema, {"minLength", "maxLength", "pattern", "format"})
        if "pattern" in schema:
            pat = schema["pattern"]
            if pat.startswith("^"):
                pat = pat[1:]
            if pat.endswith("$") and not pat.endswith("\\$"):
                pat = pat[:-1]
            return _cat(_QUOTE, parse(pat), _QUOTE)
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in _FORMATS:
                raise self.fail(f"unsupported string format {fmt!r} (supported: {sorted(_FORMATS)})")
            return _cat(_QUOTE, parse(_FORMATS[fmt]), _QUOTE)
        lo = int(schema.get("minLength", 0))
        hi = schema.get("maxLength")
        hi = None if hi is None else int(hi)
        if lo < 0 or (hi is not None and hi < lo):
            raise self.fail("bad minLength/maxLength")
        return _cat(_QUOTE, ("rep", _STR_CHAR, lo, hi), _QUOTE)

    def _array(self, schema, depth, refs):
        self._check(schema, {"items", "minItems", "maxItems"})
        items = schema.get("items")
        if not isinstance(items, dict):
            raise self.fail("arrays need an 'items' schema")
        item = self.convert(items, depth + 1, refs)
        lo = int(schema.get("minItems", 0))
        hi = schema.get("maxItems")
        hi = None if hi is None else int(hi)
        if lo < 0 or (hi is not None and hi < lo):
            raise self.fail("bad minItems/maxItems")
        if hi == 0:
            return _lit("[]")
        more = ("rep", _cat(_lit(","), item), max(lo - 1, 0), None if hi is None else hi - 1)
        body = _cat(item, more)
        if lo == 0:
            body = ("rep", body, 0, 1)
        return _cat(_lit("["), body, _lit("]"))

    def _object(self, schema, depth, refs):
        self._check(schema, {"properties", "required"})
        props = schema.get("properties") or {}
        if not props:
            raise self.fail("objects need 'properties' (a free-form object is not a regular language)")
        required = set(schema.get("required", []))
        unknown = required - set(props)
        if unknown:
            raise self.fail(f"required names unknown properties {sorted(unknown)}")
        kvs = [
            (
                name in required,
                _cat(_lit(json.dumps(name, ensure_ascii=False) + ":"), self.convert(sub, depth + 1, refs)),
            )
            for name, sub in props.items()
        ]
        return _cat(_lit("{"), _members(kvs), _lit("}"))


def _members(kvs: list[tuple[bool, tuple]]) -> tuple:
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
    some: tuple | None = None
    none_ok = True
    for req, kv in kvs:
        branches = []
        if some is not None:
            after = _cat(_lit(","), kv)
            branches.append(_cat(some, after if req else ("rep", after, 0, 1)))
        if none_ok:
            branches.append(kv)
        some = branches[0] if len(branches) == 1 else ("alt", branches)
        none_ok = none_ok and not req
    if some is None:
        return ("cat", [])
    return ("rep", some, 0, 1) if none_ok else some


def schema_to_ast(schema) -> tuple:
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"json_schema is not valid JSON: {exc}") from None
    return _Converter(schema).convert(schema)
