"""The OpenAI routes' calls into vLLM's serving objects, and what their answers become.

vLLM's request models validate what the field table (fields.py) forwarded; a serving object answers
with a response model, a stream, or vLLM's ErrorResponse, which is re-shaped into OpenAI's error
object. Every vLLM import here is deferred to the first request: the frontends open their ports
(answering "starting") before the engine step, and importing vLLM takes seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmserve.serve.openai.errors import RequestRejected, error_body


def request_model(kind: str) -> Any:
    """vLLM's pydantic request model for a route kind (chat, completion, embedding)."""
    # deferred (module docstring)
    if kind == "chat":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest
    if kind == "completion":
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        return CompletionRequest
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    return EmbeddingCompletionRequest


def validated(kind: str, forwarded: dict[str, Any]) -> Any:
    """The forwarded fields as vLLM's request model; its validation errors are 400s naming the field."""
    try:
        return request_model(kind).model_validate(forwarded)
    except ValueError as exc:
        raise _pydantic_rejection(exc) from exc


def _pydantic_rejection(exc: ValueError) -> RequestRejected:
    errors = exc.errors() if hasattr(exc, "errors") else []
    if errors:
        first = errors[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
        param = loc[0] if loc else None
        msg = first.get("msg", str(exc)).removeprefix("Value error, ")
        return RequestRejected(f"field '{'.'.join(loc)}': {msg}" if loc else msg, param=param)
    return RequestRejected(str(exc))


async def engine_call(call: Callable[[Any, Request], Awaitable[Any]], req: Any, request: Request) -> Any:
    """Run a vLLM serving call; its validation errors become 400s naming the parameter."""
    from vllm.exceptions import VLLMValidationError  # deferred (module docstring)

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


def result_response(result: Any) -> Response:
    """A serving call's answer as an HTTP response: vLLM's ErrorResponse in OpenAI's error shape, a
    response model as JSON, a response as is, anything else (an async generator of SSE lines) streamed."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse  # deferred (module docstring)

    if isinstance(result, ErrorResponse):
        return _vllm_error(result)
    if isinstance(result, Response):
        return result
    if hasattr(result, "model_dump"):
        return JSONResponse(result.model_dump())
    return StreamingResponse(result, media_type="text/event-stream")


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
