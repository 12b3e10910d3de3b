"""OpenAI-compatible HTTP routes on the shared engine.

Choice: the routes are llmserve's own (field-fate check, model check, limits, error shape), and the
work is done by vLLM 0.32's own OpenAI serving objects (OpenAIServingChat / Completion /
ServingEmbedding), called in-process on our AsyncLLM. Those objects are what `vllm serve` runs:
chat templates, tokenization, structured outputs, logprobs, echo, SSE chunking and usage accounting
come out exactly as vLLM's server produces them, with no extra hop, so the only added cost per
request is one JSON parse and a dictionary walk over the request's fields. Writing handlers on
AsyncLLM.generate directly would have duplicated ~3k lines of vLLM's protocol code and its bugs.

Readiness, refusals, client disconnects and timing are answered by the shared route class
(llmserve/serve/routing.py); the routes here raise RequestRejected and NotReady.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from llmserve.serve.constraint_checks import request_check
from llmserve.serve.constraint_keys import openai_constrained, openai_constraints_known
from llmserve.serve.disconnect import unless_disconnected
from llmserve.serve.limits import JsonProblem, OverCap, load_json, log_safe
from llmserve.serve.openai.engine_calls import engine_call, result_response, validated
from llmserve.serve.openai.errors import RequestRejected
from llmserve.serve.openai.fields import TABLES, over_cap_problem, read_caps
from llmserve.serve.openai.logprobs import fix_logprobs
from llmserve.serve.openai.request_check import check_request, prompt_chars
from llmserve.serve.readiness import Readiness
from llmserve.serve.routing import ErrorShape, Exposition, OnRequest, new_app, operations_router, protocol_router

log = logging.getLogger("llmserve.serve.openai")

PROMPT_FIELD = {"chat": "messages", "completion": "prompt", "embedding": "input"}


def _render(exc: Exception) -> Response:
    # ErrorShape.render gets a RequestRejected (the one `refused` type) or NotReady
    rejected = (
        exc
        if isinstance(exc, RequestRejected)
        else RequestRejected(
            "the server is not ready (engine starting or server draining)", code="not_ready", status=503
        )
    )
    return JSONResponse(rejected.body(), status_code=rejected.status)


def _internal() -> Response:
    failed = RequestRejected("the request failed on the server; its log has the details", code=None, status=500)
    return JSONResponse(failed.body(), status_code=500)


OPENAI_ERRORS = ErrorShape(refused=(RequestRejected,), render=_render, internal=_internal)


def _name_param(exc: RequestRejected, kind: str) -> None:
    """Point a generation refusal without a param at the field it is about."""
    if exc.code == "context_length_exceeded" and exc.param is None:
        exc.param = PROMPT_FIELD[kind]
    elif exc.param is None and exc.message.split(" ", 1)[0] in TABLES[kind]:
        exc.param = exc.message.split(" ", 1)[0]  # vLLM names the field first, without a param


class OpenAIRoutes:
    """The route functions, over the server's readiness (and through it, the engine handle)."""

    def __init__(self, readiness: Readiness, max_prompt_chars: int):
        self.readiness = readiness
        self.max_prompt_chars = max_prompt_chars

    async def models(self) -> Response:
        handle = self.readiness.engine_for_inference()
        listing = (await handle.state.openai_serving_models.show_available_models()).model_dump()
        for card in listing.get("data", []):
            # vLLM reports the weights folder as `root`: a path inside this server's cache, which is
            # no client's business; the served name is what `root` means for a base model
            card["root"] = card["id"]
            card["parent"] = None
        return JSONResponse(listing)

    async def chat(self, request: Request) -> Response:
        return await self._generate("chat", request)

    async def completions(self, request: Request) -> Response:
        return await self._generate("completion", request)

    async def embeddings(self, request: Request) -> Response:
        handle, forwarded = await self._parse("embedding", request)
        serving = getattr(handle.state, "serving_embedding", None)
        if not handle.embeds or serving is None:
            raise RequestRejected(
                f"the model '{handle.model_name}' is not a pooling model, so it has no embeddings; package an "
                "embedding model (engine: runner: pooling, convert: embed) to use /v1/embeddings",
                param="model",
                code="model_not_supported",
            )
        req = validated("embedding", forwarded)
        return result_response(await unless_disconnected(request, engine_call(serving, req, request)))

    async def _generate(self, kind: str, request: Request) -> Response:
        try:
            handle, forwarded = await self._parse(kind, request)
            if not handle.generates:
                raise RequestRejected(
                    f"the model '{handle.model_name}' is a pooling model and does not generate text; "
                    "use /v1/embeddings",
                    param="model",
                    code="model_not_supported",
                )
            state = handle.state
            fix_logprobs(state)  # top_logprobs: the k most likely tokens (logprobs.py)
            call = (
                state.openai_serving_chat.create_chat_completion
                if kind == "chat"
                else state.openai_serving_completion.create_completion
            )
            req = validated(kind, forwarded)
            result = await unless_disconnected(request, engine_call(call, req, request))
        except RequestRejected as exc:
            _name_param(exc, kind)
            raise
        return result_response(result)

    async def _parse(self, kind: str, request: Request) -> tuple[Any, dict[str, Any]]:
        """The engine handle and the fields for vLLM's request model, from a request the server takes."""
        handle = self.readiness.engine_for_inference()
        raw = await request.body()
        try:
            body = load_json(raw, read_caps(kind))
        except JsonProblem as exc:
            raise RequestRejected(f"the request body is {exc}", code="invalid_json") from None
        except OverCap as exc:
            problem = over_cap_problem(exc.key, exc.cap)
            raise RequestRejected(f"field '{exc.key}': {problem}", param=exc.key, code="unsupported_value") from None
        # on a worker thread: a new constraint is compiled by the check (milliseconds, up to its time budget)
        # a new constraint's check queues on the check threads; a known one's is answered from memory
        constrained = openai_constrained(body) and not await asyncio.to_thread(openai_constraints_known, body)
        forwarded, consumed = await request_check(
            check_request, kind, body, handle.constraints, constrained=constrained
        )
        self._check_model_and_size(kind, body, handle)
        if consumed.get("user") or consumed.get("safety_identifier"):
            # client-supplied text: escaped and bounded, so it cannot forge or flood log lines
            log.info(
                "request %s user=%s safety_identifier=%s",
                log_safe(request.headers.get("x-request-id", "-")),
                log_safe(consumed.get("user")),
                log_safe(consumed.get("safety_identifier")),
            )
        return handle, forwarded

    def _check_model_and_size(self, kind: str, body: dict[str, Any], handle: Any) -> None:
        if body["model"] != handle.model_name:
            raise RequestRejected(
                f"the model '{body['model']}' does not exist; this server serves '{handle.model_name}'",
                param="model",
                code="model_not_found",
            )
        max_n, n = getattr(handle, "max_n", None), body.get("n")
        if max_n is not None and isinstance(n, int) and not isinstance(n, bool) and n > max_n:
            # each choice is a sequence in the batch and in the KV cache (--max-n, EngineHandle.max_n)
            raise RequestRejected(f"n is {n}; this server's limit is {max_n} choices per request (--max-n)", param="n")
        chars = prompt_chars(kind, body)
        if chars > self.max_prompt_chars:
            raise RequestRejected(
                f"the prompt is {chars} characters; this server's limit is {self.max_prompt_chars} "
                f"(--max-prompt-chars) and the model's context is {handle.max_model_len} tokens",
                param=PROMPT_FIELD[kind],
                code="context_length_exceeded",
            )


def openai_router(readiness: Readiness, *, max_prompt_chars: int, on_request: OnRequest | None) -> APIRouter:
    """The /v1 routes; chat, completion and embedding requests are timed and counted under those names."""
    routes = OpenAIRoutes(readiness, max_prompt_chars)
    router = protocol_router(OPENAI_ERRORS)
    router.add_api_route("/v1/models", routes.models, methods=["GET"])
    counted = protocol_router(OPENAI_ERRORS, on_request)
    counted.add_api_route("/v1/chat/completions", routes.chat, methods=["POST"], name="chat")
    counted.add_api_route("/v1/completions", routes.completions, methods=["POST"], name="completion")
    counted.add_api_route("/v1/embeddings", routes.embeddings, methods=["POST"], name="embedding")
    router.include_router(counted)
    return router


def build_app(
    readiness: Readiness,
    *,
    max_prompt_chars: int,
    metrics: Exposition,
    on_request: OnRequest,
) -> FastAPI:
    app = new_app("llmserve OpenAI-compatible API")
    app.include_router(operations_router(readiness, metrics))
    app.include_router(openai_router(readiness, max_prompt_chars=max_prompt_chars, on_request=on_request))
    return app
