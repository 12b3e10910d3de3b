"""Sampling settings for KServe v2 generation: every key is mapped to vLLM or rejected by name.

A request carries settings in two places, and both go through this one table:
  - the `sampling_parameters` input tensor: one JSON object (the Triton vLLM backend's convention);
  - the request's `parameters` map (gRPC InferParameter / HTTP JSON `parameters`, and the generate
    extension's `parameters` object).
A key set in both places is refused (which one should win would be a guess). Values may be JSON
typed or strings (Triton's own samples send "0.1" for temperature; gRPC parameters of list or
object type arrive as JSON strings); they are converted and checked here.

Mapping table (key -> vLLM 0.32 SamplingParams field):

    temperature, top_p, top_k, min_p              -> same name        (number)
    presence_penalty, frequency_penalty,
    repetition_penalty                            -> same name        (number)
    max_tokens, min_tokens, seed                  -> same name        (integer; max_tokens default 16)
    stop                                          -> stop             (string or list of at most 16 strings
                                                                       of at most 1000 characters)
    stop_token_ids, allowed_token_ids             -> same name        (list of integers: at most 1024;
                                                                       allowed_token_ids at most 262144)
    bad_words                                     -> bad_words        (list of at most 1024 strings)
    logit_bias                                    -> logit_bias       (object: token id -> bias, at most 1024)
    ignore_eos, include_stop_str_in_output,
    skip_special_tokens,
    spaces_between_special_tokens                 -> same name        (boolean)
    n                                             -> n, only 1        (text_output carries one text)
    structured_outputs                            -> llmserve's constraint processor (extra_args), by default
        an object with exactly one of: json (JSON schema, object or string), json_object (true: a JSON
        object), regex, choice (list of strings); options disable_any_whitespace (answers are compact
        either way), disable_additional_properties (as vLLM's guidance applies it). grammar,
        structural_tag and whitespace_pattern are refused by name (llmserve's engine does not take them).
        The answer ends within max_tokens (constraint_budget below). The OpenAI API's `response_format`
        is served the same way. With `llmserve serve --structured-outputs-backend guidance|xgrammar|...`
        it goes to vLLM instead: structured_outputs=StructuredOutputsParams(...), grammar and
        structural_tag included. Given together with a constraint key: refused (one constraint).

Constraint keys of llmserve's constraint processor (llmserve.constraints.vllm_processor), the same
keys the OpenAI API takes in `vllm_xargs`; at most one per request:

    constraint_regex                              -> extra_args       (string: the whole output matches it)
    constraint_choice                             -> extra_args       (list of strings, or it as JSON text)
    constraint_json_schema                        -> extra_args       (JSON Schema object, or it as JSON text)
    constraint                                    -> extra_args       (object, or it as JSON text:
        {"regex": ...} | {"choice": [...]} | {"json_schema": {...}} | {"machine": name, "args": {...}})
    constraint_budget                             -> extra_args       (true by default: the answer is steered
        to end within max_tokens, and a constraint whose shortest answer needs more is refused saying
        how many tokens it needs; false: off)
    extra_args                                    -> extra_args       (object of the keys above only: the
        spelling of Triton's vLLM backend, which passes sampling_parameters to SamplingParams(**...))

    The constraint is validated by the processor's own check before the request reaches the engine
    (invalid: INVALID_ARGUMENT / HTTP 400 naming the key), and refused when the engine runs without
    the processor (`llmserve serve --no-constraints`, pooling models, speculative decoding): vLLM
    would ignore it and answer unconstrained.

Request-level keys that are not sampling settings (Triton reserved parameters):

    priority                         -> AsyncLLM.generate(priority=...); refused unless the engine's
                                        scheduling_policy is "priority" (fcfs would ignore it)
    triton_enable_empty_final_response  accepted: the final response is always sent, flagged with
                                        triton_final_response=true (see grpc_frontend.py)
    binary_data_output               -> HTTP only: outputs in the binary tensor extension
    sequence_id/_start/_end, timeout    refused with the reason (no sequence batching; use a client
                                        deadline, which aborts the request in the engine)

Refused with a pointer to the right key: logprobs and prompt_logprobs (text_output carries text
only; /v1/completions returns them), best_of/use_beam_search, guided_* (use structured_outputs),
response_format (OpenAI's name), stream / exclude_input_in_output (these are input tensors).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmserve.serve.constraint_keys import (
    CONSTRAINT_KEYS,
    CONSTRAINT_OPTIONS,
    ConstraintSupport,
    StructuredProblem,
    budget_on,
    budget_problem,
    constraint_problem,
    extra_args_value,
    given_keys,
    object_problem,
    schema_problem,
    structured_outputs_constraint,
    structured_support_problem,
    validation_problem,
)
from llmserve.serve.kserve.errors import internal, invalid
from llmserve.serve.limits import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOKEN_LIST,
    VLLM_DEFAULT_MAX_TOKENS,
    JsonProblem,
    load_json,
    short,
)

log = logging.getLogger("llmserve.serve.kserve")


def _where(key: str, origin: str) -> str:
    return f"{origin} key '{key}'"


def _number(key: str, value: Any, origin: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise invalid(f"{_where(key, origin)}: expected a number, got {short(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"{_where(key, origin)}: expected a finite number, got {short(value)}")
    return float(value)


def _integer(key: str, value: Any, origin: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise invalid(f"{_where(key, origin)}: expected an integer, got {short(value)}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{_where(key, origin)}: expected an integer, got {short(value)}")
    return value


def _boolean(key: str, value: Any, origin: str) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise invalid(f"{_where(key, origin)}: expected true or false, got {short(value)}")
    return value


def _json_value(key: str, value: Any, origin: str) -> Any:
    """Lists and objects may arrive as JSON text (gRPC string parameters, Triton samples)."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("[", "{"):
            try:
                return load_json(stripped)
            except JsonProblem as exc:
                raise invalid(f"{_where(key, origin)}: the value is {exc}") from None
    return value


def _at_most(key: str, value: Any, origin: str, limit: int, what: str) -> None:
    # the lists below are applied at every decode step (stop strings, banned words, biases):
    # their size is bounded as the OpenAI routes bound it (llmserve/serve/limits.py)
    if len(value) > limit:
        raise invalid(f"{_where(key, origin)}: at most {limit} {what} are accepted, got {len(value)}")


def _int_list(key: str, value: Any, origin: str, limit: int = MAX_TOKEN_LIST) -> list[int]:
    value = _json_value(key, value, origin)
    if not isinstance(value, list):
        raise invalid(f"{_where(key, origin)}: expected a list of integers, got {short(value)}")
    _at_most(key, value, origin, limit, "token ids")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise invalid(f"{_where(key, origin)}: expected a list of integers, got {short(value)}")
    return value


def _allowed_ids(key: str, value: Any, origin: str) -> list[int]:
    return _int_list(key, value, origin, MAX_ALLOWED_TOKEN_IDS)


def _str_list(key: str, value: Any, origin: str) -> list[str]:
    value = _json_value(key, value, origin)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{_where(key, origin)}: expected a list of strings, got {short(value)}")
    return value


def _bad_words(key: str, value: Any, origin: str) -> list[str]:
    value = _str_list(key, value, origin)
    _at_most(key, value, origin, MAX_TOKEN_LIST, "words")
    return value


def _stop(key: str, value: Any, origin: str) -> str | list[str]:
    value = _json_value(key, value, origin)
    stops = [value] if isinstance(value, str) else _str_list(key, value, origin)
    _at_most(key, stops, origin, MAX_STOP_STRINGS, "stop strings")
    if any(len(v) > MAX_STOP_CHARS for v in stops):
        raise invalid(f"{_where(key, origin)}: a stop string may have at most {MAX_STOP_CHARS} characters")
    return value


def _logit_bias(key: str, value: Any, origin: str) -> dict[int, float]:
    value = _json_value(key, value, origin)
    if not isinstance(value, dict):
        raise invalid(f"{_where(key, origin)}: expected an object of token id -> bias, got {short(value)}")
    _at_most(key, value, origin, MAX_TOKEN_LIST, "entries")
    out: dict[int, float] = {}
    for tok, bias in value.items():
        out[_integer(f"{key}.{tok}", tok, origin)] = _number(f"{key}.{tok}", bias, origin)
    return out


def _n(key: str, value: Any, origin: str) -> int:
    n = _integer(key, value, origin)
    if n != 1:
        raise invalid(
            f"{_where(key, origin)}: only n=1 is supported (text_output carries one generated text); "
            "send n separate requests instead"
        )
    return n


STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
STRUCTURED_OPTIONS: dict[str, Callable[[str, Any, str], Any] | None] = {
    "disable_additional_properties": _boolean,
    "disable_any_whitespace": _boolean,
    "whitespace_pattern": None,
}


def _structured(key: str, value: Any, origin: str) -> Any:
    # deferred to the first request: the frontends import this module before the engine step, and
    # importing vLLM takes seconds
    from vllm.sampling_params import StructuredOutputsParams

    value = _json_value(key, value, origin)
    kind = _structured_kind(key, value, origin)
    args = {kind: _structured_spec(key, kind, value[kind], origin), **_structured_options(key, value, origin)}
    try:
        return StructuredOutputsParams(**args)
    except (ValueError, TypeError) as exc:
        raise invalid(f"{_where(key, origin)}: {exc}") from None


def _structured_kind(key: str, value: Any, origin: str) -> str:
    """The one kind of STRUCTURED_KINDS that a structured_outputs object gives."""
    if not isinstance(value, dict):
        raise invalid(
            f"{_where(key, origin)}: expected an object with one of {', '.join(STRUCTURED_KINDS)}, "
            f'e.g. {{"json": {{"type": "object"}}}}'
        )
    unknown = sorted(set(value) - set(STRUCTURED_KINDS) - set(STRUCTURED_OPTIONS))
    if unknown:
        raise invalid(
            f"{_where(key, origin)}: unknown key(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(STRUCTURED_KINDS + tuple(STRUCTURED_OPTIONS))}"
        )
    kinds = [k for k in STRUCTURED_KINDS if value.get(k) is not None]
    if len(kinds) != 1:
        raise invalid(
            f"{_where(key, origin)}: give exactly one of {', '.join(STRUCTURED_KINDS)} "
            f"(got {', '.join(kinds) if kinds else 'none'})"
        )
    return kinds[0]


def _structured_spec(key: str, kind: str, spec: Any, origin: str) -> Any:
    """The value of one structured-output kind, as StructuredOutputsParams takes it."""
    if kind == "json":
        return _json_schema_spec(key, spec, origin)
    if kind == "json_object":
        if _boolean(f"{key}.json_object", spec, origin) is not True:
            raise invalid(f"{_where(key, origin)}: 'json_object' must be true when given")
        return True
    if kind == "choice":
        return _str_list(f"{key}.choice", spec, origin)
    if kind == "structural_tag":
        return spec if isinstance(spec, str) else json.dumps(spec)
    if not isinstance(spec, str):
        raise invalid(f"{_where(key, origin)}: '{kind}' must be a string")
    return spec


def _json_schema_spec(key: str, spec: Any, origin: str) -> dict[str, Any]:
    if isinstance(spec, str):
        try:
            spec = load_json(spec)
        except JsonProblem as exc:
            raise invalid(f"{_where(key, origin)}: 'json' is not a valid JSON schema document: it is {exc}") from None
    if not isinstance(spec, dict):
        raise invalid(f"{_where(key, origin)}: 'json' must be a JSON schema object")
    _check_schema(key, spec, origin)
    return spec


def _structured_options(key: str, value: dict[str, Any], origin: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for opt, conv in STRUCTURED_OPTIONS.items():
        if value.get(opt) is None:
            continue
        if conv is not None:
            options[opt] = conv(f"{key}.{opt}", value[opt], origin)
        elif isinstance(value[opt], str):
            options[opt] = value[opt]
        else:
            raise invalid(f"{_where(key, origin)}: '{opt}' must be a string")
    return options


def _check_schema(key: str, schema: dict, origin: str) -> None:
    problem = schema_problem(schema)
    if problem:
        raise invalid(f"{_where(key, origin)}: 'json' is not a valid JSON Schema {problem}")


Converter = Callable[[str, Any, str], Any]

# Key -> (SamplingParams field, converter). The documented table above, in code.
SAMPLING_KEYS: dict[str, tuple[str, Converter]] = {
    "temperature": ("temperature", _number),
    "top_p": ("top_p", _number),
    "top_k": ("top_k", _integer),
    "min_p": ("min_p", _number),
    "presence_penalty": ("presence_penalty", _number),
    "frequency_penalty": ("frequency_penalty", _number),
    "repetition_penalty": ("repetition_penalty", _number),
    "max_tokens": ("max_tokens", _integer),
    "min_tokens": ("min_tokens", _integer),
    "seed": ("seed", _integer),
    "stop": ("stop", _stop),
    "stop_token_ids": ("stop_token_ids", _int_list),
    "allowed_token_ids": ("allowed_token_ids", _allowed_ids),
    "bad_words": ("bad_words", _bad_words),
    "logit_bias": ("logit_bias", _logit_bias),
    "ignore_eos": ("ignore_eos", _boolean),
    "include_stop_str_in_output": ("include_stop_str_in_output", _boolean),
    "skip_special_tokens": ("skip_special_tokens", _boolean),
    "spaces_between_special_tokens": ("spaces_between_special_tokens", _boolean),
    "n": ("n", _n),
    "structured_outputs": ("structured_outputs", _structured),
}

# Keys a client may reasonably send that this frontend does not take, with where to go instead.
REFUSED_KEYS: dict[str, str] = {
    "logprobs": "text_output carries text only; use /v1/completions with logprobs",
    "prompt_logprobs": "text_output carries text only; use /v1/completions with prompt_logprobs",
    "best_of": "beam search / best_of is not supported; send n=1",
    "use_beam_search": "beam search is not supported by this engine API",
    "guided_json": 'use structured_outputs: {"json": <schema>}',
    "guided_regex": 'use structured_outputs: {"regex": <pattern>}',
    "guided_choice": 'use structured_outputs: {"choice": [...]}',
    "guided_grammar": 'use structured_outputs: {"grammar": <grammar>}',
    "guided_decoding": 'use structured_outputs: {"json": <schema>} (vLLM 0.32 name)',
    "response_format": 'that is the OpenAI API\'s name; use structured_outputs: {"json": <schema>}',
    "stream": "stream is an input tensor (BOOL [1]), not a sampling setting",
    "exclude_input_in_output": "exclude_input_in_output is an input tensor (BOOL [1]), not a sampling setting",
    "detokenize": "text_output needs detokenized text",
    "output_kind": "the frontend chooses the output kind (deltas for streams)",
    "vllm_xargs": "that is the OpenAI API's field; put the constraint key ("
    + ", ".join(CONSTRAINT_KEYS)
    + ") in sampling_parameters itself",
}
EXTRA_ARGS_KEY = "extra_args"
STRUCTURED_KEY = "structured_outputs"
# keys settled together by settle_constraint once both places are read
COLLECTED_KEYS = (*CONSTRAINT_KEYS, *CONSTRAINT_OPTIONS, STRUCTURED_KEY)

# Request-level parameters (not sampling settings).
REQUEST_KEYS = ("priority", "triton_enable_empty_final_response", "binary_data_output")
REFUSED_REQUEST_KEYS: dict[str, str] = {
    "sequence_id": "sequence batching is not supported: an LLM's state is its prompt; send the whole text",
    "sequence_start": "sequence batching is not supported: an LLM's state is its prompt; send the whole text",
    "sequence_end": "sequence batching is not supported: an LLM's state is its prompt; send the whole text",
    "timeout": "server-side request timeouts are not supported; set a client deadline (gRPC) or timeout (HTTP): "
    "a cancelled request is aborted in the engine",
}


@dataclass
class Settings:
    """Sampling keyword arguments for SamplingParams plus the request-level settings."""

    sampling: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    empty_final_response: bool = False
    binary_data_output: bool | None = None


def _accepted() -> str:
    return ", ".join(sorted({*SAMPLING_KEYS, *COLLECTED_KEYS, EXTRA_ARGS_KEY}))


def _constraint_value(key: str, value: Any, origin: str) -> Any:
    # a list may arrive as JSON text (gRPC string parameters); a regex is never parsed as JSON
    return _json_value(key, value, origin) if key == "constraint_choice" else value


def _collect_constraint(key: str, value: Any, origin: str, found: dict[str, tuple[str, Any]]) -> None:
    if value is None:
        return
    if key in found:
        raise invalid(
            f"{_where(key, origin)}: '{key}' is also set as {_where(key, found[key][0])}; set it in one place"
        )
    found[key] = (origin, _constraint_value(key, value, origin))


def sampling_kwargs(
    values: dict[str, Any], origin: str, into: dict[str, Any], found: dict[str, tuple[str, Any]]
) -> None:
    """Map `values` into SamplingParams keyword arguments; constraint keys are collected in `found`
    (key -> (origin, value)) and settled by settle_constraint once both places are read."""
    for key, value in values.items():
        if key in REFUSED_KEYS:
            raise invalid(f"{_where(key, origin)} is not supported: {REFUSED_KEYS[key]}")
        if key in COLLECTED_KEYS:
            _collect_constraint(key, value, origin, found)
            continue
        if key == EXTRA_ARGS_KEY:
            if value is None:
                continue
            extra = _json_value(key, value, origin)
            if not isinstance(extra, dict):
                raise invalid(
                    f"{_where(key, origin)}: expected an object of constraint keys "
                    f"({', '.join(CONSTRAINT_KEYS)}), got {short(extra)}"
                )
            for inner, inner_value in extra.items():
                if inner not in CONSTRAINT_KEYS and inner not in CONSTRAINT_OPTIONS:
                    raise invalid(
                        f"{_where(f'{key}.{inner}', origin)} is not supported; this server honours only "
                        f"the constraint keys {', '.join(CONSTRAINT_KEYS + CONSTRAINT_OPTIONS)} in extra_args"
                    )
                _collect_constraint(inner, inner_value, f"{origin} extra_args", found)
            continue
        if key not in SAMPLING_KEYS:
            raise invalid(f"{_where(key, origin)} is not a known sampling setting; accepted: {_accepted()}")
        target, convert = SAMPLING_KEYS[key]
        if target in into:
            raise invalid(
                f"{_where(key, origin)}: '{key}' is set both in the sampling_parameters tensor and in "
                "the request parameters; set it in one place"
            )
        if value is None:
            continue
        into[target] = convert(key, value, origin)


def settle_constraint(found: dict[str, tuple[str, Any]], into: dict[str, Any], support: ConstraintSupport) -> None:
    """At most one constraint (a constraint key, or structured_outputs), honoured only with the
    processor loaded (`support`), valid by the processor's own check and, with the budget on, able to
    end within max_tokens; it goes to SamplingParams.extra_args in the form the OpenAI path sends it.
    structured_outputs goes to vLLM's own backend instead where the server chose one."""
    values = {key: value for key, (_origin, value) in found.items()}
    budget = True
    if values.get("constraint_budget") is not None:
        if problem := budget_problem(values["constraint_budget"]):
            raise invalid(f"{found['constraint_budget'][0]} {problem}")
        budget = budget_on(values["constraint_budget"])
    given = given_keys(values)
    if values.get(STRUCTURED_KEY) is not None:
        where = _where(STRUCTURED_KEY, found[STRUCTURED_KEY][0])
        if given:
            raise invalid(
                f"{where}: give it or a constraint key ({_where(given[0], found[given[0]][0])}), not both: "
                "one constraint per request"
            )
        if not support.structured_by_llmserve:  # vLLM's own backend, chosen at serve time
            into["structured_outputs"] = _structured(STRUCTURED_KEY, values[STRUCTURED_KEY], found[STRUCTURED_KEY][0])
            return
        try:
            obj = structured_outputs_constraint(
                _json_value(STRUCTURED_KEY, values[STRUCTURED_KEY], found[STRUCTURED_KEY][0])
            )
        except StructuredProblem as exc:
            raise invalid(f"{where}: {exc}") from None
        problem = structured_support_problem(support) or _checked(
            lambda: object_problem(
                obj,
                into.get("max_tokens", VLLM_DEFAULT_MAX_TOKENS),
                budget,
                into.get("stop"),
                _budget_limit(into),
                into.get("stop_token_ids"),
            ),
            where,
        )
        if problem is not None:
            raise invalid(f"{where}: {problem}")
        into["extra_args"] = {"constraint": extra_args_value(obj), **_budget_arg(values)}
        return
    if not given:
        return
    key = given[0]
    problem = constraint_problem(values, support)
    if problem is None:
        problem = _checked(
            lambda: validation_problem(
                key,
                values[key],
                into.get("max_tokens", VLLM_DEFAULT_MAX_TOKENS),
                budget,
                into.get("stop"),
                _budget_limit(into),
                into.get("stop_token_ids"),
            ),
            _where(key, found[key][0]),
        )
    if problem is not None:  # "key 'k': ..." gets where it came from; "give one constraint ..." names them all
        raise invalid(f"{found[key][0]} {problem}" if problem.startswith("key '") else problem)
    into["extra_args"] = {key: extra_args_value(values[key]), **_budget_arg(values)}


def _budget_limit(into: dict[str, Any]) -> str | None:
    """What a budget refusal calls max_tokens when the request did not set it."""
    return None if "max_tokens" in into else f"max_tokens={VLLM_DEFAULT_MAX_TOKENS} (the default: set max_tokens)"


def _checked(check: Callable[[], str | None], where: str) -> str | None:
    """The processor's check; anything but the client's ConstraintError is a server fault."""
    try:
        return check()
    except Exception as exc:
        log.exception("constraint check failed")
        raise internal(f"{where}: the constraint check") from exc


def _budget_arg(values: dict[str, Any]) -> dict[str, Any]:
    budget = values.get("constraint_budget")
    return {} if budget is None else {"constraint_budget": budget_on(budget)}


def parse_sampling_tensor(text: str) -> dict[str, Any]:
    try:
        values = load_json(text) if text.strip() else {}
    except JsonProblem as exc:
        raise invalid(f"input 'sampling_parameters' is {exc}") from None
    if not isinstance(values, dict):
        raise invalid(
            "input 'sampling_parameters' must be a JSON object of sampling settings, "
            f'e.g. {{"temperature": 0, "max_tokens": 32}}; got {type(values).__name__}'
        )
    return values


def build_settings(
    tensor_values: dict[str, Any] | None,
    request_params: dict[str, Any],
    *,
    transport: str,
    constraints: ConstraintSupport,
) -> Settings:
    """Map the sampling_parameters tensor and the request parameters; refuse anything unknown.
    `constraints`: whether the engine the request runs on has the constraint processor."""
    settings = Settings()
    found: dict[str, tuple[str, Any]] = {}
    if tensor_values:
        sampling_kwargs(tensor_values, "sampling_parameters", settings.sampling, found)
    rest: dict[str, Any] = {}
    for key, value in request_params.items():
        if key in REFUSED_REQUEST_KEYS:
            raise invalid(f"request parameter '{key}' is not supported: {REFUSED_REQUEST_KEYS[key]}")
        if key == "priority":
            settings.priority = _integer(key, value, "request parameter")
        elif key == "triton_enable_empty_final_response":
            settings.empty_final_response = _boolean(key, value, "request parameter")
        elif key == "binary_data_output":
            if transport != "http":
                raise invalid(
                    "request parameter 'binary_data_output' belongs to the HTTP binary tensor extension; "
                    "gRPC outputs are always raw"
                )
            settings.binary_data_output = _boolean(key, value, "request parameter")
        elif key.startswith("triton_"):
            raise invalid(f"request parameter '{key}' is a Triton-reserved parameter this server does not support")
        else:
            rest[key] = value
    sampling_kwargs(rest, "request parameter", settings.sampling, found)
    settle_constraint(found, settings.sampling, constraints)
    return settings
