"""What every HTTP route of the server shares, whichever protocol it speaks.

A protocol's routes live on an APIRouter from `protocol_router(shape, on_request)`. Its route class
answers the cross-cutting cases in one place, so a route function holds only its own logic:
  - refusals: the protocol's own error types and readiness.NotReady become that protocol's error
    response (an `ErrorShape`: OpenAI {"error": {...}}, KServe v2 {"error": "..."});
  - a client that went away while its answer was computed (disconnect.ClientDisconnected), or before
    its body was read (starlette's ClientDisconnect), gets 499,
    the status the metrics record;
  - timing: given `on_request`, each request is reported once as (endpoint, HTTP status, seconds),
    the endpoint being the route's `name`; seconds run to the response (a streaming route awaits its
    first event before answering, so for a stream: to the first event); an exception that escapes
    the route counts as 500, what the client gets;
  - a failure of the server's own (any other exception): logged, and a 500 in the protocol's shape
    whose message says nothing of the exception.
The route class is carried along when the router is included in an app or another router, so the
KServe v2 routes keep their own error shape on the OpenAI app's port.

`operations_router` is the /health and /metrics pair both HTTP apps serve; `new_app` the bare app.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from llmserve.serve.disconnect import CLIENT_CLOSED, ClientDisconnected
from llmserve.serve.limits import log_safe
from llmserve.serve.readiness import NotReady, Readiness

log = logging.getLogger("llmserve.serve")

OnRequest = Callable[[str, int, float], None]  # e.g. ServerMetrics.observe
Exposition = Callable[[str | None], tuple[bytes, str]]  # Accept header -> page; e.g. ServerMetrics.exposition
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


@dataclass(frozen=True)
class ErrorShape:
    """How one protocol answers a request it refuses."""

    refused: tuple[type[Exception], ...]  # the protocol's own error types, raised by its routes
    render: Callable[[Exception], Response]  # one of `refused`, or NotReady -> the protocol's error response
    internal: Callable[[], Response]  # the protocol's 500 for a failure of the server's own


def protocol_router(shape: ErrorShape, on_request: OnRequest | None = None) -> APIRouter:
    """An APIRouter whose routes answer refusals in `shape`; given on_request, every route on it is
    timed and counted under its name (so a protocol keeps its uncounted routes on a second router)."""

    class ProtocolRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            return _answering(super().get_route_handler(), shape, on_request, self.name)

    return APIRouter(route_class=ProtocolRoute)


def _answering(handler: Handler, shape: ErrorShape, on_request: OnRequest | None, endpoint: str) -> Handler:
    refused: tuple[type[Exception], ...] = (NotReady, *shape.refused)

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except (ClientDisconnected, ClientDisconnect):
            log.info(
                "request %s: the client disconnected; its work was aborted",
                log_safe(request.headers.get("x-request-id", "-")),
            )
            return Response(status_code=CLIENT_CLOSED)
        except refused as exc:
            return shape.render(exc)
        except Exception:
            # a failure of the server's own: 500 in the protocol's shape, with a generic message;
            # the exception (which can name files and internals) goes to the log only
            log.exception("request %s on %s failed", log_safe(request.headers.get("x-request-id", "-")), endpoint)
            return shape.internal()

    if on_request is None:
        return answer

    async def timed(request: Request) -> Response:
        t0, status = time.perf_counter(), 500
        try:
            response = await answer(request)
            status = response.status_code
            return response
        finally:
            on_request(endpoint, status, time.perf_counter() - t0)

    return timed


def operations_router(readiness: Readiness, exposition: Exposition | None) -> APIRouter:
    """/health (the server's phase, 200 only when inference is taken) and, given `exposition`, /metrics."""
    router = APIRouter()

    async def health() -> Response:
        status, ok = readiness.status()
        return JSONResponse({"status": status}, status_code=200 if ok else 503)

    router.add_api_route("/health", health, methods=["GET"], include_in_schema=False)
    if exposition is not None:

        async def metrics(request: Request) -> Response:
            # on a worker thread: reading the multiprocess files and any remote scrape (bounded by its timeout)
            # never hold the event loop that serves inference
            body, content_type = await asyncio.to_thread(exposition, request.headers.get("accept"))
            return Response(body, media_type=content_type)

        router.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    return router


def new_app(title: str) -> FastAPI:
    """A FastAPI app without the generated docs routes (they are not part of either API)."""
    return FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
