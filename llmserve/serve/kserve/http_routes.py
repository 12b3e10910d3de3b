"""KServe v2 over HTTP/REST (plus Triton's generate extension), as a FastAPI router.

`build_router(readiness, model_version=...)` gives the APIRouter that the OpenAI app mounts (one
HTTP port) and that KServeHttpFrontend (http_frontend.py) serves alone.

Routes ({v} optional everywhere as /versions/{v}):
    GET  /v2                          server metadata
    GET  /v2/health/live | ready      200, or 503 while starting/draining
    GET  /v2/models/{m}               model metadata (tensors from LLM_TEXT_CONTRACT)
    GET  /v2/models/{m}/ready         200 or 503 (404 for a model this server does not serve)
    GET  /v2/models/{m}/config        Triton model configuration (decoupled)
    POST /v2/models/{m}/infer         JSON tensors, or the binary tensor extension
                                      (Inference-Header-Content-Length); gzip/deflate bodies accepted,
                                      413 once one inflates past --max-body-bytes
    POST /v2/models/{m}/generate      generate extension: one JSON response
    POST /v2/models/{m}/generate_stream  SSE: one `data:` event per text delta
Errors are {"error": "<message>"} with 400 (bad request; a prompt over --max-prompt-chars too),
413 (a body over --max-body-bytes, decompressed), 404 (unknown model/version/route),
501 (a Triton extension this server does not implement), 503 (not ready); the shared route class
(llmserve/serve/routing.py) renders them, and answers 499 for a client gone mid-request.
Metrics: infer, generate and generate_stream call on_request(endpoint, HTTP status, seconds) with
endpoint kserve_http_infer / kserve_http_generate / kserve_http_generate_stream (seconds: to the
response, to the first event for generate_stream); health and metadata routes are not counted, as
the OpenAI app does not count /health and /v1/models.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmserve.serve.constraint_checks import request_check
from llmserve.serve.constraint_keys import kserve_constrained
from llmserve.serve.disconnect import unless_disconnected
from llmserve.serve.kserve.errors import UNIMPLEMENTED, KServeError, internal, invalid, not_found, not_ready
from llmserve.serve.kserve.generation import Delta, generate_deltas, generate_text
from llmserve.serve.kserve.http_codec import (
    HEADER_LENGTH,
    decode_generate_body,
    decode_infer_body,
    infer_response,
    request_body,
    sse_event,
)
from llmserve.serve.kserve.protocol import (
    DecodedTensor,
    GenerationRequest,
    ModelResolver,
    Served,
    build_generation,
    model_config,
    model_metadata,
    server_metadata,
)
from llmserve.serve.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_CHARS
from llmserve.serve.readiness import Readiness
from llmserve.serve.routing import ErrorShape, OnRequest, protocol_router

UNIMPLEMENTED_PATHS = {
    "stats": "per-model statistics are exported as Prometheus metrics on /metrics instead",
    "repository": "this server serves one model from its package; there is no model repository",
    "systemsharedmemory": "shared-memory tensors are not supported; send tensors in the request",
    "cudasharedmemory": "CUDA shared-memory tensors are not supported; send tensors in the request",
    "trace": "tracing settings are not supported",
    "logging": "log settings are set at startup (LLMSERVE_DEBUG), not over the API",
}


def _render(exc: Exception) -> Response:
    # ErrorShape.render gets a KServeError (the one `refused` type) or NotReady
    err = exc if isinstance(exc, KServeError) else not_ready()
    return JSONResponse(err.body(), status_code=err.http_status)


def _internal() -> Response:
    err = internal("the request")
    return JSONResponse(err.body(), status_code=err.http_status)


KSERVE_ERRORS = ErrorShape(refused=(KServeError,), render=_render, internal=_internal)


class KServeRoutes:
    """The route functions, over the model resolver (readiness, served model name and version)."""

    def __init__(self, readiness: Readiness, model_version: str | int | None, limits: BodyLimits):
        self.resolver = ModelResolver(readiness, model_version)
        self.limits = limits

    async def server_meta(self) -> Response:
        return JSONResponse(server_metadata())

    async def live(self) -> Response:
        return JSONResponse({"live": True})

    async def ready(self) -> Response:
        ok = self.resolver.server_ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def model_meta(self, model: str, version: str = "") -> Response:
        return JSONResponse(model_metadata(self.resolver.resolve(model, version, for_inference=False)))

    async def model_ready(self, model: str, version: str = "") -> Response:
        served = self.resolver.current()
        if served is not None and (model != served.name or version not in ("", served.version)):
            raise not_found(
                f"unknown model '{model}'"
                + (f" version '{version}'" if version else "")
                + f": this server serves '{served.name}' (version {served.version})"
            )
        ok = self.resolver.model_ready(model, version)
        return JSONResponse({"name": model, "ready": ok}, status_code=200 if ok else 503)

    async def config(self, model: str, version: str = "") -> Response:
        return JSONResponse(model_config(self.resolver.resolve(model, version, for_inference=False)))

    async def infer(self, model: str, request: Request, version: str = "") -> Response:
        served = self.resolver.resolve(model, version, for_inference=True)
        tensors, params, binary_out, request_id = decode_infer_body(
            await request_body(request, self.limits.max_body_bytes), request.headers.get(HEADER_LENGTH)
        )
        # on a worker thread: a new constraint is compiled by the check (milliseconds, up to its time budget)
        req = await request_check(
            build_generation,
            tensors,
            params,
            constrained=kserve_constrained(params, tensors),
            transport="http",
            streaming_transport=False,
            constraints=served.handle.constraints,
            max_prompt_chars=self.limits.max_prompt_chars,
        )
        if binary_out is None:
            binary_out = bool(req.settings.binary_data_output)
        text = await unless_disconnected(request, generate_text(served.handle, req, request_id))
        return infer_response(served, request_id, text, binary_out)

    async def generate(self, model: str, request: Request, version: str = "") -> Response:
        served, req, request_id = await self._prepare_generate(model, version, request, streaming=False)
        text = await unless_disconnected(request, generate_text(served.handle, req, request_id or None))
        return JSONResponse({"model_name": served.name, "model_version": served.version, "text_output": text})

    async def generate_stream(self, model: str, request: Request, version: str = "") -> Response:
        served, req, request_id = await self._prepare_generate(model, version, request, streaming=True)
        deltas = generate_deltas(served.handle, req, request_id or None)
        first = await deltas.__anext__()  # errors before the first token still get a status code
        return StreamingResponse(
            _events(served, first, deltas),
            media_type="text/event-stream; charset=utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def other(self, rest: str) -> Response:
        for part in rest.split("/"):
            if part in UNIMPLEMENTED_PATHS:
                raise KServeError(
                    UNIMPLEMENTED, f"/v2/{rest} is not implemented by llmserve: {UNIMPLEMENTED_PATHS[part]}"
                )
        raise not_found(f"/v2/{rest} is not a KServe v2 route of this server")

    async def _prepare_generate(
        self, model: str, version: str, request: Request, *, streaming: bool
    ) -> tuple[Served, GenerationRequest, str]:
        served = self.resolver.resolve(model, version, for_inference=True)
        if request.headers.get(HEADER_LENGTH) is not None:
            raise invalid(
                "the generate extension takes a JSON body; the binary tensor extension "
                "(Inference-Header-Content-Length) is for /infer"
            )
        tensors, params, request_id = decode_generate_body(await request_body(request, self.limits.max_body_bytes))
        if streaming and not any(t.name == "stream" for t in tensors):
            # generate_stream streams unless the body says "stream": false
            tensors.append(DecodedTensor("stream", "BOOL", [1], [True]))
        # on a worker thread: a new constraint is compiled by the check (milliseconds, up to its time budget)
        req = await request_check(
            build_generation,
            tensors,
            params,
            constrained=kserve_constrained(params, tensors),
            transport="generate",
            streaming_transport=streaming,
            constraints=served.handle.constraints,
            max_prompt_chars=self.limits.max_prompt_chars,
        )
        if req.settings.binary_data_output is not None:
            raise invalid("parameter 'binary_data_output' belongs to /infer; generate answers JSON")
        return served, req, request_id


async def _events(served: Served, first: Delta, deltas: AsyncGenerator[Delta, None]) -> AsyncIterator[bytes]:
    """The SSE events of generate_stream; an error after the first event is sent as an error event."""

    def event(d: Delta) -> bytes:
        return sse_event({"model_name": served.name, "model_version": served.version, "text_output": d.text})

    try:
        yield event(first)
        async for d in deltas:
            yield event(d)
    except KServeError as err:
        yield sse_event(err.body())
    finally:
        await deltas.aclose()


@dataclass(frozen=True)
class BodyLimits:
    """The server's --max-body-bytes (for a decompressed body) and --max-prompt-chars."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS


def build_router(
    readiness: Readiness,
    *,
    model_version: str | int | None = None,
    on_request: OnRequest | None = None,
    limits: BodyLimits | None = None,
) -> APIRouter:
    """KServe v2 routes on the shared engine; mount with app.include_router(...).

    on_request(endpoint, status, seconds), e.g. ServerMetrics.observe, is called once per inference request.
    limits: the server's body and prompt limits (default: `llmserve serve`'s defaults).
    """
    routes = KServeRoutes(readiness, model_version, limits or BodyLimits())
    router = protocol_router(KSERVE_ERRORS)
    router.add_api_route("/v2", routes.server_meta, methods=["GET"], include_in_schema=False)
    router.add_api_route("/v2/health/live", routes.live, methods=["GET"], include_in_schema=False)
    router.add_api_route("/v2/health/ready", routes.ready, methods=["GET"], include_in_schema=False)
    _model_route(router, "GET", "", routes.model_meta)
    _model_route(router, "GET", "/ready", routes.model_ready)
    _model_route(router, "GET", "/config", routes.config)
    counted = protocol_router(KSERVE_ERRORS, on_request)
    _model_route(counted, "POST", "/infer", routes.infer, "kserve_http_infer")
    _model_route(counted, "POST", "/generate", routes.generate, "kserve_http_generate")
    _model_route(counted, "POST", "/generate_stream", routes.generate_stream, "kserve_http_generate_stream")
    router.include_router(counted)
    # last: the catch-all answers only what no route above matched
    router.add_api_route(
        "/v2/{rest:path}", routes.other, methods=["GET", "POST", "PUT", "DELETE"], include_in_schema=False
    )
    return router


def _model_route(
    router: APIRouter, method: str, suffix: str, route: Callable[..., Any], name: str | None = None
) -> None:
    for path in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        router.add_api_route(path + suffix, route, methods=[method], name=name, include_in_schema=False)
