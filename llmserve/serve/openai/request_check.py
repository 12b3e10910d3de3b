"""Check a request body against the field-fate table and translate it for vLLM's request models."""

from __future__ import annotations

from typing import Any

from llmserve.serve.constraint_keys import ConstraintSupport
from llmserve.serve.openai.errors import RequestRejected
from llmserve.serve.openai.fields import REQUIRED, TABLES, CheckContext, route_structured


def check_request(kind: str, body: Any, constraints: ConstraintSupport) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (body for vLLM, fields honoured by llmserve itself); raise RequestRejected otherwise.

    `constraints`: whether the engine the request is for runs the constraint processor (its EngineHandle's)."""
    if not isinstance(body, dict):
        raise RequestRejected("the request body must be a JSON object", code="invalid_json")
    table = TABLES[kind]
    ctx = CheckContext(body, constraints, kind)
    for name in REQUIRED[kind]:
        if body.get(name) is None:
            raise RequestRejected(f"missing required field '{name}'", param=name, code="missing_required_parameter")
    forwarded: dict[str, Any] = {}
    consumed: dict[str, Any] = {}
    for name, value in body.items():
        fate = table.get(name)
        if fate is None:
            raise RequestRejected(
                f"unknown field '{name}': this server rejects fields it does not implement",
                param=name,
                code="unknown_parameter",
            )
        if value is None:
            continue  # null means "not set"
        if not fate.honoured:
            raise RequestRejected(
                f"field '{name}' is not supported: {fate.how}", param=name, code="unsupported_parameter"
            )
        if fate.check is not None and (problem := fate.check(value, ctx)):
            raise RequestRejected(f"field '{name}': {problem}", param=name, code="unsupported_value")
        if fate.forward == "pass":
            forwarded[name] = value
        elif fate.forward == "consume":
            consumed[name] = value
        else:
            forwarded.update(fate.forward(value))
    route_structured(body, forwarded, constraints)
    return forwarded, consumed


def prompt_chars(kind: str, body: dict) -> int:
    """Characters of prompt text in a request (token-id prompts count one per id)."""

    def size(v: Any) -> int:
        if isinstance(v, str):
            return len(v)
        if isinstance(v, list):
            return sum(size(x) for x in v)
        if isinstance(v, dict):
            return size(v.get("content")) + size(v.get("text"))
        return 1 if isinstance(v, int) else 0

    field = {"chat": "messages", "completion": "prompt", "embedding": "input"}[kind]
    return size(body.get(field))
