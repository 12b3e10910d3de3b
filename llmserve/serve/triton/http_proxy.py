"""KServe v2 HTTP in front of Triton (executionMode embedded): llmserve's port, guards (API key, body size) and
/health, Triton's answers; with --openai, the OpenAI API over Triton on the same port (openai_routes.py).

Every /v2 route is forwarded to the Triton on loopback unchanged (method, path, query, body, content headers; the one
exception: a generate body for an llm-text model gets its sampling settings moved into `sampling_parameters`, where
the model reads them; for a vLLM-backend model, object and list parameters written as the JSON text Triton passes on:
llm_text_generate.py), and
Triton's answer comes back as it is sent, streamed: `generate_stream` server-sent events arrive as Triton writes
them, and a client that disconnects closes Triton's request. The API key is checked by the guards and never
forwarded. Until the server is ready, and while it drains, /v2 routes get 503 (health routes: 200 live, 503 ready),
as on the embedded engine.

One answer is not Triton's as sent: `/infer` on a decoupled model (the LLM), which Triton refuses on HTTP, is sent
again over gRPC as a one-request ModelStreamInfer and its one response written back as KServe v2 HTTP
(http_infer.py), as the embedded engine answers it.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from llmserve.serve.disconnect import CLIENT_CLOSED, ClientDisconnected, unless_disconnected
from llmserve.serve.http_guards import Guards
from llmserve.serve.http_server import UvicornFrontend
from llmserve.serve.limits import TooLarge, inflate
from llmserve.serve.readiness import Readiness
from llmserve.serve.routing import Exposition, new_app, operations_router
from llmserve.serve.triton.llm_text_generate import (
    GenerateBodyError,
    encode_nested_parameters,
    generate_body_problem,
    generated_model,
    rewrite_generate_body,
)


@dataclass(frozen=True)
class OpenAISettings:
    models: dict[str, Any]  # name -> llmserve.serve.triton.openai_routes.TritonLLM
    so_key: str  # the structured-output key of sampling_parameters the backend takes


# Request headers that stay here: the client's credentials for llmserve, and hop-by-hop ones httpx sets itself.
PRIVATE_HEADERS = {"authorization", "x-api-key", "host", "content-length", "connection", "transfer-encoding"}
# Response headers of Triton's that the server here sets itself.
HOP_HEADERS = {"content-length", "connection", "transfer-encoding", "keep-alive"}
# Routes that change the Triton llmserve supervises (loading a model can upload files that run inside the server;
# unloading one ends llmserve), refused with the reason (grpc_proxy.REFUSED is the gRPC side)
CONTROL_ROUTES = [
    (re.compile(r"^repository/models/[^/]+/(load|unload)$"), "the models are fixed at startup by llmserve"),
    (re.compile(r"^(system|cuda)sharedmemory/"), "shared-memory tensors are not supported through llmserve"),
    (re.compile(r"^(logging|trace/setting)$"), "Triton's settings are set at startup by llmserve"),
]
# Triton's HTTP endpoint on /infer for a decoupled model (2.51: "HTTP end point doesn't support models with decoupled
# transaction policy")
DECOUPLED_REFUSAL = b"doesn't support models with decoupled transaction policy"
INFER_PATH = re.compile(r"^models/([^/]+)(?:/versions/([^/]+))?/infer$")
# gRPC status of a one-shot infer that got no answer -> HTTP status (as Triton's HTTP endpoint maps them)
HTTP_OF_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 413,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# A generation can take minutes; connecting to Triton on loopback cannot.
_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=10.0)


class TritonHttpProxy(UvicornFrontend):
    """The Frontend (llmserve.serve.frontend) for KServe v2 HTTP over a Triton on loopback."""

    name = "kserve-http"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        api_key: str | None,
        max_body_bytes: int,
        metrics: Exposition | None = None,
        openai: OpenAISettings | None = None,
        llm_text_inputs: dict[str, list[str]] | None = None,
        vllm_inputs: dict[str, list[str]] | None = None,
    ):
        super().__init__(host, port)
        # llm-text models (name -> input tensor names): their generate bodies are rewritten (llm_text_generate.py)
        self.llm_text_inputs = dict(llm_text_inputs or {})
        # vLLM-backend models (name -> input tensor names): object parameters of their generate bodies become JSON text
        self.vllm_inputs = dict(vllm_inputs or {})
        self._api_key = api_key
        self.max_body_bytes = max_body_bytes
        self._metrics = metrics
        self.openai = openai  # the OpenAI API over Triton on the same port (--openai)
        self.upstream: str | None = None
        self._client: httpx.AsyncClient | None = None
        self._grpc: Any = None  # tritonclient.grpc.aio client to Triton, for the OpenAI routes
        self.grpc_channel: grpc.aio.Channel | None = None  # to Triton, for /infer on decoupled models
        self.decoupled: set[str] = set()  # models Triton refused /infer for as decoupled

    def attach(self, upstream: str | None, grpc_upstream: str) -> None:
        """Forward to Triton's HTTP endpoint (host:port; None: not known, the /v2 routes answer 404) from now on;
        the OpenAI routes call its gRPC endpoint."""
        self.upstream = upstream
        if upstream is not None:
            self._client = httpx.AsyncClient(base_url=f"http://{upstream}", timeout=_TIMEOUT)
            limits = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            self.grpc_channel = grpc.aio.insecure_channel(grpc_upstream, options=limits)
        if self.openai is not None:
            import tritonclient.grpc.aio as grpc_aio

            self._grpc = grpc_aio.InferenceServerClient(grpc_upstream)

    def build(self, readiness: Readiness) -> Any:
        app = build_app(self, readiness, self._metrics)
        return Guards(app, api_key=self._api_key, max_body_bytes=self.max_body_bytes)

    async def drain(self, timeout_s: float) -> None:
        await super().drain(timeout_s)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._grpc is not None:
            await self._grpc.close()
            self._grpc = None
        if self.grpc_channel is not None:
            await self.grpc_channel.close()
            self.grpc_channel = None

    def rewrites_generate(self, model: str) -> bool:
        """Whether generate bodies for `model` are read and rewritten here (generate_body) rather than passed on."""
        return model in self.llm_text_inputs or model in self.vllm_inputs

    def generate_body(self, model: str, path: str, content: bytes) -> bytes:
        """A generate body for `model` as it is forwarded (llm_text_generate.py); GenerateBodyError for a 400."""
        if not self.rewrites_generate(model):
            return content
        problem = generate_body_problem(content, path)
        if problem is not None:
            raise GenerateBodyError(problem)
        if model in self.llm_text_inputs:
            return rewrite_generate_body(content, self.llm_text_inputs[model])
        return encode_nested_parameters(content, self.vllm_inputs[model])

    def ready_client(self, readiness: Readiness) -> httpx.AsyncClient | None:
        return self._client if readiness.accepting else None


def build_app(proxy: TritonHttpProxy, readiness: Readiness, metrics: Exposition | None) -> FastAPI:
    app = new_app("llmserve KServe v2 over Triton")
    app.include_router(operations_router(readiness, metrics))
    if proxy.openai is not None:
        from llmserve.serve.triton.openai_routes import build_router

        app.include_router(build_router(readiness, proxy.openai.models, lambda: proxy._grpc, proxy.openai.so_key))

    async def forward(request: Request, path: str) -> Response:
        client = proxy.ready_client(readiness)
        if client is None and readiness.accepting:
            message = (
                "KServe v2 HTTP is not forwarded: this server was attached with --triton-url and no --triton-http-url"
            )
            return JSONResponse({"error": message}, status_code=404)
        if client is None:
            if path == "health/live":
                return Response(status_code=200)
            return JSONResponse({"error": "the server is not ready (starting or draining)"}, status_code=503)
        refused = _control_refusal(request.method, path)
        if refused is not None:
            return refused
        headers = {k: v for k, v in request.headers.items() if k.lower() not in PRIVATE_HEADERS}
        # httpx asks for gzip when the request names no encoding, and Triton then compresses /infer answers: a
        # client that did not ask for it would get a gzip body (the raw bytes are streamed through)
        headers.setdefault("accept-encoding", "identity")
        content = await request.body()
        model = generated_model(path) if request.method == "POST" else None
        if model is not None and proxy.rewrites_generate(model):
            try:  # read as JSON here, so sent on as it was read
                content = await _identity_body(request, content, proxy.max_body_bytes)
                headers.pop("content-encoding", None)
                content = proxy.generate_body(model, path, content)
            except TooLarge:
                return _inflated_too_large(proxy.max_body_bytes)
            except ValueError as exc:  # GenerateBodyError, or a body that does not inflate
                return JSONResponse({"error": str(exc)}, status_code=400)
        infer = INFER_PATH.match(path) if request.method == "POST" else None
        if infer is not None and infer.group(1) in proxy.decoupled and proxy.grpc_channel is not None:
            return await _infer_over_stream(proxy.grpc_channel, request, content, infer, proxy.max_body_bytes)
        upstream = client.build_request(
            request.method,
            f"/v2/{path}" if path else "/v2",
            params=request.url.query,
            headers=headers,
            content=content,
        )
        try:
            answer = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": f"Triton did not answer: {type(exc).__name__}"}, status_code=502)
        if infer is not None and answer.status_code in (400, 501):  # Triton's refusals: small, read whole
            refusal = await answer.aread()
            await answer.aclose()
            if DECOUPLED_REFUSAL in refusal and proxy.grpc_channel is not None:
                proxy.decoupled.add(infer.group(1))  # the next ones go straight to the stream
                return await _infer_over_stream(proxy.grpc_channel, request, content, infer, proxy.max_body_bytes)
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
            return Response(refusal, status_code=answer.status_code, headers=kept)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(
            answer.aiter_raw(), status_code=answer.status_code, headers=kept, background=BackgroundTask(answer.aclose)
        )

    app.add_api_route(
        "/v2/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE", "HEAD"], include_in_schema=False
    )

    async def server_metadata(request: Request) -> Response:
        return await forward(request, "")

    app.add_api_route("/v2", server_metadata, methods=["GET"], include_in_schema=False)
    return app


def _control_refusal(method: str, path: str) -> Response | None:
    """The 501 for a route that would change Triton (CONTROL_ROUTES); GET only reads (status, settings)."""
    if method == "GET":
        return None
    for route, why in CONTROL_ROUTES:
        if route.match(path):
            return JSONResponse({"error": f"/v2/{path} is not available through llmserve: {why}"}, 501)
    return None


async def _identity_body(request: Request, content: bytes, limit: int) -> bytes:
    """The request body without its Content-Encoding: gzip and deflate inflated to at most `limit` bytes (TooLarge
    past it); ValueError for another encoding, or data that does not inflate."""
    encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
    if encoding == "identity":
        return content
    if encoding not in ("gzip", "deflate"):
        raise ValueError(f"Content-Encoding '{encoding}' is not supported; send identity, gzip or deflate")
    return await inflate(content, encoding, limit)


def _inflated_too_large(limit: int) -> Response:
    return JSONResponse({"error": f"the request body inflates past {limit} bytes (--max-body-bytes)"}, 413)


async def _infer_over_stream(
    channel: grpc.aio.Channel, request: Request, content: bytes, path: re.Match[str], limit: int
) -> Response:
    """/infer on a decoupled model, answered over a one-request ModelStreamInfer (module doc). Decoding and encoding
    run on a worker thread (a large JSON tensor takes a second); a client that disconnects ends the model's request."""
    from llmserve.serve.triton.grpc_proxy import OneShotFailed, one_shot_over_stream
    from llmserve.serve.triton.http_infer import (
        HEADER_LENGTH,
        decode_infer_body,
        encode_infer_response,
    )

    try:
        content = await _identity_body(request, content, limit)
        infer, binary_by_name, binary_all = await asyncio.to_thread(
            decode_infer_body, content, request.headers.get(HEADER_LENGTH), path.group(1), path.group(2) or ""
        )
        answer = await unless_disconnected(request, one_shot_over_stream(channel, infer, [], None))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except TooLarge:
        return _inflated_too_large(limit)
    except ValueError as exc:  # InferBodyError, or a body that does not inflate
        return JSONResponse({"error": str(exc)}, status_code=400)
    except OneShotFailed as failed:
        # a model's refusal travels on the stream as text only: INVALID_ARGUMENT, a 400 (grpc_proxy)
        return JSONResponse({"error": failed.message}, status_code=HTTP_OF_GRPC.get(failed.code, 500))
    body, headers = await asyncio.to_thread(encode_infer_response, answer, binary_by_name, binary_all)
    return Response(body, headers=headers)
