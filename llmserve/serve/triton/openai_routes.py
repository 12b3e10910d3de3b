"""The OpenAI API over Triton: /v1/chat/completions, /v1/completions and /v1/models, each request run as one KServe
v2 ModelStreamInfer call on the Triton vLLM backend's tensors (text_input, stream, sampling_parameters,
exclude_input_in_output, and the additional outputs finish_reason, num_input_tokens, num_output_tokens).

Chat messages are rendered here with the package's own chat template (its tokenizer files), so the engine inside
Triton sees the prompt the embedded engine would. Every request field is honoured or refused with HTTP 400 naming
it (FIELDS below; a field not listed is refused as unknown). The sampling settings are checked here by the same
table the KServe frontends and the vLLM backend use (llmserve.serve.kserve.sampling) before Triton sees them.
`response_format` becomes the structured-output parameter under the key the lock pins for the Triton line
(`structured_outputs` from vLLM 0.11 / Triton 25.11 on, `guided_decoding` before), so JSON asked for is enforced
in the engine; the constraint keys (`vllm_xargs`, with `constraint_budget`) reach llmserve's constraint processor.
On llmserve's vLLM backend for Triton (vllm_model.py) `structured_outputs` is served by llmserve's constraint
processor, as on the embedded engine (the server's --structured-outputs-backend reaches it in the engine
overrides); on NVIDIA's stock backend, by vLLM's. The check here is llmserve's (a grammar is refused).
Python-backend LLM packages (`python.frontend: llm-text`) are served too, through the protocol of their contract
(llmserve.serve.triton.text_protocols: token counts and finish reason derived here, structured outputs refused).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmserve.serve.constraint_checks import request_check
from llmserve.serve.constraint_keys import CONSTRAINT_KEYS, CONSTRAINT_OPTIONS, ConstraintSupport, openai_constrained
from llmserve.serve.disconnect import CLIENT_CLOSED, ClientDisconnected, unless_disconnected
from llmserve.serve.kserve.errors import KServeError
from llmserve.serve.kserve.sampling import build_settings
from llmserve.serve.limits import MAX_OPENAI_STOP_STRINGS, VLLM_DEFAULT_MAX_TOKENS, JsonProblem, load_json
from llmserve.serve.openai.errors import RequestRejected, error_body
from llmserve.serve.readiness import Readiness
from llmserve.serve.triton.text_protocols import VLLM_TEXT, TextProtocol

log = logging.getLogger("llmserve.serve.openai")

# Fields whose "off" value is honoured trivially (the feature is not used), refused otherwise, with why.
_NOT_THROUGH_TRITON = "is not available through Triton's text protocol (text in, text out)"
OFF_ONLY = {
    "logprobs": f"token log-probabilities {_NOT_THROUGH_TRITON}",
    "top_logprobs": f"token log-probabilities {_NOT_THROUGH_TRITON}",
    "echo": "echoing the prompt is not offered through Triton",
    "logit_bias": "logit_bias is not offered through Triton (token ids of this tokenizer: use vllm_xargs constraints)",
    "tools": "tool calling is not offered through Triton",
    "tool_choice": "tool calling is not offered through Triton",
    "functions": "function calling is not offered through Triton",
    "function_call": "function calling is not offered through Triton",
    "parallel_tool_calls": "tool calling is not offered through Triton",
    "audio": "audio output is not offered",
    "modalities": "only text output is offered",
    "prediction": "predicted outputs are not offered",
    "web_search_options": "web search is not offered",
    "store": "stored completions are not offered",
    "metadata": "stored completions are not offered",
    "service_tier": "service tiers are not offered",
    "reasoning_effort": "this model has no reasoning settings",
    "verbosity": "this model has no verbosity setting",
    "prompt_cache_key": "prompt caching by key is not offered (vLLM caches prefixes by content)",
    "safety_identifier": "safety identifiers are not recorded by this server",
    "suffix": "insertion (fill-in-the-middle) is not offered",
    "prompt_logprobs": f"prompt log-probabilities {_NOT_THROUGH_TRITON}",
}
# OpenAI name -> sampling_parameters key (the same name unless given).
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    # vLLM extensions
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids",
    "include_stop_str_in_output": "include_stop_str_in_output",
    "skip_special_tokens": "skip_special_tokens",
}
HANDLED_HERE = {"model", "messages", "prompt", "stream", "stream_options", "n", "best_of", "response_format"}
HANDLED_HERE |= {"vllm_xargs", "user"}  # user: an end-user id for the caller's records; not sent to the engine
HANDLED_HERE |= {"structured_outputs"}  # vLLM's field, as the embedded engine takes it
# vLLM's older names, refused with the way out (as the embedded engine refuses them)
RENAMED = {
    "guided_json": "use response_format (json_schema) or structured_outputs: {'json': <schema>}",
    "guided_regex": "use structured_outputs: {'regex': <pattern>}",
    "guided_choice": "use structured_outputs: {'choice': [...]}",
    "guided_grammar": "grammars are not supported by llmserve's constraint engine",
    "guided_decoding_backend": "the backend is chosen when the server starts (--structured-outputs-backend)",
}


@dataclass
class TritonLLM:
    """A generating model Triton hosts, as the OpenAI routes need it: its name, chat-template renderer (None: the
    tokenizer has none) and the text protocol its backend speaks."""

    name: str
    render_chat: Callable[[list[dict[str, Any]]], str] | None
    protocol: TextProtocol = VLLM_TEXT
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Call:
    model: str
    prompt: str
    params: dict[str, Any]
    stream: bool
    include_usage: bool
    protocol: TextProtocol = VLLM_TEXT


def _is_off(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def _refuse(name: str, why: str) -> RequestRejected:
    return RequestRejected(f"field '{name}': {why}", param=name)


def build_call(kind: str, body: dict[str, Any], models: dict[str, TritonLLM], so_key: str) -> Call:
    """The Triton call for an OpenAI request body; RequestRejected (400/404) naming the field otherwise."""
    if not isinstance(body, dict):
        raise RequestRejected("the request body must be a JSON object")
    params = _sampling_fields(body)
    model = body.get("model")
    if model is None:
        raise RequestRejected(f"field 'model' is required: one of {', '.join(models)}", param="model")
    if model not in models:
        raise RequestRejected(
            f"model '{model}' is not served here; served: {', '.join(models)}",
            param="model",
            code="model_not_found",
            status=404,
        )
    llm = models[model]
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise _refuse(name, "only 1: Triton's text protocol returns one text per request")
    if not llm.protocol.structured:
        _refuse_structured(body, model)
    _response_format(body.get("response_format"), params, so_key)
    if body.get("structured_outputs") is not None:
        if so_key in params:
            raise _refuse("structured_outputs", "give response_format or structured_outputs, not both")
        params[so_key] = body["structured_outputs"]  # checked by the backend's sampling table, named there
    _constraints(body.get("vllm_xargs"), params)
    default_max_tokens = VLLM_DEFAULT_MAX_TOKENS if kind == "completion" else llm.protocol.default_max_tokens
    if default_max_tokens is not None:
        params.setdefault("max_tokens", default_max_tokens)
    stream, include_usage = _stream_fields(body)
    try:  # the same checks the backend runs, so that a bad value is a 400 here
        build_settings(params, {}, transport="grpc", constraints=ConstraintSupport(True))
    except KServeError as exc:
        raise RequestRejected(exc.message) from None
    prompt = _chat_prompt(body, llm) if kind == "chat" else _completion_prompt(body)
    return Call(model, prompt, params, stream, include_usage, llm.protocol)


def _refuse_structured(body: dict[str, Any], model: str) -> None:
    why = (
        f"model '{model}' is a Python-backend model (llm-text contract): structured outputs and constraints are "
        "enforced only by the vLLM backend"
    )
    response_format = body.get("response_format")
    if response_format is not None and not (
        isinstance(response_format, dict) and response_format.get("type") == "text"
    ):
        raise _refuse("response_format", why)
    for name in ("vllm_xargs", "structured_outputs"):
        if body.get(name) is not None:
            raise _refuse(name, why)


def _sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling_parameters the body's fields map to; unknown fields and features in use that Triton cannot
    give are refused by name."""
    params: dict[str, Any] = {}
    stop = body.get("stop")
    if isinstance(stop, list) and len(stop) > MAX_OPENAI_STOP_STRINGS:
        raise _refuse("stop", f"at most {MAX_OPENAI_STOP_STRINGS} stop strings are accepted (as OpenAI's API takes)")
    for name, value in body.items():
        if name in OFF_ONLY:
            if not _is_off(value):
                raise _refuse(name, OFF_ONLY[name])
        elif name in SAMPLING_FIELDS:
            if value is not None:
                key = SAMPLING_FIELDS[name]
                if key in params:
                    raise _refuse(name, "give max_tokens or max_completion_tokens, not both")
                params[key] = value
        elif name in RENAMED:
            raise _refuse(name, RENAMED[name])
        elif name not in HANDLED_HERE:
            raise _refuse(name, "unknown field")
    return params


def _stream_fields(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _refuse("stream", "must be a boolean")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"} or (options and not stream):
        raise _refuse("stream_options", "only {'include_usage': bool}, and only with stream: true")
    return stream, bool(options.get("include_usage"))


def _response_format(value: Any, params: dict[str, Any], so_key: str) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        params[so_key] = {"json_object": True}
    elif kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise _refuse("response_format", "json_schema needs {'name': ..., 'schema': {...}}")
        params[so_key] = {"json": spec["schema"]}
    else:
        raise _refuse("response_format", "type must be 'text', 'json_object' or 'json_schema'")


def _constraints(value: Any, params: dict[str, Any]) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) - set(CONSTRAINT_KEYS) - set(CONSTRAINT_OPTIONS):
        raise _refuse(
            "vllm_xargs",
            f"only llmserve's constraint keys are taken through Triton: {CONSTRAINT_KEYS + CONSTRAINT_OPTIONS}",
        )
    params.update(value)


def _chat_prompt(body: dict[str, Any], model: TritonLLM) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _refuse("messages", "a non-empty list of {role, content} messages is required")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant"):
            raise _refuse(f"messages[{i}]", "role must be system, developer, user or assistant")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise _refuse(f"messages[{i}].content", "only text parts are taken")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise _refuse(f"messages[{i}].content", "must be text")
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise _refuse(f"messages[{i}]", f"unsupported keys {sorted(extra)} through Triton")
        role = "system" if message["role"] == "developer" else message["role"]
        rendered.append({"role": role, "content": content})
    if model.render_chat is None:
        raise _refuse("messages", f"model '{model.name}' has no chat template in its tokenizer: use /v1/completions")
    return model.render_chat(rendered)


def _completion_prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise _refuse("prompt", f"one text prompt per request through Triton, got {len(prompt)}: send one each")
    if not isinstance(prompt, str) or not prompt:
        raise _refuse("prompt", "one non-empty text prompt (token-id prompts are not taken through Triton)")
    return prompt


# --- the Triton call -------------------------------------------------------------------------------------------


@dataclass
class Piece:
    text: str
    final: bool
    finish_reason: str | None
    prompt_tokens: int
    output_tokens: int


async def run(client: Any, call: Call) -> AsyncIterator[Piece]:
    """The call's pieces from Triton (streamed, or one whole answer; the last one final); RequestRejected or
    RuntimeError on an error."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, (datatype, value) in call.protocol.inputs(call.prompt, call.stream, call.params).items():
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    read = call.protocol.reader(call.prompt, call.params)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": call.model, "inputs": inputs, "enable_empty_final_response": True}

    responses = client.stream_infer(requests())
    try:
        async for result, error in responses:
            if error is not None:
                raise _triton_failure(str(error))
            piece = Piece(*read(result))
            yield piece
            if piece.final:
                return
    finally:
        responses.cancel()  # the client went away or the answer is complete: Triton's request ends too


def _triton_failure(message: str) -> Exception:
    if "maximum context length" in message or "maximum model length" in message:
        return RequestRejected(message, code="context_length_exceeded")
    known = ("refused by the engine", "is not a known sampling setting", "unsupported sampling parameter")
    if any(text in message for text in known):
        return RequestRejected(message)
    log.error("Triton failed a request: %s", message)
    return RuntimeError(message)


# --- routes ----------------------------------------------------------------------------------------------------


def build_router(
    readiness: Readiness, models: dict[str, TritonLLM], client_for: Callable[[], Any], so_key: str
) -> APIRouter:
    router = APIRouter()

    async def list_models() -> Response:
        data = [
            {"id": m.name, "object": "model", "created": m.created, "owned_by": "llmserve"} for m in models.values()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def chat(request: Request) -> Response:
        return await _serve(request, "chat")

    async def completions(request: Request) -> Response:
        return await _serve(request, "completion")

    async def _serve(request: Request, kind: str) -> Response:
        if not readiness.accepting:
            return JSONResponse(error_body(503, "the server is not ready", code="not_ready"), status_code=503)
        try:
            body = load_json(await request.body())
        except JsonProblem as exc:
            return JSONResponse(error_body(400, f"the request body is {exc}"), status_code=400)
        try:
            # off the event loop: checking a new constraint compiles it (up to its time budget)
            call = await request_check(build_call, kind, body, models, so_key, constrained=openai_constrained(body))
        except RequestRejected as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        pieces = run(client_for(), call)
        if call.stream:
            return StreamingResponse(_sse(kind, call, pieces), media_type="text/event-stream")

        async def collect() -> list[Piece]:
            return [p async for p in pieces]

        try:
            # a client that disconnects ends the Triton call (its gRPC stream is cancelled), and so the generation
            collected = await unless_disconnected(request, collect())
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        except RequestRejected as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except RuntimeError as exc:
            return JSONResponse(error_body(502, f"Triton: {exc}", code="upstream_error"), status_code=502)
        return JSONResponse(_whole(kind, call, collected))

    router.add_api_route("/v1/models", list_models, methods=["GET"])
    router.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    router.add_api_route("/v1/completions", completions, methods=["POST"])
    return router


def _ids(kind: str) -> tuple[str, str, str]:
    if kind == "chat":
        return f"chatcmpl-{uuid.uuid4().hex}", "chat.completion", "chat.completion.chunk"
    return f"cmpl-{uuid.uuid4().hex}", "text_completion", "text_completion"


def _usage(pieces: list[Piece]) -> dict[str, int]:
    prompt = pieces[0].prompt_tokens if pieces else 0
    completion = sum(p.output_tokens for p in pieces)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _whole(kind: str, call: Call, pieces: list[Piece]) -> dict[str, Any]:
    rid, obj, _ = _ids(kind)
    text = "".join(p.text for p in pieces)
    reason = pieces[-1].finish_reason if pieces else None
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    created = int(time.time())
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": call.model,
        "choices": [choice],
        "usage": _usage(pieces),
    }


async def _sse(kind: str, call: Call, pieces: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
    rid, _, obj = _ids(kind)
    created = int(time.time())
    seen: list[Piece] = []

    def chunk(delta_text: str | None, reason: str | None, first: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if delta_text is not None:
                delta["content"] = delta_text
            choice["delta"] = delta
        else:
            choice["text"] = delta_text or ""
        body = {"id": rid, "object": obj, "created": created, "model": call.model, "choices": [choice]}
        if call.include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n".encode()

    try:
        if kind == "chat":
            yield chunk("", None, first=True)
        async for piece in pieces:
            seen.append(piece)
            if piece.text:
                yield chunk(piece.text, None)
            if piece.final:
                yield chunk(None if kind == "chat" else "", piece.finish_reason)
        if call.include_usage:
            usage = {"id": rid, "object": obj, "created": created, "model": call.model, "choices": []}
            yield f"data: {json.dumps({**usage, 'usage': _usage(seen)})}\n\n".encode()
    except (RequestRejected, RuntimeError) as exc:
        message = exc.message if isinstance(exc, RequestRejected) else f"Triton: {exc}"
        yield f"data: {json.dumps(error_body(400 if isinstance(exc, RequestRejected) else 502, message))}\n\n".encode()
    yield b"data: [DONE]\n\n"
