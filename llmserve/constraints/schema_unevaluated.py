"""``unevaluatedProperties`` and ``unevaluatedItems`` (2019-09, 2020-12) as keywords the converter implements.

Both apply to what the schema object holding them, with the subschemas applied in place, did not evaluate. Where
those in-place subschemas are only ``$ref`` and ``allOf`` (applied unconditionally: every name or position they
declare is evaluated), what is evaluated is known without the instance: the property names and patterns they
declare (all names, where one holds ``additionalProperties``; with ``patternProperties`` the keyword is left as it
is), and the first positions of their ``prefixItems``
(all positions, where one holds ``items``). The keyword is then one more ``allOf`` member: those names, patterns or
positions taken as they are, everything else valued by the keyword's schema, which the converter merges as any
other (a member that is itself a ``$ref`` target keeps its own scope: its names do not cover the names its parent
adds, as the specification reads it).

Where a conditional subschema is applied in place (``anyOf``, ``oneOf``, ``if``/``then``/``else``, ``not``,
``dependentSchemas``, or ``contains`` for items), what it evaluates depends on the instance: the keyword is left as
it is, and the converter refuses it by name. ``true`` and ``{}`` never fail and are dropped.

The schema is rewritten as the client wrote it, before the converter merges anything: once merged, a name can no
longer be told from one a ``not`` or a failed branch declared, which evaluate nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.schema_walk import SUBSCHEMA_KEYWORDS

# in-place applicators whose evaluation depends on the instance (and the dynamic references, which this cannot
# follow)
_CONDITIONAL = frozenset(
    {"anyOf", "oneOf", "if", "then", "else", "not", "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef"}
)


def expand_unevaluated(root: Any, resolve: Callable[[str], Any]) -> Any:
    """``root`` with every schema object's unevaluated keywords rewritten (``without_unevaluated``), children
    first; the same object where nothing changed (a walk of the keys present, copying nothing: a 5 MB schema
    without the keywords costs it tens of milliseconds, not a copy). ``resolve`` reads references in the schema as
    written. ``prefixItems`` evaluates positions in 2020-12 only (the default dialect): under an older ``$schema``
    it is an unknown keyword, and an ``unevaluatedItems`` beside one is left to be refused."""
    dialect = root.get("$schema") if isinstance(root, dict) else None
    prefix_items = not isinstance(dialect, str) or "2020-12" in dialect

    def walk(node: Any, depth: int) -> Any:
        if not isinstance(node, dict) or depth > _MAX_WALK:
            return node  # deeper than the converter goes: it refuses the schema by itself
        changed: dict[str, Any] | None = None
        for key, held in node.items():
            kind = SUBSCHEMA_KEYWORDS.get(key)
            if kind is None:
                continue
            new = _walk_held(kind, held, walk, depth + 1)
            if new is not held:
                changed = changed or {}
                changed[key] = new
        if changed is not None:
            node = {**node, **changed}
        if "unevaluatedProperties" in node or "unevaluatedItems" in node:
            return without_unevaluated(node, resolve, prefix_items)
        return node

    return walk(root, 0)


def _walk_held(kind: str, held: Any, walk: Callable[[Any, int], Any], depth: int) -> Any:
    """A keyword's value with its subschemas walked; the same object where none changed."""
    entries: Any
    copy: Callable[[Any], Any]
    if kind == "map" and isinstance(held, dict):
        entries, copy = held.items(), dict
    elif isinstance(held, list) and kind in ("list", "one_or_list"):
        entries, copy = enumerate(held), list
    else:
        return walk(held, depth) if isinstance(held, dict) and kind in ("one", "one_or_list") else held
    out: Any = None
    for at, sub in entries:
        new = walk(sub, depth)
        if new is not sub:
            out = out if out is not None else copy(held)
            out[at] = new
    return held if out is None else out


# deeper than the converter nests (it refuses past 32 levels), two Python frames a level: far within the recursion limit
_MAX_WALK = 200


def without_unevaluated(
    schema: dict[str, Any], resolve: Callable[[str], Any], prefix_items: bool = True
) -> dict[str, Any]:
    """``schema`` with its ``unevaluatedProperties``/``unevaluatedItems`` made into an ``allOf`` member where what
    they apply to is known (module doc); unchanged where it is not. ``resolve``: a local ``$ref`` -> its schema
    (raising for one it cannot follow, which leaves the keyword to be refused). One that never fails is replaced
    by ``additionalProperties``/``items`` true, which say to a parent's scope what it said: every name or position
    is evaluated here."""
    if "unevaluatedProperties" not in schema and "unevaluatedItems" not in schema:
        return schema
    try:
        scope = _in_place(schema, resolve)
    except ConstraintError:  # a reference the converter refuses by itself, with its own message
        return schema
    if scope is None or ("unevaluatedProperties" in schema and any("patternProperties" in s for s in scope)):
        # patterns would be a second patternProperties beside the schema's own, which merging does not take
        return schema
    out = dict(schema)
    members = list(out.get("allOf", [])) if isinstance(out.get("allOf"), list) else None
    if members is None and "allOf" in out:
        return schema  # a malformed allOf: the converter names it
    added = []
    scope = scope[1:]  # what the schema itself declares is read from `out`, below
    own = [out]
    if "unevaluatedProperties" in out:
        value = out.pop("unevaluatedProperties")
        if _never_fails(value):
            out.setdefault("additionalProperties", True)
        elif (member := _properties_member(value, own + scope)) is not None:
            added.append(member)
    if "unevaluatedItems" in out:
        if any("contains" in s or (not prefix_items and "prefixItems" in s) for s in own + scope):
            return schema
        value = out.pop("unevaluatedItems")
        if _never_fails(value):
            out.setdefault("additionalItems" if isinstance(out.get("items"), list) else "items", True)
        elif (member := _items_member(value, own + scope)) is not None:
            added.append(member)
    if added:
        out["allOf"] = [*(members or []), *added]
    return out


def _in_place(schema: dict[str, Any], resolve: Callable[[str], Any]) -> list[dict[str, Any]] | None:
    """The schema objects applied in place at ``schema`` (itself, its ``$ref`` targets and ``allOf`` members, and
    theirs), or None when one of them holds a conditional applicator."""
    found: list[dict[str, Any]] = []
    seen: set[int] = set()
    todo: list[Any] = [schema]
    while todo:
        node = todo.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        if _CONDITIONAL & node.keys():
            return None
        found.append(node)
        if isinstance(node.get("$ref"), str):
            todo.append(resolve(node["$ref"]))
        if isinstance(node.get("allOf"), list):
            todo.extend(node["allOf"])
    return found


def _never_fails(value: Any) -> bool:
    return value is True or value == {}


def _properties_member(value: Any, scope: list[dict[str, Any]]) -> dict[str, Any] | None:
    if any("additionalProperties" in s or "unevaluatedProperties" in s for s in scope):
        return None  # every name is evaluated (by the other keyword, in the schema or a member of its scope)
    names: dict[str, Any] = {}
    for s in scope:
        if isinstance(s.get("properties"), dict):
            names.update((name, {}) for name in s["properties"])
    member: dict[str, Any] = {"additionalProperties": value}
    if names:
        member["properties"] = names
    return member


def _items_member(value: Any, scope: list[dict[str, Any]]) -> dict[str, Any] | None:
    evaluated = 0
    for s in scope:
        items = s.get("items")
        if (items is not None and not isinstance(items, list)) or "unevaluatedItems" in s:
            return None  # every position is evaluated
        if isinstance(items, list):  # 2019-09's tuple form
            if "additionalItems" in s:
                return None
            evaluated = max(evaluated, len(items))
        if isinstance(s.get("prefixItems"), list):
            evaluated = max(evaluated, len(s["prefixItems"]))
    member: dict[str, Any] = {"items": value}
    if evaluated:
        member["prefixItems"] = [{} for _ in range(evaluated)]
    return member
