"""The fate of every request field of the OpenAI APIs this server implements.

No field is silently dropped: each one is either honoured (the `how` says by what) or rejected with
HTTP 400 naming it. A field absent from these tables is rejected as unknown. `null` means "not set"
for every optional field, as in OpenAI's API. A conformance test enumerates the fields of the
installed `openai` package's request TypedDicts and checks each one has an entry here.

`check(value, ctx)` returns a problem for a value this server cannot honour (the field is then
rejected), or None. `forward` says what reaches vLLM's request model: the field as is (`pass`),
nothing because llmserve itself honoured it (`consume`), or a rewrite (a callable returning a dict
of fields to merge into the request).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

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
    response_format_constraint,
    schema_problem,
    structured_outputs_constraint,
    structured_support_problem,
    validation_problem,
)
from llmserve.serve.limits import (
    MAX_EMBEDDING_INPUTS,
    MAX_MESSAGES,
    MAX_OPENAI_STOP_STRINGS,
    MAX_PROMPTS,
    MAX_STOP_CHARS,
    MAX_TOKEN_LIST,
    VLLM_DEFAULT_MAX_TOKENS,
)


@dataclass(frozen=True)
class CheckContext:
    """What a field's check may look at besides the field's value."""

    body: dict[str, Any]  # the whole request: some values are only valid with another field's value
    constraints: ConstraintSupport  # whether the engine behind this server runs the constraint processor
    kind: str = "chat"  # the endpoint: "chat" or "completion" (their defaults differ)


Check = Callable[[Any, CheckContext], "str | None"]
# what reaches vLLM's request model: "pass", "consume", or a rewrite into fields to merge
Forward = Literal["pass", "consume"] | Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Fate:
    honoured: bool
    how: str
    check: Check | None = None
    forward: Forward = "pass"


def rejected(why: str) -> Fate:
    return Fate(False, why)


def honoured(how: str, check: Check | None = None, forward: Forward = "pass") -> Fate:
    return Fate(True, how, check, forward)


# ---- value checks -------------------------------------------------------------------------------


def _one_of(*allowed: Any) -> Check:
    def check(value: Any, ctx: CheckContext) -> str | None:
        if value not in allowed:
            return f"value {value!r} is not supported; supported: {', '.join(repr(a) for a in allowed)}"
        return None

    return check


def _check_messages(value: Any, ctx: CheckContext) -> str | None:
    if not isinstance(value, list) or not value:
        return "must be a non-empty array of messages"
    if len(value) > MAX_MESSAGES:  # each message is a turn of the chat template's render
        return f"at most {MAX_MESSAGES} messages are accepted, got {len(value)}"
    allowed_roles = {"system", "developer", "user", "assistant"}
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            return f"messages[{i}] must be an object"
        role = msg.get("role")
        if role not in allowed_roles:
            return (
                f"messages[{i}].role {role!r} is not supported (tool and function messages need tool "
                f"calling, which this server does not offer); supported: {', '.join(sorted(allowed_roles))}"
            )
        for key, val in msg.items():
            if key in ("role", "content") or val is None:
                continue
            if key == "refusal":
                continue  # an earlier assistant refusal: its text is the turn's content, kept by the template
            return f"messages[{i}].{key} is not supported (the chat template does not render it)"
        content = msg.get("content")
        if content is None and role != "assistant":
            return f"messages[{i}].content is required"
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    return f"messages[{i}].content[{j}]: content part type {kind!r} is not supported; this model takes text parts only"
        elif content is not None and not isinstance(content, str):
            return f"messages[{i}].content must be a string or an array of text parts"
    return None


def _check_response_format(value: Any, ctx: CheckContext) -> str | None:
    if not isinstance(value, dict):
        return "must be an object with a `type`"
    kind = value.get("type")
    if kind in ("text", "json_object"):
        extra = set(value) - {"type"}
        return f"unexpected key(s) {sorted(extra)} for type {kind!r}" if extra else None
    if kind != "json_schema":
        return f"type {kind!r} is not supported; supported: 'text', 'json_object', 'json_schema'"
    extra = set(value) - {"type", "json_schema"}
    if extra:
        hint = " (`strict` goes inside `json_schema`)" if "strict" in extra else ""
        return f"unexpected key(s) {sorted(extra)} for type 'json_schema'{hint}"
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return "type 'json_schema' needs `json_schema` with a `name` and a `schema`"
    extra = set(spec) - {"name", "schema", "description", "strict"}
    if extra:
        return f"unexpected key(s) {sorted(extra)} in json_schema"
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        return "json_schema.schema must be a JSON Schema object"
    problem = schema_problem(schema)
    return f"json_schema.schema is not a valid JSON Schema {problem}" if problem else None


def _response_format(value: Any, ctx: CheckContext) -> str | None:
    problem = _check_response_format(value, ctx)
    if problem is not None or value.get("type") == "text":
        return problem
    return _one_structured_field("response_format", ctx) or _llmserve_check(
        lambda: response_format_constraint(value), ctx
    )


def _structured_outputs(value: Any, ctx: CheckContext) -> str | None:
    return _one_structured_field("structured_outputs", ctx) or _llmserve_check(
        lambda: structured_outputs_constraint(value), ctx
    )


def _one_structured_field(name: str, ctx: CheckContext) -> str | None:
    """A structured-output field beside another, or beside a constraint key: which one should win
    would be a guess, so the request is refused (whichever backend serves structured outputs)."""
    other = "structured_outputs" if name == "response_format" else "response_format"
    rf = ctx.body.get("response_format")
    if ctx.body.get(other) is not None and (other != "response_format" or _asks_json(rf)):
        return "give response_format or structured_outputs, not both"
    xargs = ctx.body.get("vllm_xargs")
    given = given_keys(xargs) if isinstance(xargs, dict) else []
    if given:
        return f"give it or a constraint key (vllm_xargs '{given[0]}'), not both: one constraint per request"
    return None


def _asks_json(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") in ("json_object", "json_schema")


def _max_tokens(ctx: CheckContext) -> int | None:
    value = ctx.body.get("max_completion_tokens", ctx.body.get("max_tokens"))
    if ctx.kind == "completion" and "max_tokens" not in ctx.body:  # null: what the context leaves
        return VLLM_DEFAULT_MAX_TOKENS
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _budget_limit(ctx: CheckContext) -> str | None:
    """What a budget refusal calls max_tokens when the client did not set it."""
    if ctx.kind == "completion" and "max_tokens" not in ctx.body:
        return f"max_tokens={VLLM_DEFAULT_MAX_TOKENS} (the default of /v1/completions: set max_tokens)"
    return None


def _stop_ids(ctx: CheckContext) -> Any:
    return ctx.body.get("stop_token_ids")


def _budget(body: dict[str, Any]) -> bool:
    xargs = body.get("vllm_xargs")
    return budget_on(xargs.get("constraint_budget", True)) if isinstance(xargs, dict) else True


def _llmserve_check(translate: Callable[[], dict[str, Any] | None], ctx: CheckContext) -> str | None:
    """With llmserve's engine serving structured outputs: the field as a constraint, checked by the
    processor (an unsupported keyword or an impossible budget is a 400 naming the field). With one of
    vLLM's backends the field goes to vLLM as it is (vLLM's request model checks it)."""
    if not ctx.constraints.structured_by_llmserve:
        return None
    try:
        obj = translate()
    except StructuredProblem as exc:
        return str(exc)
    if obj is None:
        return None
    return structured_support_problem(ctx.constraints) or object_problem(
        obj, _max_tokens(ctx), _budget(ctx.body), ctx.body.get("stop"), _budget_limit(ctx), _stop_ids(ctx)
    )


def structured_constraint(body: dict[str, Any]) -> dict[str, Any] | None:
    """The constraint a checked request's structured-output field asks for (None: none)."""
    if _asks_json(body.get("response_format")):
        return response_format_constraint(body["response_format"])
    if body.get("structured_outputs") is not None:
        return structured_outputs_constraint(body["structured_outputs"])
    return None


def route_structured(body: dict[str, Any], forwarded: dict[str, Any], constraints: ConstraintSupport) -> None:
    """With llmserve's engine serving structured outputs, `response_format` / `structured_outputs`
    reach vLLM as the processor's constraint in vllm_xargs (never as vLLM's own structured outputs)."""
    if not constraints.structured_by_llmserve:
        return
    forwarded.pop("response_format", None)
    forwarded.pop("structured_outputs", None)
    obj = structured_constraint(body)
    if obj is not None:
        forwarded["vllm_xargs"] = {**(forwarded.get("vllm_xargs") or {}), "constraint": extra_args_value(obj)}


def _check_stream_options(value: Any, ctx: CheckContext) -> str | None:
    if not isinstance(value, dict):
        return "must be an object"
    if not ctx.body.get("stream"):
        return "is only allowed with stream: true"
    extra = set(value) - {"include_usage", "include_obfuscation", "continuous_usage_stats"}
    if extra:
        return f"unknown key(s) {sorted(extra)}"
    if value.get("include_obfuscation"):
        return "include_obfuscation: true is not supported (stream events are never padded)"
    return None


def _strip_obfuscation(value: Any) -> dict:
    return {"stream_options": {k: v for k, v in value.items() if k != "include_obfuscation"}}


def _no_tools(value: Any, ctx: CheckContext) -> str | None:
    if value:
        return "tool calling is not offered by this server (no tool-call parser is configured for this model)"
    return None


def _tool_choice(value: Any, ctx: CheckContext) -> str | None:
    return None if value == "none" else "only 'none' is supported: this server does not offer tool calling"


def _cache_options(value: Any, ctx: CheckContext) -> str | None:
    if not isinstance(value, dict) or set(value) - {"mode"} or value.get("mode", "implicit") != "implicit":
        return "only {'mode': 'implicit'} is supported (automatic prefix caching; no explicit cache TTL)"
    return None


def _prompts(value: Any, most: int) -> str | None:
    def is_tokens(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(t, int) for t in v)

    if isinstance(value, str) or is_tokens(value):
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) or is_tokens(v) for v in value):
        # each prompt of a batch is its own engine request
        return f"at most {most} prompts are accepted in one request, got {len(value)}" if len(value) > most else None
    return "must be a string, an array of strings, an array of token ids or an array of token-id arrays"


def _completion_prompt(value: Any, ctx: CheckContext) -> str | None:
    return _prompts(value, MAX_PROMPTS)


def _best_of(value: Any, ctx: CheckContext) -> str | None:
    return (
        None if value in (1, ctx.body.get("n", 1)) else "best_of > n is not supported; use n and choose on the client"
    )


def _embedding_input(value: Any, ctx: CheckContext) -> str | None:
    return _prompts(value, MAX_EMBEDDING_INPUTS)


# Sizes of the fields applied at every decode step (llmserve/serve/limits.py); vLLM's own request
# model checks their types and values after these.


def _check_stop(value: Any, ctx: CheckContext) -> str | None:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        return None  # the type is vLLM's request model's to refuse
    if len(stops) > MAX_OPENAI_STOP_STRINGS:
        return f"at most {MAX_OPENAI_STOP_STRINGS} stop strings are accepted (as OpenAI's API takes), got {len(stops)}"
    if any(isinstance(v, str) and len(v) > MAX_STOP_CHARS for v in stops):
        return f"a stop string may have at most {MAX_STOP_CHARS} characters"
    return None


def _at_most_entries(what: str) -> Check:
    def check(value: Any, ctx: CheckContext) -> str | None:
        if isinstance(value, (list, dict)) and len(value) > MAX_TOKEN_LIST:
            return f"at most {MAX_TOKEN_LIST} {what} are accepted, got {len(value)}"
        return None

    return check


def _empty_or_none(what: str) -> Check:
    def check(value: Any, ctx: CheckContext) -> str | None:
        return None if value in ("", [], {}) else f"is not supported: {what}"

    return check


# ---- constraints (vllm_xargs) -------------------------------------------------------------------

# The request keys of llmserve's constraint processor (llmserve.constraints.vllm_processor), the only
# keys of `vllm_xargs` this server honours; checked by llmserve.serve.constraint_keys, which the KServe v2
# frontends share. Objects are sent to vLLM as JSON strings, because vLLM's `vllm_xargs` only carries
# strings, numbers and lists of those into SamplingParams.extra_args.


def _check_vllm_xargs(value: Any, ctx: CheckContext) -> str | None:
    if not isinstance(value, dict):
        return "must be an object"
    for key in value:
        if key not in CONSTRAINT_KEYS and key not in CONSTRAINT_OPTIONS:
            return (
                f"key '{key}' is not supported; this server honours only the constraint keys "
                f"{', '.join(CONSTRAINT_KEYS + CONSTRAINT_OPTIONS)}"
            )
    if value.get("constraint_budget") is not None and (problem := budget_problem(value["constraint_budget"])):
        return problem
    problem = constraint_problem(value, ctx.constraints)
    given = given_keys(value)
    if problem is None and given:
        # the processor's own check, here rather than in vLLM's validate_params: the 400 then names the key
        problem = validation_problem(
            given[0],
            value[given[0]],
            _max_tokens(ctx),
            _budget(ctx.body),
            ctx.body.get("stop"),
            _budget_limit(ctx),
            _stop_ids(ctx),
        )
    return problem


def _forward_vllm_xargs(value: Any) -> dict:
    out = {k: extra_args_value(v) for k, v in value.items() if v is not None}
    return {"vllm_xargs": out} if out else {}


_VLLM_XARGS = honoured(
    "constraint keys only (constraint, constraint_regex, constraint_choice, constraint_json_schema) and "
    "constraint_budget (default true: the answer is steered to end within max_tokens; false: off): "
    "llmserve's constraint processor enforces them in the decode loop; an invalid constraint, or one "
    "whose shortest answer needs more than max_tokens, is a 400; any other key is a 400",
    _check_vllm_xargs,
    _forward_vllm_xargs,
)


_CONSUME: Forward = "consume"

# ---- shared fields ------------------------------------------------------------------------------

_SAMPLING = {
    "frequency_penalty": honoured("vLLM SamplingParams.frequency_penalty"),
    "presence_penalty": honoured("vLLM SamplingParams.presence_penalty"),
    "logit_bias": honoured(
        "vLLM logit-bias logits processor (token id -> bias; at most 1024 entries)", _at_most_entries("entries")
    ),
    "max_tokens": honoured("vLLM SamplingParams.max_tokens (default: the rest of the context)"),
    "n": honoured("vLLM SamplingParams.n: n choices from one prompt"),
    "seed": honoured("vLLM SamplingParams.seed: per-request generator"),
    "stop": honoured(
        "vLLM SamplingParams.stop (at most 4 strings, as OpenAI's, of at most 1000 characters)", _check_stop
    ),
    "stream": honoured("server-sent events, one chunk per engine step, then [DONE]"),
    "stream_options": honoured("include_usage: a final usage chunk", _check_stream_options, _strip_obfuscation),
    "temperature": honoured("vLLM SamplingParams.temperature"),
    "top_p": honoured("vLLM SamplingParams.top_p"),
    "user": honoured(
        "recorded in this server's request log line (escaped, at most 200 characters); not sent to the engine",
        forward=_CONSUME,
    ),
    "model": honoured("must name the served model (400 model_not_found otherwise)"),
}

# vLLM extensions that are part of this server's documented API (honoured by vLLM's sampler).
VLLM_EXTENSIONS = {
    "top_k": honoured("vLLM SamplingParams.top_k (extension)"),
    "min_p": honoured("vLLM SamplingParams.min_p (extension)"),
    "repetition_penalty": honoured("vLLM SamplingParams.repetition_penalty (extension)"),
    "min_tokens": honoured("vLLM SamplingParams.min_tokens (extension)"),
    "ignore_eos": honoured("vLLM SamplingParams.ignore_eos (extension): fixed-length outputs"),
    "stop_token_ids": honoured(
        "vLLM SamplingParams.stop_token_ids (extension; at most 1024)", _at_most_entries("token ids")
    ),
    "include_stop_str_in_output": honoured("vLLM SamplingParams.include_stop_str_in_output (extension)"),
    "skip_special_tokens": honoured("vLLM SamplingParams.skip_special_tokens (extension)"),
    "prompt_logprobs": honoured("vLLM SamplingParams.prompt_logprobs (extension): log-probabilities of prompt tokens"),
    "vllm_xargs": _VLLM_XARGS,
    "structured_outputs": honoured(
        "vLLM's structured outputs (extension): json, json_object, regex or choice served by llmserve's "
        "constraint processor (answers end within max_tokens; grammar, structural_tag and whitespace_pattern "
        "are a 400); with --structured-outputs-backend guidance|xgrammar|... vLLM's own backend serves it",
        _structured_outputs,
    ),
}

CHAT_FIELDS: dict[str, Fate] = {
    **_SAMPLING,
    "messages": honoured("rendered with the model's chat template (text parts only)", _check_messages),
    "logprobs": honoured("vLLM SamplingParams.logprobs of sampled tokens (llmserve/serve/openai/logprobs.py)"),
    "top_logprobs": honoured(
        "the k most likely tokens at each position, most likely first, from vLLM SamplingParams.logprobs "
        "(llmserve/serve/openai/logprobs.py)"
    ),
    "max_completion_tokens": honoured("vLLM SamplingParams.max_tokens"),
    "response_format": honoured(
        "text: unconstrained; json_object (a JSON object) / json_schema (strict or not): llmserve's "
        "constraint processor, compact JSON that ends within max_tokens (a schema keyword it does not "
        "support, or a max_tokens below the shortest answer, is a 400 saying so); with "
        "--structured-outputs-backend guidance|xgrammar|... vLLM's own backend; an invalid JSON Schema is a 400",
        _response_format,
    ),
    "tools": honoured("an empty list only (no tool-call parser for this model)", _no_tools, _CONSUME),
    "tool_choice": honoured("'none' only: no tool calls are made", _tool_choice, _CONSUME),
    "parallel_tool_calls": honoured("trivially: no tools are accepted, so no tool calls are made", None, _CONSUME),
    "functions": rejected("deprecated function calling is not offered by this server"),
    "function_call": rejected("deprecated function calling is not offered by this server"),
    "audio": rejected("audio output is not offered: this is a text model"),
    "modalities": honoured("['text'] only", _one_of(["text"]), _CONSUME),
    "prediction": rejected("predicted outputs (speculative decoding from client content) are not offered"),
    "web_search_options": rejected("web search is not offered by this server"),
    "metadata": honoured(
        "empty only: this server stores no completions", _empty_or_none("this server stores no completions"), _CONSUME
    ),
    "store": honoured("false only: this server stores no completions", _one_of(False), _CONSUME),
    "service_tier": honoured(
        "'auto' or 'default' (the one tier this server has)", _one_of("auto", "default"), _CONSUME
    ),
    "reasoning_effort": honoured("'none' only: this model has no reasoning controls", _one_of("none"), _CONSUME),
    "verbosity": rejected("verbosity control is not offered for this model"),
    "moderation": rejected("moderation is not offered by this server"),
    "safety_identifier": honoured(
        "recorded in this server's request log line; not sent to the engine", forward=_CONSUME
    ),
    "prompt_cache_key": honoured(
        "vLLM cache_salt: only requests with the same key share prefix-cache blocks",
        forward=lambda v: {"cache_salt": str(v)},
    ),
    "prompt_cache_retention": honoured("'in_memory' only (the engine's KV cache)", _one_of("in_memory"), _CONSUME),
    "prompt_cache_options": honoured("{'mode': 'implicit'} only: automatic prefix caching", _cache_options, _CONSUME),
    # vLLM chat extensions
    **VLLM_EXTENSIONS,
    "add_generation_prompt": honoured("chat template add_generation_prompt (extension)"),
    "continue_final_message": honoured("continue the last assistant message (extension)"),
    "echo": honoured("prepend the last message's content to the answer (extension)"),
}

COMPLETION_FIELDS: dict[str, Fate] = {
    **_SAMPLING,
    "prompt": honoured("tokenized by the model's tokenizer (strings or token ids)", _completion_prompt),
    "echo": honoured(
        "the prompt is returned before the completion (with its log-probs when logprobs is set); "
        "with max_tokens 0 this is prefill-only scoring"
    ),
    "logprobs": honoured(
        "top_logprobs: the N most likely tokens per position, most likely first; the sampled token's in "
        "token_logprobs (llmserve/serve/openai/logprobs.py)"
    ),
    "best_of": honoured("only equal to n (or 1)", _best_of, _CONSUME),
    "suffix": honoured(
        "empty only: insertion (fill-in-the-middle) is not offered",
        _empty_or_none("insertion is not offered"),
        _CONSUME,
    ),
    **VLLM_EXTENSIONS,
}

EMBEDDING_FIELDS: dict[str, Fate] = {
    "input": honoured("tokenized by the model's tokenizer (strings or token ids)", _embedding_input),
    "model": honoured("must name the served model (400 model_not_found otherwise)"),
    "encoding_format": honoured("'float' or 'base64'", _one_of("float", "base64")),
    "dimensions": rejected("truncating embeddings to fewer dimensions is not offered for this model"),
    "user": honoured("recorded in this server's request log line; not sent to the engine", forward=_CONSUME),
}

TABLES = {"chat": CHAT_FIELDS, "completion": COMPLETION_FIELDS, "embedding": EMBEDDING_FIELDS}

# Top-level arrays with a fixed cap (checked by the fields' checks above): the body reader refuses an
# over-cap one as soon as it has read cap + 1 items (llmserve/serve/limits.py load_json), so 100k
# messages cost what 2049 do. (`prompt` and `input` are not here: one prompt may be a token-id list.)
LIST_CAPS: dict[str, tuple[int, str]] = {
    "messages": (MAX_MESSAGES, "messages"),
    "stop": (MAX_OPENAI_STOP_STRINGS, "stop strings"),
    "stop_token_ids": (MAX_TOKEN_LIST, "token ids"),
}


def read_caps(kind: str) -> dict[str, int]:
    """The LIST_CAPS of the fields a request of this kind takes, for load_json."""
    return {key: cap for key, (cap, _) in LIST_CAPS.items() if key in TABLES[kind]}


def over_cap_problem(key: str, cap: int) -> str:
    """The fields' own words for an array refused while the body was read (its full length unknown)."""
    return f"at most {cap} {LIST_CAPS[key][1]} are accepted, got more"


REQUIRED = {"chat": ("model", "messages"), "completion": ("model", "prompt"), "embedding": ("model", "input")}
