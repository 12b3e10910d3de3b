"""Where a JSON Schema holds subschemas: the keywords whose values are schemas (maps of them, one, lists of them, or,
for ``items``, one or a list). ``const``, ``enum``, ``default``, ``examples`` and the like hold data."""

from __future__ import annotations

from typing import Any

SUBSCHEMA_KEYWORDS = {
    **dict.fromkeys(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"), "map"),
    **dict.fromkeys(("dependencies",), "map"),
    **dict.fromkeys(("additionalProperties", "additionalItems", "contains", "not", "if", "then", "else"), "one"),
    **dict.fromkeys(("propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema"), "one"),
    **dict.fromkeys(("allOf", "anyOf", "oneOf", "prefixItems"), "list"),
    "items": "one_or_list",
}


def held_subschemas(kind: str, held: Any) -> list[Any]:
    """The subschemas a keyword of ``kind`` holds in its value ``held`` (data of a malformed value: none)."""
    if kind == "map" and isinstance(held, dict):
        return list(held.values())
    if isinstance(held, list) and kind in ("list", "one_or_list"):
        return held
    if isinstance(held, dict) and kind in ("one", "one_or_list"):
        return [held]
    return []


def subschemas_over(schema: Any, cap: int) -> bool:
    """Whether ``schema`` holds more than ``cap`` schema objects (data, however much, not counted), counted without
    recursion and stopping past ``cap``."""
    stack, seen = [schema], 0
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        seen += 1
        if seen > cap:
            return True
        for key, held in node.items():
            kind = SUBSCHEMA_KEYWORDS.get(key)
            if kind is not None:
                stack.extend(held_subschemas(kind, held))
    return False
