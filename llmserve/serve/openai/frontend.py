"""The OpenAI-compatible HTTP frontend: FastAPI app behind the guards, served by uvicorn.

The KServe v2 HTTP routes are mounted on the same app, so one HTTP port serves both APIs.
"""

from __future__ import annotations

from typing import Any

from llmserve.serve.http_guards import Guards
from llmserve.serve.http_server import UvicornFrontend
from llmserve.serve.kserve.http_routes import BodyLimits, build_router
from llmserve.serve.metrics import ServerMetrics
from llmserve.serve.openai.app import build_app
from llmserve.serve.readiness import Readiness


class OpenAIFrontend(UvicornFrontend):
    name = "openai"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        api_key: str | None,
        max_body_bytes: int,
        max_prompt_chars: int,
        metrics: ServerMetrics,
        kserve_model_version: int | None = None,
    ):
        super().__init__(host, port)
        self._api_key = api_key
        self.max_body_bytes, self.max_prompt_chars = max_body_bytes, max_prompt_chars
        self.metrics = metrics
        self.kserve_model_version = kserve_model_version

    def build(self, readiness: Readiness) -> Any:
        app = build_app(
            readiness,
            max_prompt_chars=self.max_prompt_chars,
            metrics=self.metrics.exposition,
            on_request=self.metrics.observe,
        )
        if self.kserve_model_version is not None:
            app.include_router(
                build_router(
                    readiness,
                    model_version=self.kserve_model_version,
                    on_request=self.metrics.observe,
                    limits=BodyLimits(self.max_body_bytes, self.max_prompt_chars),
                )
            )
        return Guards(app, api_key=self._api_key, max_body_bytes=self.max_body_bytes)
