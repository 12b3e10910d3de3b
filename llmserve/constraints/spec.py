"""What a request asks for: a ``ConstraintSpec`` (regex, choice or json_schema), parsed from the
request form, with its canonical text (the cache key's input) and its byte DFA."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.json_text import read_json_text
from llmserve.constraints.jsonschema import schema_to_ast, schema_to_dfa
from llmserve.constraints.regex import ByteDFA, compile_ast, literal, parse

KINDS = ("regex", "choice", "json_schema", "automaton")
REQUEST_KINDS = KINDS[:3]  # an automaton arrives as {"machine": name} (machine.py), never as a spec


@dataclass(frozen=True)
class ConstraintSpec:
    """One constraint: ``kind`` in regex | choice | json_schema, ``value`` its pattern, list of
    strings or schema."""

    kind: str
    value: Any

    def __post_init__(self) -> None:
        if self.kind not in REQUEST_KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r} (one of: regex, choice, json_schema)")
        if self.kind == "regex" and not isinstance(self.value, str):
            raise ConstraintError("regex must be a string")
        if self.kind == "choice" and (
            not isinstance(self.value, (list, tuple))
            or not self.value
            or not all(isinstance(c, str) for c in self.value)
        ):
            raise ConstraintError("choice must be a non-empty list of strings")
        if self.kind == "json_schema" and isinstance(self.value, str):
            object.__setattr__(self, "value", read_json_text(self.value, "json_schema"))
        if self.kind == "json_schema" and not isinstance(self.value, dict):
            raise ConstraintError("json_schema must be a JSON object")

    @property
    def canonical(self) -> str:
        """The cache keys' input. Computed once: a request's spec is keyed several times over (its
        automaton, its words, its form) and a large schema's text costs milliseconds; so ``value``
        must not be changed once the spec is made (a changed value would keep its old keys). It may hold a
        lone surrogate (JSON's "\\ud800"), which UTF-8 cannot: hash it encoded with errors="surrogatepass"."""
        found = self.__dict__.get("_canonical")
        if found is None:
            value = list(self.value) if self.kind == "choice" else self.value
            found = json.dumps(
                {"kind": self.kind, "value": value}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
            )
            object.__setattr__(self, "_canonical", found)  # frozen: set as its constructor does
        return found

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical.encode(errors="surrogatepass")).hexdigest()

    def to_ast(self) -> Any:
        if self.kind == "regex":
            return parse(self.value)
        if self.kind == "choice":
            return ("alt", [literal(c) for c in self.value])
        return schema_to_ast(self.value)

    def to_dfa(self, backend: str = "native", *, started: float | None = None) -> ByteDFA:
        """Built now, within the compile limits counted from ``started`` (default now; converting a
        schema counts towards the time budget too). No cache: ``compiler.dfa_for`` adds those."""
        started = time.monotonic() if started is None else started
        if self.kind == "json_schema":
            return schema_to_dfa(self.value, backend, started=started)
        return compile_ast(self.to_ast(), backend, started=started)


def spec_from_request(obj: Any) -> ConstraintSpec:
    """From the request form: ``{"regex": "..."}``, ``{"choice": [...]}``, ``{"json_schema": {...}}``
    (exactly one key), or ``{"kind": ..., "value": ...}``."""
    if isinstance(obj, ConstraintSpec):
        return obj
    if isinstance(obj, str):
        obj = read_json_text(obj, "constraint")
    if not isinstance(obj, dict):
        raise ConstraintError('constraint must be an object such as {"regex": "[0-9]+"}')
    if set(obj) == {"kind", "value"}:
        return ConstraintSpec(obj["kind"], obj["value"])
    keys = [k for k in obj if k in REQUEST_KINDS]
    if len(keys) != 1 or len(obj) != 1:
        raise ConstraintError(f"constraint must have exactly one of: regex, choice, json_schema; got {sorted(obj)}")
    return ConstraintSpec(keys[0], obj[keys[0]])
