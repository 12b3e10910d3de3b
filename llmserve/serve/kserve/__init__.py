"""KServe v2 inference protocol frontends (gRPC and HTTP, with Triton's generate extension) on the
shared vLLM engine, so tritonclient and any KServe v2 client call the model the OpenAI API serves.

Public surface:
    KServeGrpcFrontend(host, port, *, model_version, api_key, max_message_bytes, metrics)   a Frontend
    KServeHttpFrontend(host, port, *, model_version, api_key, max_body_bytes, metrics)      a Frontend
    build_router(readiness, *, model_version, on_request)    the HTTP routes, to mount on the OpenAI app
(metrics: a ServerMetrics that counts and times the inference requests; on_request: its observe)
Tensor names and types: llmserve.formats.tensors.LLM_TEXT_CONTRACT (see protocol.py for semantics);
sampling settings: sampling.py (the mapping table). Importing this package does not import vLLM.

Modules: protocol.py (model resolution, tensors -> one generation request), sampling.py (settings),
generation.py (running it on the engine), errors.py (one error for both transports), http_codec.py
(HTTP bodies), http_routes.py (the HTTP router), http_frontend.py (HTTP on its own port),
grpc_frontend.py (the gRPC servicer and frontend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmserve.serve.kserve.grpc_frontend import KServeGrpcFrontend
    from llmserve.serve.kserve.http_frontend import KServeHttpFrontend
    from llmserve.serve.kserve.http_routes import build_router

__all__ = ["KServeGrpcFrontend", "KServeHttpFrontend", "build_router"]


def __getattr__(name: str) -> Any:
    # lazy: grpc and fastapi (the serve extra) load only when a frontend is used, not for `llmserve --help`
    if name == "KServeGrpcFrontend":
        from llmserve.serve.kserve.grpc_frontend import KServeGrpcFrontend

        return KServeGrpcFrontend
    if name == "KServeHttpFrontend":
        from llmserve.serve.kserve.http_frontend import KServeHttpFrontend

        return KServeHttpFrontend
    if name == "build_router":
        from llmserve.serve.kserve.http_routes import build_router

        return build_router
    raise AttributeError(name)
