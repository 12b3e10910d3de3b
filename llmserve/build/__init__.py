"""`llmserve build`: a service image from the lock, through the Docker Engine API.

    render_context(pkg, lock, out)   Dockerfile + context from templates/build/ (llmserve.build.context)
    check_context(ctx, vllm, ...)    check-compat on the rendered context; a misfit stops the build
    connect() / run_build / push     the docker SDK against DOCKER_HOST (llmserve.build.engine)

Layer: above compat (it runs check-compat) and below the CLI; the docker SDK is imported only when an
engine is used, so rendering (`--dry-run`) needs no `build` extra.
"""

from __future__ import annotations

from llmserve.build.context import RenderedContext, check_context, default_base, render_context, write_report
from llmserve.build.errors import (
    BuildInputError,
    BuildStepError,
    CompatCheckFailedError,
    EngineUnreachableError,
    PushRefusedError,
    UnknownBaseError,
)

__all__ = [
    "BuildInputError",
    "BuildStepError",
    "CompatCheckFailedError",
    "EngineUnreachableError",
    "PushRefusedError",
    "RenderedContext",
    "UnknownBaseError",
    "check_context",
    "default_base",
    "render_context",
    "write_report",
]
