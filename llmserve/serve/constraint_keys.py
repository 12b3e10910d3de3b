"""The request keys of llmserve's constraint processor, as every frontend checks them.

A request carries at most one constraint, under one of CONSTRAINT_KEYS; it reaches the processor
(llmserve.constraints.vllm_processor) in SamplingParams.extra_args. The OpenAI frontend takes the keys
from `vllm_xargs`, the KServe v2 frontends from `sampling_parameters` or the request parameters; both
ask this module whether the engine they serve can honour them (`constraint_problem`) and, KServe, whether the
constraint itself is valid (`validation_problem`, the processor's own check). A constraint sent to a
server without the processor is refused: vLLM would otherwise ignore the extra args, an unconstrained
answer with a success status.

Problems are returned as one-line messages naming the key; each frontend wraps them in its own error
shape (OpenAI: HTTP 400 on `vllm_xargs`; KServe: INVALID_ARGUMENT / HTTP 400).

One engine for every structured request (issue #17): OpenAI's `response_format` (json_object,
json_schema) and vLLM's `structured_outputs` (OpenAI extension field, KServe sampling parameter) are
translated here into the processor's constraint (`response_format_constraint`,
`structured_outputs_constraint`) when the server's structured-outputs backend is llmserve's (the
default; ConstraintSupport.structured). A form llmserve's engine does not take (`grammar`,
`structural_tag`, `whitespace_pattern`) is a 400 naming it, never dropped. With
`llmserve serve --structured-outputs-backend guidance|xgrammar|...` those two fields go to vLLM's own
backend unchanged, for comparison; the constraint keys are still served by llmserve's processor
(they are llmserve's own API), and a request that gives both a structured-output field and a
constraint key is a 400 either way (which one should win would be a guess).

`constraint_budget` (CONSTRAINT_OPTIONS) is an option, not a constraint: true by default, false turns
off the steering that makes a constrained answer end within max_tokens. With it on, a constraint
whose shortest answer does not fit in max_tokens is a 400 saying how many tokens it needs
(`validation_problem` with max_tokens; the frontend process knows the vocabulary: engine.py
registers it at startup).

Checking a new constraint compiles it (up to the compile time budget, LLMSERVE_CONSTRAINT_COMPILE_MS),
so it runs off the event loop, on the constraint-check threads of constraint_checks.py (few, at a lower
CPU priority, refusals remembered): the event loop keeps serving /health and other requests meanwhile.
The compiled automaton is kept (memory and disk cache), so vLLM's own validate_params and the engine
reuse it.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmserve.constraints.schema_walk import subschemas_over
from llmserve.serve.constraint_checks import on_check_thread
from llmserve.serve.limits import JsonProblem, load_json

# = ("constraint", *llmserve.constraints.vllm_processor.FLAT_KEYS); importing that module imports vLLM.
CONSTRAINT_KEYS = ("constraint", "constraint_regex", "constraint_choice", "constraint_json_schema")
# = (llmserve.constraints.vllm_processor.BUDGET_KEY,): options of the constraint, not constraints
CONSTRAINT_OPTIONS = ("constraint_budget",)
# The structured-outputs backend that means llmserve's own engine (`--structured-outputs-backend`);
# the others are vLLM's (vllm.config.structured_outputs.StructuredOutputsBackend).
LLMSERVE_BACKEND = "llmserve"
VLLM_BACKENDS = ("auto", "guidance", "xgrammar", "outlines", "lm-format-enforcer")
STRUCTURED_BACKENDS = (LLMSERVE_BACKEND, *VLLM_BACKENDS)
# What `response_format: {"type": "json_object"}` asks for: OpenAI's JSON mode answers a JSON object.
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ConstraintSupport:
    """Whether an engine runs the constraint processor, and why not: read from the engine's own
    configuration at startup and carried by its EngineHandle (llmserve/serve/engine.py), so each
    frontend asks the engine it serves rather than a process-wide flag."""

    loaded: bool
    reason: str = ""
    # who serves response_format / structured_outputs: LLMSERVE_BACKEND (the processor) or one of vLLM's
    structured: str = LLMSERVE_BACKEND

    @property
    def structured_by_llmserve(self) -> bool:
        return self.structured == LLMSERVE_BACKEND


class StructuredProblem(ValueError):
    """A structured-output request llmserve's engine cannot serve; the message names the field."""


def given_keys(values: dict[str, Any]) -> list[str]:
    """The constraint keys set (not null) in `values`, in CONSTRAINT_KEYS order."""
    return [k for k in CONSTRAINT_KEYS if values.get(k) is not None]


def shape_problem(key: str, value: Any) -> str | None:
    """A value of the wrong JSON type for its key, or None."""
    if key == "constraint" and not isinstance(value, (dict, str)):
        return 'key \'constraint\' must be an object (or the object as a JSON string), e.g. {"regex": "[0-9]+"}'
    if key == "constraint_regex" and not isinstance(value, str):
        return "key 'constraint_regex' must be a string"
    if key == "constraint_choice" and (
        not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value)
    ):
        return "key 'constraint_choice' must be a non-empty array of strings"
    if key == "constraint_json_schema" and not isinstance(value, (dict, str)):
        return "key 'constraint_json_schema' must be a JSON Schema object (or the schema as a JSON string)"
    return None


def constraint_problem(values: dict[str, Any], support: ConstraintSupport) -> str | None:
    """What stops the engine behind `support` honouring the constraint keys in `values` (other keys are
    not looked at): more than one constraint, no processor on it, or a value of the wrong type. None if fine."""
    given = given_keys(values)
    if len(given) > 1:
        return f"give one constraint per request, got {given}"
    if not given:
        return None
    if not support.loaded:
        return f"key '{given[0]}': the constraint processor is not loaded on this server ({support.reason})"
    return shape_problem(given[0], values[given[0]])


def budget_problem(value: Any) -> str | None:
    """A `constraint_budget` value that is not a boolean, or None."""
    if value in (True, False, "true", "false"):
        return None
    return "key 'constraint_budget' must be true or false (false: no steering to end within max_tokens)"


def budget_on(value: Any) -> bool:
    return value not in (False, "false")


def structured_support_problem(support: ConstraintSupport) -> str | None:
    """Why llmserve's engine cannot serve a structured-output field on the engine behind `support`, or None."""
    if support.structured_by_llmserve and not support.loaded:
        return (
            f"llmserve's constraint processor serves it, and it is not loaded on this server ({support.reason}); "
            "a server started with --structured-outputs-backend guidance serves it with vLLM's backend"
        )
    return None


# the request fields (OpenAI) and parameters (KServe) that carry a constraint, besides CONSTRAINT_KEYS
_CARRIERS = frozenset({"structured_outputs", *CONSTRAINT_KEYS})


def openai_constrained(body: Any) -> bool:
    """Whether an OpenAI request body carries a constraint (where its check runs: constraint_checks.request_check)."""
    if not isinstance(body, dict):
        return False
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema"):
        return True
    xargs = body.get("vllm_xargs")
    return (
        body.get("structured_outputs") is not None
        or any(isinstance(k, str) and k.startswith("guided_") for k in body)
        or (isinstance(xargs, dict) and not _CARRIERS.isdisjoint(xargs))
    )


def openai_constraints_known(body: dict[str, Any]) -> bool:
    """Whether every constraint an OpenAI body carries (``openai_constrained``) was checked here before: its check
    is then answered from memory and need not queue behind new ones. False where one is new or not read here (a
    malformed field, vLLM's guided_* fields). Hashes each schema's text: run it off the event loop."""
    from llmserve.constraints.compiler import is_known
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.spec import spec_from_request

    try:
        found = [response_format_constraint(body.get("response_format"))]
        if body.get("structured_outputs") is not None:
            found.append(structured_outputs_constraint(body["structured_outputs"]))
        given = body.get("vllm_xargs")
        xargs: dict[str, Any] = given if isinstance(given, dict) else {}
        found += [_xargs_constraint(key, xargs[key]) for key in CONSTRAINT_KEYS if key in xargs]
        objs = [obj for obj in found if obj is not None]
        return (
            bool(objs)
            and not any(isinstance(k, str) and k.startswith("guided_") for k in body)
            and all(is_known(spec_from_request(obj)) for obj in objs)
        )
    except (StructuredProblem, ConstraintError, KeyError, TypeError, ValueError):
        return False


def _xargs_constraint(key: str, value: Any) -> Any:
    """A vllm_xargs constraint key's value as a constraint object (the form vllm_processor.request_constraint reads)."""
    if key == "constraint":
        return value
    return {key.removeprefix("constraint_"): value}


def kserve_constrained(params: dict[str, Any], tensors: Any = ()) -> bool:
    """Whether a KServe request carries a constraint: as a parameter, or inside its `sampling_parameters` text."""
    if not _CARRIERS.isdisjoint(params):
        return True
    for tensor in tensors:
        if getattr(tensor, "name", None) != "sampling_parameters":
            continue
        for value in tensor.values:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if "structured_outputs" in text or "constraint" in text:
                return True
    return False


def validation_problem(
    key: str,
    value: Any,
    max_tokens: int | None = None,
    budget: bool = True,
    stop: Any = None,
    limit: str | None = None,
    stop_token_ids: Any = None,
) -> str | None:
    """The constraint processor's own check of one constraint (what its validate_params runs when
    vLLM admits the request), reported with the key; None if valid. With `max_tokens` and the
    budget on, a constraint whose shortest answer cannot fit is refused with the tokens it needs,
    and one with a `stop` string or a stop token that could cut its answer short (``stop_problem``,
    ``stop_token_problem``); `limit`: what that refusal calls max_tokens (``budget.check_fits``).
    Only the processor's ConstraintError is the client's fault; anything else it raises propagates
    (a server fault). Runs on a constraint-check thread (constraint_checks.py). Imports vLLM."""
    # deferred to the first constrained request: the processor module imports vLLM (seconds), and
    # the frontends import this module before the engine step
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.vllm_processor import check_budget, request_constraint, validate_constraint

    def check() -> str | None:
        try:
            obj = request_constraint({key: value})
            if obj is not None:
                validate_constraint(obj)
                if budget and max_tokens is not None:
                    check_budget(obj, max_tokens, limit)
        except ConstraintError as exc:
            return f"key '{key}': invalid constraint: {exc.message}"
        problem = None
        if budget and obj is not None:
            problem = stop_problem(obj, stop) or stop_token_problem(obj, stop_token_ids)
        return f"key '{key}': {problem}" if problem else None

    return on_check_thread(check, known=_known_constraint(key, value))


def _known_constraint(key: str, value: Any) -> bool:
    """Whether the constraint of ``key`` was checked here before (``compiler.is_known``); False when not read."""
    from llmserve.constraints.compiler import is_known
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.spec import spec_from_request
    from llmserve.constraints.vllm_processor import request_constraint

    try:
        obj = request_constraint({key: value})
        return obj is not None and "machine" not in obj and is_known(spec_from_request(obj))
    except ConstraintError:
        return False


def object_problem(
    obj: dict[str, Any],
    max_tokens: int | None = None,
    budget: bool = True,
    stop: Any = None,
    limit: str | None = None,
    stop_token_ids: Any = None,
) -> str | None:
    """`validation_problem` of a constraint object translated from a structured-output field, worded
    without the key (the caller names its field)."""
    problem = validation_problem("constraint", obj, max_tokens, budget, stop, limit, stop_token_ids)
    return problem.removeprefix("key 'constraint': ") if problem else None


# compact JSON (what llmserve's engine answers) holds no raw control character: inside a string
# one is written as an escape ("\\n"), and there is no whitespace between tokens
_NOT_IN_JSON = {chr(c) for c in range(0x20)}


def stop_problem(obj: dict[str, Any], stop: Any) -> str | None:
    """A stop string that can occur inside an answer of the constraint ``obj``: the engine ends the
    answer where one appears, which would cut a steered answer short of its end (broken JSON with
    finish_reason "stop"). One that cannot occur changes nothing and is accepted: decided cheaply where
    it can be (a raw control character, as in "\\n\\nUser:", for a JSON answer; in none of the choices;
    a character the regex never matches), else exactly off the constraint's automaton ("END" beside an
    enum or an integer); for any other the request is refused, naming the way out. Machines keep stop
    strings."""
    if "machine" in obj:
        return None
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    ranges = _regex_alphabet(obj)
    maybe = [text for text in stops if isinstance(text, str) and text and _text_may_occur(obj, text, ranges)]
    return _first_occurring(obj, maybe, [text.encode() for text in maybe], lambda text: f"stop string {text!r}")


def _text_may_occur(obj: dict[str, Any], text: str, ranges: Alphabet | None) -> bool:
    if "json_schema" in obj and not _NOT_IN_JSON.isdisjoint(text):
        return False
    if "choice" in obj and isinstance(obj["choice"], list) and not any(text in c for c in obj["choice"]):
        return False
    return ranges is None or not _outside(text, ranges)


def _first_occurring(
    obj: dict[str, Any], items: list[Any], data: list[bytes], name: Callable[[Any], str]
) -> str | None:
    """The refusal for the first of ``items`` whose bytes (``data``) occur inside an answer of ``obj``, or
    that could not be decided (``vllm_processor.occurring_in``); None when none does."""
    from llmserve.constraints.vllm_processor import occurring_in

    if not items:
        return None
    for item, found in zip(items, occurring_in(obj, data), strict=True):
        if found is not False:
            return (
                f"{name(item)} may occur inside this constraint's answers, where it would cut the answer "
                "short of valid: remove it (a constrained answer ends by itself), or set constraint_budget false "
                "to accept answers that may end early"
            )
    return None


def stop_token_problem(obj: dict[str, Any], ids: Any) -> str | None:
    """``stop_problem`` for ``stop_token_ids``: a token id the constraint may allow inside an answer ends the
    answer there. Never allowed inside one: an end-of-sequence id (allowed only once the answer is complete), an id
    with no bytes in the processor's vocabulary (a special token), and a token whose bytes cannot occur in an
    answer (decided as for stop strings). Checked where the vocabulary is known (the engine's process, or a
    frontend it was registered in)."""
    from llmserve.constraints.vllm_processor import validation_vocab

    vocab = validation_vocab()
    if vocab is None or not isinstance(ids, list) or "machine" in obj:
        return None
    ranges = _regex_alphabet(obj)  # once: a request may name 1024 ids
    maybe: list[tuple[int, bytes]] = []
    for token in ids:
        data = vocab.token_bytes(token) if isinstance(token, int) and token >= 0 else None
        if data is not None and _token_may_occur(obj, data, ranges):
            maybe.append((token, data))
    return _first_occurring(
        obj,
        maybe,
        [data for _, data in maybe],
        lambda item: f"stop token id {item[0]} ({item[1].decode('utf-8', 'replace')!r})",
    )


def _token_may_occur(obj: dict[str, Any], data: bytes, ranges: Alphabet | None) -> bool:
    if "json_schema" in obj and any(b < 0x20 for b in data):
        return False
    choices = obj.get("choice")
    if isinstance(choices, list) and not any(data in c.encode() for c in choices if isinstance(c, str)):
        return False
    # the characters a token's bytes hold whole (a token may begin or end inside one) occur wherever it does, and
    # any byte past ASCII is part of a character past ASCII
    return ranges is None or not _outside(data.decode("utf-8", "ignore"), ranges, past_ascii=max(data) >= 0x80)


Alphabet = tuple[list[int], list[int]]  # merged ranges of code points: their starts and their ends, ascending


def _regex_alphabet(obj: dict[str, Any]) -> Alphabet | None:
    """The code points a regex constraint's answers may hold (None: not a regex, or not known)."""
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.regex import alphabet, parse

    pattern = obj.get("regex")
    if not isinstance(pattern, str):
        return None
    try:
        ranges = alphabet(parse(pattern))
    except ConstraintError:
        return None
    if ranges is None:
        return None
    starts: list[int] = []
    ends: list[int] = []
    for lo, hi in sorted(ranges):
        if ends and lo <= ends[-1] + 1:
            ends[-1] = max(ends[-1], hi)
        else:
            starts.append(lo)
            ends.append(hi)
    return starts, ends


def _outside(text: str, alphabet: Alphabet, past_ascii: bool = False) -> bool:
    """Whether ``text`` (and, with ``past_ascii``, some character past ASCII) holds a character outside
    ``alphabet``, so that it never occurs in an answer."""
    starts, ends = alphabet
    if past_ascii and (not ends or ends[-1] < 0x80):
        return True
    for c in text:
        k = bisect.bisect_right(starts, ord(c)) - 1
        if k < 0 or ord(c) > ends[k]:
            return True
    return False


async def validation_problem_async(key: str, value: Any) -> str | None:
    """`validation_problem` off the event loop: the caller's loop is free while the constraint compiles."""
    return await asyncio.to_thread(validation_problem, key, value)


# ---- structured-output fields -> llmserve constraints -------------------------------------------

# structured_outputs keys: kinds llmserve's engine serves -> the constraint kind; kinds it refuses
STRUCTURED_KINDS = {"json": "json_schema", "json_object": "json_schema", "regex": "regex", "choice": "choice"}
REFUSED_KINDS = {
    "grammar": "grammars (EBNF/Lark) are not supported by llmserve's constraint engine",
    "structural_tag": "structural tags are not supported by llmserve's constraint engine",
}
# keys of JSON Schema whose values are maps of names to subschemas, or subschemas (lists of them)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_SUBS = (
    "items",
    "prefixItems",
    "additionalItems",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
)


# The metaschema check is jsonschema's, in Python: about 0.1-0.2 ms per subschema here, so it is bounded. A schema
# with more subschemas than this (counted where schemas go, not data) is left to the converter's own checks, which
# name what they refuse and refuse a value of the wrong type (jsonschema._convert); a schema's verdict is
# remembered (the same schema in every request is checked once), SCHEMA_VERDICTS of them.
METASCHEMA_MAX_SUBSCHEMAS = 10_000
SCHEMA_VERDICTS = 1024
_verdicts: OrderedDict[str, str | None] = OrderedDict()
_verdicts_lock = threading.Lock()


def schema_problem(schema: Any) -> str | None:
    """What makes ``schema`` an invalid JSON Schema (its metaschema's verdict, "at <path>: <why>"),
    or None. A ``pattern`` is an ECMA-262 regular expression, which the metaschema's ``regex`` format
    would check with Python's ``re`` (no ``\\p{L}``, no ``(?<name>...)``): patterns are left to the
    engine that reads them (llmserve's names a pattern it cannot read; so do vLLM's backends). Bounded and
    remembered (METASCHEMA_MAX_SUBSCHEMAS)."""
    if isinstance(schema, dict) and "$schema" in schema and not isinstance(schema["$schema"], str):
        return f"at $schema: must be a string (a dialect's URI), got {type(schema['$schema']).__name__}"
    try:
        key = hashlib.sha256(json.dumps(schema, sort_keys=True).encode(errors="surrogatepass")).hexdigest()
    except (TypeError, ValueError, RecursionError):  # not JSON data: the metaschema check says what is wrong
        key = None
    if key is not None:
        with _verdicts_lock:
            if key in _verdicts:
                _verdicts.move_to_end(key)
                return _verdicts[key]
    verdict = None if subschemas_over(schema, METASCHEMA_MAX_SUBSCHEMAS) else _metaschema_verdict(schema)
    if key is not None:
        with _verdicts_lock:
            _verdicts[key] = verdict
            while len(_verdicts) > SCHEMA_VERDICTS:
                _verdicts.popitem(last=False)
    return verdict


def _metaschema_verdict(schema: Any) -> str | None:
    import jsonschema  # deferred: it comes with vLLM (the serve extra), not with llmserve's own dependencies

    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {k: v for k, v in validator.FORMAT_CHECKER.checkers.items() if k != "regex"}
    try:
        validator.check_schema(schema, format_checker=checker)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"at {where}: {exc.message}"
    return None


def response_format_constraint(value: Any) -> dict[str, Any] | None:
    """The constraint object OpenAI's `response_format` asks for (None: text). The value's shape is
    checked by the caller (openai/fields.py)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return {"json_schema": JSON_OBJECT_SCHEMA}
    if kind == "json_schema":
        # strict or not, the schema is enforced: every answer validates (strict only adds a promise)
        return {"json_schema": value["json_schema"]["schema"]}
    return None


def structured_outputs_constraint(value: Any) -> dict[str, Any]:
    """The constraint object a `structured_outputs` object (vLLM's StructuredOutputsParams fields)
    asks for. StructuredProblem names the key llmserve's engine does not take."""
    value = _structured_object(value)
    kinds = [k for k in STRUCTURED_KINDS if value.get(k) is not None]
    if len(kinds) != 1:
        raise StructuredProblem(
            f"give exactly one of {', '.join(STRUCTURED_KINDS)} (got {', '.join(kinds) if kinds else 'none'})"
        )
    kind = kinds[0]
    spec = _structured_spec(kind, value[kind])
    if kind == "json" and value.get("disable_additional_properties"):
        spec = no_additional_properties(spec)
    # disable_any_whitespace: honoured either way (llmserve's JSON is compact, a subset of both)
    return {STRUCTURED_KINDS[kind]: spec}


def _structured_object(value: Any) -> dict[str, Any]:
    """The structured_outputs object, its keys checked: unknown keys and forms llmserve refuses named."""
    if isinstance(value, str):
        try:
            value = load_json(value)
        except JsonProblem as exc:
            raise StructuredProblem(
                f'is {exc}: give an object with one of json, json_object, regex, choice, e.g. {{"json": {{...}}}}'
            ) from None
    if not isinstance(value, dict):
        raise StructuredProblem('must be an object with one of json, json_object, regex, choice, e.g. {"json": {...}}')
    options = {"disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"}
    unknown = sorted(set(value) - set(STRUCTURED_KINDS) - set(REFUSED_KINDS) - options)
    if unknown:
        raise StructuredProblem(
            f"unknown key(s) {', '.join(unknown)}; it takes one of {', '.join(STRUCTURED_KINDS)}, "
            f"and {', '.join(sorted(options - {'whitespace_pattern'}))}"
        )
    for key, why in REFUSED_KINDS.items():
        if value.get(key) is not None:
            raise StructuredProblem(
                f"key '{key}': {why} (it takes {', '.join(STRUCTURED_KINDS)}); "
                "a server started with --structured-outputs-backend guidance serves it with vLLM's backend"
            )
    if value.get("whitespace_pattern") is not None:
        raise StructuredProblem(
            "key 'whitespace_pattern' is not supported: llmserve's constraint engine answers compact JSON"
        )
    for opt in ("disable_any_whitespace", "disable_additional_properties"):
        if value.get(opt) not in (None, True, False):
            raise StructuredProblem(f"key '{opt}' must be true or false")
    return value


def _structured_spec(kind: str, spec: Any) -> Any:
    """One kind's value as the constraint takes it."""
    if kind == "json_object":
        if spec is not True:
            raise StructuredProblem("key 'json_object' must be true when given")
        return JSON_OBJECT_SCHEMA
    if kind == "json":
        if isinstance(spec, str):
            try:
                spec = load_json(spec)
            except JsonProblem as exc:
                raise StructuredProblem(f"key 'json' is not a JSON schema document: it is {exc}") from None
        if not isinstance(spec, dict):
            raise StructuredProblem("key 'json' must be a JSON Schema object")
        problem = schema_problem(spec)
        if problem:
            raise StructuredProblem(f"key 'json' is not a valid JSON Schema {problem}")
        return spec
    if kind == "regex" and not isinstance(spec, str):
        raise StructuredProblem("key 'regex' must be a string")
    if kind == "choice" and (not isinstance(spec, list) or not spec or not all(isinstance(c, str) for c in spec)):
        raise StructuredProblem("key 'choice' must be a non-empty array of strings")
    return spec


def no_additional_properties(schema: Any) -> Any:
    """`disable_additional_properties` as vLLM's guidance backend applies it: a copy of the schema in
    which every object schema with `properties` or `patternProperties` and no `additionalProperties`
    says false."""
    if isinstance(schema, list):
        return [no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: no_additional_properties(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_SUBS:
        if isinstance(out.get(key), (dict, list)):
            out[key] = no_additional_properties(out[key])
    if "additionalProperties" not in out and (
        isinstance(out.get("properties"), dict) or isinstance(out.get("patternProperties"), dict)
    ):
        out["additionalProperties"] = False
    return out


def extra_args_value(value: Any) -> Any:
    """The form a constraint value travels in extra_args: objects as JSON text (vLLM's `vllm_xargs`
    carries only strings, numbers and lists of those; the processor parses the text back)."""
    return json.dumps(value) if isinstance(value, dict) else value
