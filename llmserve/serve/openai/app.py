"""OpenAI-compatible HTTP routes on the shared engine.

Choice: the routes are llmserve's own (field-fate check, model check, limits, error shape), and the
work is done by vLLM 0.32's own OpenAI serving objects (OpenAIServingChat / Completion /
ServingEmbedding), called in-process on our AsyncLLM. Those objects are what `vllm serve` runs:
chat templates, tokenization, structured outputs, logprobs, echo, SSE chunking and usage accounting
come out exactly as vLLM's server produces them, with no extra hop, so the only added cost per
request is one JSON parse and a dictionary walk over the request's fields. Writing handlers on
AsyncLLM.generate directly would have duplicated ~3k lines of vLLM's protocol code and its bugs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmserve.serve.disconnect import CLIENT_CLOSED, ClientDisconnected, unless_disconnected
from llmserve.serve.openai.errors import RequestRejected, error_body
from llmserve.serve.openai.fields import TABLES
from llmserve.serve.openai.request_check import check_request, prompt_chars
from llmserve.serve.readiness import Readiness

log = logging.getLogger("llmserve.serve.openai")


def _error(exc: RequestRejected) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _vllm_error(err: Any) -> JSONResponse:
    """vLLM's ErrorResponse -> OpenAI's error shape (code: a string, not the HTTP status)."""
    status = int(err.error.code or 400)
    message = err.error.message
    code = (
        "context_length_exceeded"
        if "context length" in message.lower() or "maximum model length" in message.lower()
        else None
    )
    return JSONResponse(error_body(status, message, err.error.param, code), status_code=status)


def _pydantic_rejection(exc: Exception) -> RequestRejected:
    errors = exc.errors() if hasattr(exc, "errors") else []
    if errors:
        first = errors[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
        param = loc[0] if loc else None
        msg = first.get("msg", str(exc)).removeprefix("Value error, ")
        return RequestRejected(f"field '{'.'.join(loc)}': {msg}" if loc else msg, param=param)
    return RequestRejected(str(exc))


async def _engine_call(call: Callable, req: Any, request: Request) -> Any:
    """Run a vLLM serving call; its validation errors become 400s naming the parameter."""
    from vllm.exceptions import VLLMValidationError

    try:
        return await call(req, request)
    except VLLMValidationError as exc:
        msg = str(exc).split(" (parameter=")[0]
        param = None if exc.parameter == "input_tokens" else exc.parameter
        too_long = exc.parameter == "input_tokens" or "maximum context length" in msg
        code = "context_length_exceeded" if too_long else "invalid_value"
        raise RequestRejected(msg, param=param, code=code) from exc
    except (ValueError, TypeError, NotImplementedError) as exc:
        msg = str(exc) or type(exc).__name__
        code = "context_length_exceeded" if "maximum context length" in msg else "invalid_value"
        raise RequestRejected(msg, code=code) from exc


def build_app(
    readiness: Readiness,
    *,
    max_prompt_chars: int,
    metrics: Callable[[], tuple[bytes, str]],
    on_request: Callable[[str, int, float], None],
) -> FastAPI:
    app = FastAPI(title="llmserve OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> Response:
        status, ok = readiness.status()
        return JSONResponse({"status": status}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prom() -> Response:
        body, content_type = metrics()
        return Response(body, media_type=content_type)

    def handle() -> Any:
        h = readiness.handle
        if h is None or not readiness.accepting:
            raise RequestRejected(
                "the server is not ready (engine starting or server draining)", code="not_ready", status=503
            )
        return h

    @app.get("/v1/models")
    async def models() -> Response:
        try:
            h = handle()
        except RequestRejected as exc:
            return _error(exc)
        listing = await h.state.openai_serving_models.show_available_models()
        return JSONResponse(listing.model_dump())

    async def parse(kind: str, request: Request) -> tuple[Any, dict, dict]:
        h = handle()
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestRejected(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
        forwarded, consumed = check_request(kind, body)
        if body["model"] != h.model_name:
            raise RequestRejected(
                f"the model '{body['model']}' does not exist; this server serves '{h.model_name}'",
                param="model",
                code="model_not_found",
            )
        chars = prompt_chars(kind, body)
        if chars > max_prompt_chars:
            field = {"chat": "messages", "completion": "prompt", "embedding": "input"}[kind]
            raise RequestRejected(
                f"the prompt is {chars} characters; this server's limit is {max_prompt_chars} "
                f"(--max-prompt-chars) and the model's context is {h.max_model_len} tokens",
                param=field,
                code="context_length_exceeded",
            )
        if consumed.get("user") or consumed.get("safety_identifier"):
            log.info(
                "request %s user=%s safety_identifier=%s",
                request.headers.get("x-request-id", "-"),
                consumed.get("user"),
                consumed.get("safety_identifier"),
            )
        return h, forwarded, consumed

    async def generate(kind: str, request: Request) -> Response:
        try:
            h, forwarded, _ = await parse(kind, request)
            if not h.generates:
                raise RequestRejected(
                    f"the model '{h.model_name}' is a pooling model and does not generate text; use /v1/embeddings",
                    param="model",
                    code="model_not_supported",
                )
            if kind == "chat":
                from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as Model

                serving = h.state.openai_serving_chat
                call = serving.create_chat_completion
            else:
                from vllm.entrypoints.openai.completion.protocol import CompletionRequest as Model

                serving = h.state.openai_serving_completion
                call = serving.create_completion
            try:
                req = Model.model_validate(forwarded)
            except ValueError as exc:
                raise _pydantic_rejection(exc) from exc
            result = await unless_disconnected(request, _engine_call(call, req, request))
        except ClientDisconnected:
            log.info(
                "request %s: the client disconnected; generation aborted", request.headers.get("x-request-id", "-")
            )
            return Response(status_code=CLIENT_CLOSED)
        except RequestRejected as exc:
            if exc.code == "context_length_exceeded" and exc.param is None:
                exc.param = "messages" if kind == "chat" else "prompt"
            elif exc.param is None and exc.message.split(" ", 1)[0] in TABLES[kind]:
                exc.param = exc.message.split(" ", 1)[0]  # vLLM names the field first, without a param
            return _error(exc)
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        if isinstance(result, ErrorResponse):
            return _vllm_error(result)
        if hasattr(result, "model_dump"):
            return JSONResponse(result.model_dump())
        return StreamingResponse(result, media_type="text/event-stream")

    async def timed(kind: str, run: Callable, request: Request) -> Response:
        t0 = time.perf_counter()
        response = await run(kind, request)
        on_request(kind, response.status_code, time.perf_counter() - t0)
        return response

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await timed("chat", generate, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await timed("completion", generate, request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await timed("embedding", embed, request)

    async def embed(kind: str, request: Request) -> Response:
        try:
            h, forwarded, _ = await parse("embedding", request)
            serving = getattr(h.state, "serving_embedding", None)
            if not h.embeds or serving is None:
                raise RequestRejected(
                    f"the model '{h.model_name}' is not a pooling model, so it has no embeddings; package an "
                    "embedding model (engine: runner: pooling, convert: embed) to use /v1/embeddings",
                    param="model",
                    code="model_not_supported",
                )
            from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

            try:
                req = EmbeddingCompletionRequest.model_validate(forwarded)
            except ValueError as exc:
                raise _pydantic_rejection(exc) from exc
            result = await unless_disconnected(request, _engine_call(serving, req, request))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        except RequestRejected as exc:
            return _error(exc)
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        if isinstance(result, ErrorResponse):
            return _vllm_error(result)
        if isinstance(result, Response):
            return result
        return JSONResponse(result.model_dump())

    return app
