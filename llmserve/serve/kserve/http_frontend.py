"""KServe v2 over HTTP on its own port (for `llmserve serve` without --openai).

The routes are http_routes.py's router; this adds /health (for probes) and /metrics, as the OpenAI
app has them, behind the same guards (llmserve/serve/http_guards.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from llmserve.serve.http_guards import Guards
from llmserve.serve.http_server import UvicornFrontend
from llmserve.serve.kserve.http_routes import BodyLimits, build_router
from llmserve.serve.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_CHARS
from llmserve.serve.metrics import ServerMetrics
from llmserve.serve.readiness import Readiness
from llmserve.serve.routing import Exposition, OnRequest, new_app, operations_router

__all__ = ["KServeHttpFrontend", "build_app", "build_router"]


def build_app(
    readiness: Readiness,
    *,
    model_version: str | int | None = None,
    on_request: OnRequest | None = None,
    metrics: Exposition | None = None,
    limits: BodyLimits | None = None,
) -> FastAPI:
    """The standalone KServe v2 HTTP app: the router plus /health and, given `metrics`
    (ServerMetrics.exposition), /metrics."""
    app = new_app("llmserve KServe v2")
    app.include_router(operations_router(readiness, metrics))
    app.include_router(build_router(readiness, model_version=model_version, on_request=on_request, limits=limits))
    return app


class KServeHttpFrontend(UvicornFrontend):
    """The Frontend (llmserve/serve/frontend.py) for KServe v2 over HTTP, on its own port."""

    name = "kserve-http"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        model_version: str | int | None = None,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
        metrics: ServerMetrics | None = None,
    ):
        super().__init__(host, port)
        self.model_version = model_version
        self._api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.max_prompt_chars = max_prompt_chars
        self.metrics = metrics  # None: record nothing

    def build(self, readiness: Readiness) -> Any:
        m = self.metrics
        app = build_app(
            readiness,
            model_version=self.model_version,
            on_request=m.observe if m else None,
            metrics=m.exposition if m else None,
            limits=BodyLimits(self.max_body_bytes, self.max_prompt_chars),
        )
        return Guards(app, api_key=self._api_key, max_body_bytes=self.max_body_bytes)
