"""KServe v2 gRPC in front of Triton (executionMode embedded): llmserve's port, API key, message limit and readiness
gate, Triton's answers.

Every method of `inference.GRPCInferenceService` is forwarded to the Triton on loopback as raw bytes: messages are
not decoded and re-encoded, so tensors, parameters and errors pass through exactly as Triton sends them. The one
bidirectional streaming method (ModelStreamInfer) streams both ways; the rest are unary. Client deadlines travel
with the call and a cancelled client call cancels Triton's. The API key is checked here and never forwarded.

Until the server is ready (Triton starting) and while it drains, the health calls are answered here (live, not
ready) and every other call gets UNAVAILABLE, as on the embedded engine.

Calls that change the Triton llmserve supervises are not forwarded: loading a model (which can upload a config
and files, i.e. run code inside the server), unloading one (llmserve then exits as if the model had failed),
registering shared memory, and changing log or trace settings answer UNIMPLEMENTED here, as on the embedded engine:
the models are fixed at startup.

The one call that is not a plain relay: a one-shot ModelInfer on a decoupled model (the LLM), which Triton refuses
(UNIMPLEMENTED: decoupled models answer over ModelStreamInfer only) while llmserve's embedded engine answers it, and
tritonclient's `infer()` is what a platform's existing gRPC path calls. Such a call is sent again here as a
one-request ModelStreamInfer, and the model's one response comes back as the ModelInfer answer; a request the model
answers with several responses (an LLM asked to stream) gets INVALID_ARGUMENT naming the streaming call instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
from tritonclient.grpc import service_pb2 as pb

from llmserve.serve.errors import StartupError
from llmserve.serve.kserve.grpc_frontend import ApiKeyInterceptor

log = logging.getLogger("llmserve.serve.triton")

SERVICE = "inference.GRPCInferenceService"
STREAMING = {"ModelStreamInfer"}
STREAM_PATH = f"/{SERVICE}/ModelStreamInfer"
# Triton's stream parameters: asked for, a request's end is marked on its last response (or on an empty one).
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
# The calls that change Triton (control), refused here with the reason; LogSettings and TraceSetting only when they
# carry settings (without any they read them)
REFUSED = {
    "RepositoryModelLoad": "the models are fixed at startup by llmserve; serve or deploy another package version",
    "RepositoryModelUnload": "the models are fixed at startup by llmserve; stop the server or deploy another version",
    "SystemSharedMemoryRegister": "shared-memory tensors are not supported through llmserve; send the data",
    "SystemSharedMemoryUnregister": "shared-memory tensors are not supported through llmserve; send the data",
    "CudaSharedMemoryRegister": "shared-memory tensors are not supported through llmserve; send the data",
    "CudaSharedMemoryUnregister": "shared-memory tensors are not supported through llmserve; send the data",
}
SETTINGS = {"LogSettings": pb.LogSettingsRequest, "TraceSetting": pb.TraceSettingRequest}
# Metadata that stays here: the client's credentials for llmserve (Triton on loopback takes none).
PRIVATE_METADATA = {"authorization", "x-api-key"}


class TritonGrpcProxy:
    """The Frontend (llmserve.serve.frontend) for KServe v2 gRPC over a Triton on loopback."""

    name = "kserve-grpc"

    def __init__(self, host: str, port: int, *, api_key: str | None, max_message_bytes: int):
        self.host, self.port = host, port
        self._api_key = api_key
        self.max_message_bytes = max_message_bytes
        self.upstream: str | None = None  # Triton's gRPC address, set once it is ready
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        self._readiness: Any = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"grpc://{host}:{self.port}"

    def attach(self, upstream: str) -> None:
        """Forward to Triton's gRPC endpoint (host:port) from now on."""
        self.upstream = upstream
        limits = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
        ]
        self._channel = grpc.aio.insecure_channel(upstream, options=limits)

    async def start(self, readiness: Any) -> None:
        self._readiness = readiness
        server = grpc.aio.server(
            interceptors=[ApiKeyInterceptor(self._api_key)] if self._api_key else [],
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        server.add_generic_rpc_handlers([_Forward(self)])
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as exc:
            raise StartupError(
                f"cannot listen for gRPC on {self.host}:{self.port}: {exc}",
                hint="Choose another --grpc-port, or stop the process that holds this one.",
            ) from exc
        self.port = port
        await server.start()
        self._server = server

    async def drain(self, timeout_s: float) -> None:
        if self._server is not None:
            await self._server.stop(grace=timeout_s)
            self._server = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def ready_channel(self) -> grpc.aio.Channel | None:
        """The channel to Triton while the server takes requests; None before it is ready and while draining."""
        if self._readiness is None or not self._readiness.accepting:
            return None
        return self._channel


# Health calls answered here while Triton is not serving: live (this process is), not ready.
_NOT_READY_ANSWERS = {
    "ServerLive": pb.ServerLiveResponse(live=True),
    "ServerReady": pb.ServerReadyResponse(ready=False),
    "ModelReady": pb.ModelReadyResponse(ready=False),
}


def _forwarded_metadata(context: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in (context.invocation_metadata() or ()) if k.lower() not in PRIVATE_METADATA]


async def _not_ready(context: Any) -> NoReturn:
    await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is not ready (starting or draining)")
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, proxy: TritonGrpcProxy):
        self.proxy = proxy

    def service(self, handler_call_details: Any) -> Any:
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        if service != SERVICE:
            return None  # UNIMPLEMENTED
        path = handler_call_details.method
        if method in STREAMING:
            return grpc.stream_stream_rpc_method_handler(self._stream(path))
        return grpc.unary_unary_rpc_method_handler(self._unary(path, method))

    def _unary(self, path: str, method: str) -> Any:
        async def call(request: bytes, context: Any) -> bytes:
            if method in REFUSED or (method in SETTINGS and SETTINGS[method].FromString(request).settings):
                why = REFUSED.get(method, "Triton's settings are set at startup by llmserve")
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not available through llmserve: {why}")
            channel = self.proxy.ready_channel()
            if channel is None:
                if method in _NOT_READY_ANSWERS:
                    return bytes(_NOT_READY_ANSWERS[method].SerializeToString())
                await _not_ready(context)
            try:
                answer: bytes = await channel.unary_unary(path)(
                    request, metadata=_forwarded_metadata(context), timeout=context.time_remaining()
                )
                return answer
            except grpc.aio.AioRpcError as exc:
                if method == "ModelInfer" and refused_as_decoupled(exc):
                    try:
                        infer = pb.ModelInferRequest.FromString(request)
                        metadata, timeout = _forwarded_metadata(context), context.time_remaining()
                        return bytes(
                            (await one_shot_over_stream(channel, infer, metadata, timeout)).SerializeToString()
                        )
                    except OneShotFailed as failed:
                        await context.abort(failed.code, failed.message)
                await context.abort(exc.code(), exc.details() or "")
            raise AssertionError("unreachable")  # pragma: no cover - abort raises

        return call

    def _stream(self, path: str) -> Any:
        async def call(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            channel = self.proxy.ready_channel()
            if channel is None:
                await _not_ready(context)
            upstream = channel.stream_stream(path)(
                requests, metadata=_forwarded_metadata(context), timeout=context.time_remaining()
            )
            try:
                async for response in upstream:
                    yield response
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    await context.abort(exc.code(), exc.details() or "")
            finally:
                upstream.cancel()  # the client went away (or the stream ended): Triton's call ends too

        return call


def refused_as_decoupled(exc: grpc.aio.AioRpcError) -> bool:
    # Triton 2.51: "ModelInfer RPC doesn't support models with decoupled transaction policy"
    return exc.code() == grpc.StatusCode.UNIMPLEMENTED and "decoupled" in (exc.details() or "")


class OneShotFailed(Exception):
    """A one-shot request over ModelStreamInfer that got no single answer: the status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


async def one_shot_over_stream(
    channel: grpc.aio.Channel, infer: pb.ModelInferRequest, metadata: list[tuple[str, Any]], timeout: float | None
) -> pb.ModelInferResponse:
    """A request to a decoupled model, sent as a one-request ModelStreamInfer: the model's one response (module
    doc). OneShotFailed when the model refuses it, answers with more than one response, or with none."""
    infer.parameters[EMPTY_FINAL].bool_param = True
    finished = asyncio.Event()

    async def one_request() -> AsyncIterator[bytes]:
        yield infer.SerializeToString()
        # the write side stays open until the answer is complete: a half-closed stream is not the client leaving
        await finished.wait()

    call = channel.stream_stream(STREAM_PATH)(one_request(), metadata=metadata, timeout=timeout)
    answers: list[pb.ModelInferResponse] = []
    try:
        async for raw in call:
            response = pb.ModelStreamInferResponse.FromString(raw)
            if response.error_message:
                # the stream carries a model's error as text only; the model refused the request
                raise OneShotFailed(grpc.StatusCode.INVALID_ARGUMENT, response.error_message)
            answer = response.infer_response
            final = answer.parameters[FINAL].bool_param if FINAL in answer.parameters else False
            if answer.outputs or answer.raw_output_contents:
                if FINAL in answer.parameters:
                    del answer.parameters[FINAL]
                answers.append(answer)
            if final or len(answers) > 1:
                break  # a second response: the model streams, and the finally below ends its request
    except grpc.aio.AioRpcError as exc:
        raise OneShotFailed(exc.code(), exc.details() or "") from None
    finally:
        finished.set()
        call.cancel()
    if not answers:
        raise OneShotFailed(
            grpc.StatusCode.INTERNAL, f"model '{infer.model_name}' ended the request without a response"
        )
    if len(answers) > 1:
        raise OneShotFailed(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"model '{infer.model_name}' answers this request with more than one response (it is decoupled; an LLM "
            "asked to stream sends one per piece of text), and a one-shot inference returns one: set input 'stream' "
            "false, or stream: gRPC ModelStreamInfer (tritonclient: start_stream and async_stream_infer) or HTTP "
            "generate_stream",
        )
    return answers[0]
