"""KServe v2 / Triton GRPCInferenceService on grpc.aio, over the shared engine.

Implemented: ServerLive, ServerReady (false until the engine is ready and while draining),
ModelReady, ServerMetadata, ModelMetadata, ModelConfig (decoupled transaction policy), ModelInfer
(one response with the full text) and ModelStreamInfer (decoupled: with stream=true one response per
text delta; every response carries the `triton_final_response` parameter, true on the last one, as
Triton does for decoupled models). Requests on one stream run concurrently; responses carry the
request's `id`. A bad request on a stream gets an error_message response and the stream stays open.
Every other RPC answers UNIMPLEMENTED naming the RPC. Limits: messages over max_message_bytes
(--max-body-bytes; grpc checks the decompressed size too) are RESOURCE_EXHAUSTED, a text_input over
max_prompt_chars (--max-prompt-chars) or an `id` over 256 characters INVALID_ARGUMENT; a failure of
the server's own is INTERNAL with a generic message (the exception goes to the log). Inference before ready (or while draining):
UNAVAILABLE; on a stream, the stream ends with that status when such a request arrives.

Metrics: ModelInfer and ModelStreamInfer call on_request("kserve_grpc_<RPC>", <gRPC status code name>,
seconds) once per RPC (a stream counts once, with the status it ends with; seconds to its first
response); health and metadata RPCs are not counted, as the OpenAI app does not count /health.

Messages and the servicer base come from tritonclient's generated modules (no code generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from llmserve.serve.constraint_checks import request_check
from llmserve.serve.constraint_keys import kserve_constrained
from llmserve.serve.errors import StartupError
from llmserve.serve.kserve.errors import KServeError, internal, invalid, not_ready
from llmserve.serve.kserve.generation import generate_deltas, generate_text
from llmserve.serve.kserve.protocol import (
    OUTPUT_NAME,
    OUTPUT_SHAPE,
    DecodedTensor,
    GenerationRequest,
    ModelResolver,
    Served,
    build_generation,
    check_tensor_header,
    decode_raw,
    element_count,
    encode_bytes,
    model_config,
    model_metadata,
    server_metadata,
)
from llmserve.serve.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_CHARS, MAX_ID_CHARS, log_safe
from llmserve.serve.metrics import ServerMetrics

log = logging.getLogger("llmserve.serve.kserve")

FINAL_PARAM = "triton_final_response"
IMPLEMENTED = {
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelConfig",
    "ModelInfer",
    "ModelStreamInfer",
}
OPEN_RPCS = {"ServerLive", "ServerReady", "ModelReady"}  # answered without an API key (health probes)
UNIMPLEMENTED_WHY = {
    "ModelStatistics": "per-model statistics are exported as Prometheus metrics on /metrics instead",
    "RepositoryIndex": "this server serves one model from its package; there is no model repository",
    "RepositoryModelLoad": "the model is fixed at startup; deploy another package version to change it",
    "RepositoryModelUnload": "the model is fixed at startup; deploy another package version to change it",
    "SystemSharedMemoryStatus": "shared-memory tensors are not supported; send tensors in the request",
    "SystemSharedMemoryRegister": "shared-memory tensors are not supported; send tensors in the request",
    "SystemSharedMemoryUnregister": "shared-memory tensors are not supported; send tensors in the request",
    "CudaSharedMemoryStatus": "CUDA shared-memory tensors are not supported; send tensors in the request",
    "CudaSharedMemoryRegister": "CUDA shared-memory tensors are not supported; send tensors in the request",
    "CudaSharedMemoryUnregister": "CUDA shared-memory tensors are not supported; send tensors in the request",
    "TraceSetting": "tracing settings are not supported",
    "LogSettings": "log settings are set at startup (LLMSERVE_DEBUG), not over the API",
}


def _param_value(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _params(m) -> dict[str, Any]:
    return {k: _param_value(v) for k, v in m.items()}


def decode_request(request: pb.ModelInferRequest) -> tuple[list[DecodedTensor], dict[str, Any]]:
    """Input tensors (from raw_input_contents or typed contents) and request parameters."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise invalid(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send every input's data raw, or none"
        )
    tensors = []
    for i, t in enumerate(request.inputs):
        shape = list(t.shape)
        check_tensor_header(t.name, t.datatype, shape)
        if t.parameters:
            raise invalid(f"input '{t.name}': tensor parameters ({', '.join(t.parameters)}) are not supported")
        count = element_count(shape)
        if raw:
            if t.HasField("contents"):
                raise invalid(f"input '{t.name}': data given both raw and in contents")
            values = decode_raw(t.name, t.datatype, raw[i], count)
        else:
            contents = t.contents.bytes_contents if t.datatype == "BYTES" else t.contents.bool_contents
            if len(contents) > count:
                raise invalid(f"input '{t.name}': its data has more elements than its shape's {count}")
            values = list(contents)
        tensors.append(DecodedTensor(t.name, t.datatype, shape, values))
    for o in request.outputs:
        if o.name != OUTPUT_NAME:
            raise invalid(f"unknown output '{o.name}'; this model produces: {OUTPUT_NAME}")
        if o.parameters:
            raise invalid(f"output '{o.name}': output parameters ({', '.join(o.parameters)}) are not supported")
    return tensors, _params(request.parameters)


def infer_response(name: str, version: str, request_id: str, text: str, final: bool | None) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    out = resp.outputs.add()
    out.name, out.datatype = OUTPUT_NAME, "BYTES"
    out.shape.extend(OUTPUT_SHAPE)
    resp.raw_output_contents.append(encode_bytes([text]))
    if final is not None:
        resp.parameters[FINAL_PARAM].bool_param = final
    return resp


def _config_proto(d: dict) -> mc.ModelConfig:
    return json_format.ParseDict(d, mc.ModelConfig())


def _status_name(context: grpc.aio.ServicerContext, exc: BaseException | None) -> str:
    """The gRPC status code name an RPC ended with (abort sets it on the context)."""
    if exc is None:
        return "OK"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED"
    code = context.code()
    if isinstance(code, int):
        code = next((c for c in grpc.StatusCode if c.value[0] == code), None)
    return code.name if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK else "UNKNOWN"


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, resolver: ModelResolver, max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS):
        self.r = resolver
        self.max_prompt_chars = max_prompt_chars

    async def _abort(self, context: grpc.aio.ServicerContext, err: KServeError) -> NoReturn:
        await context.abort(err.grpc_status, err.message)
        raise AssertionError("unreachable: context.abort raises")  # grpc.aio types abort as returning

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.r.server_ready())

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self.r.model_ready(request.name, request.version))

    async def ServerMetadata(self, request, context):
        m = server_metadata()
        return pb.ServerMetadataResponse(name=m["name"], version=m["version"], extensions=m["extensions"])

    async def ModelMetadata(self, request, context):
        try:
            served = self.r.resolve(request.name, request.version, for_inference=False)
        except KServeError as err:
            await self._abort(context, err)
        m = model_metadata(served)
        resp = pb.ModelMetadataResponse(name=m["name"], versions=m["versions"], platform=m["platform"])
        for kind in ("inputs", "outputs"):
            for t in m[kind]:
                getattr(resp, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelConfig(self, request, context):
        try:
            served = self.r.resolve(request.name, request.version, for_inference=False)
        except KServeError as err:
            await self._abort(context, err)
        return pb.ModelConfigResponse(config=_config_proto(model_config(served)))

    async def ModelInfer(self, request, context):
        try:
            served, req = await self._generation(request, streaming=False)
            text = await generate_text(served.handle, req, request.id)
        except KServeError as err:
            await self._abort(context, err)
        except Exception:
            # grpc.aio would send the exception's text to the client: log it, answer INTERNAL
            log.exception("ModelInfer request %s failed", log_safe(request.id))
            await self._abort(context, internal("the request"))
        return infer_response(served.name, served.version, request.id, text, None)

    async def ModelStreamInfer(self, request_iterator, context) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        stream = _InferStream(self, request_iterator)
        try:
            while (item := await stream.next()) is not None:
                if isinstance(item, KServeError):
                    await self._abort(context, item)
                yield item
        finally:
            await stream.close()

    async def _generation(self, request: pb.ModelInferRequest, *, streaming: bool) -> tuple[Served, GenerationRequest]:
        served = self.r.resolve(request.model_name, request.model_version, for_inference=True)
        if len(request.id) > MAX_ID_CHARS:
            # echoed in every response and carried into engine request ids and log lines
            raise invalid(f"'id' is {len(request.id)} characters; at most {MAX_ID_CHARS} are accepted")
        tensors, params = decode_request(request)
        # on a worker thread: a new constraint is compiled by the check (milliseconds, up to its time budget)
        req = await request_check(
            build_generation,
            tensors,
            params,
            constrained=kserve_constrained(params, tensors),
            transport="grpc",
            streaming_transport=streaming,
            constraints=served.handle.constraints,
            max_prompt_chars=self.max_prompt_chars,
        )
        return served, req


class _InferStream:
    """One ModelStreamInfer call: its requests run concurrently, their responses merge into one queue.

    Each producer (the reader of the request stream, and each request) puts `_DONE` once when it
    finishes; the responses end when all have. A KServeError on the queue ends the stream with its status.
    """

    _DONE = object()

    def __init__(self, servicer: KServeServicer, request_iterator: AsyncIterator[pb.ModelInferRequest]):
        self.servicer = servicer
        self.requests = request_iterator
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.active = 1  # the reader
        self.read_task = asyncio.create_task(self._read())

    async def next(self) -> pb.ModelStreamInferResponse | KServeError | None:
        """The next response, or a KServeError to end the stream with; None once every producer is done."""
        while self.active:
            item = await self.queue.get()
            if item is self._DONE:
                self.active -= 1
                continue
            return item
        return None

    async def close(self) -> None:
        pending = [self.read_task, *self.tasks]
        for t in pending:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*pending, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for request in self.requests:
                if not self.servicer.r.server_ready():
                    # not ready (starting or draining): end the stream with UNAVAILABLE so the
                    # client sees the status code, as unary ModelInfer does
                    self.queue.put_nowait(not_ready())
                    break
                self.active += 1
                task = asyncio.create_task(self._one(request))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        finally:
            self.queue.put_nowait(self._DONE)

    async def _one(self, request: pb.ModelInferRequest) -> None:
        try:
            served, req = await self.servicer._generation(request, streaming=True)
            async for d in generate_deltas(served.handle, req, request.id):
                response = infer_response(served.name, served.version, request.id, d.text, d.final)
                await self.queue.put(pb.ModelStreamInferResponse(infer_response=response))
        except KServeError as err:
            await self.queue.put(pb.ModelStreamInferResponse(error_message=err.message))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stream request %s failed", log_safe(request.id))
            await self.queue.put(pb.ModelStreamInferResponse(error_message=internal("the request").message))
        finally:
            self.queue.put_nowait(self._DONE)


class MeteredServicer(KServeServicer):
    """KServeServicer whose inference RPCs report (endpoint, gRPC status code name, seconds) to on_request."""

    def __init__(
        self,
        resolver: ModelResolver,
        on_request: Callable[[str, str, float], None],
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    ):
        super().__init__(resolver, max_prompt_chars)
        self.on_request = on_request

    async def ModelInfer(self, request, context):
        t0, failed = time.perf_counter(), None
        try:
            return await super().ModelInfer(request, context)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            self.on_request("kserve_grpc_ModelInfer", _status_name(context, failed), time.perf_counter() - t0)

    async def ModelStreamInfer(self, request_iterator, context) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        t0, first, failed = time.perf_counter(), None, None
        try:
            async with contextlib.aclosing(super().ModelStreamInfer(request_iterator, context)) as responses:
                async for response in responses:
                    if first is None:
                        first = time.perf_counter() - t0
                    yield response
        except BaseException as exc:
            failed = exc
            raise
        finally:
            seconds = time.perf_counter() - t0 if first is None else first
            self.on_request("kserve_grpc_ModelStreamInfer", _status_name(context, failed), seconds)


def _unimplemented(name: str):
    why = UNIMPLEMENTED_WHY.get(name, "not part of this server's KServe v2 API")

    async def rpc(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by llmserve: {why}")

    rpc.__name__ = name
    return rpc


for _m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
    if _m.name not in IMPLEMENTED and not _m.client_streaming:
        setattr(KServeServicer, _m.name, _unimplemented(_m.name))


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <key>` (or `x-api-key`) on every RPC but the health ones."""

    def __init__(self, key: str):
        self._key = key.encode()

    async def intercept_service(self, continuation, details):
        method = details.method.rsplit("/", 1)[-1]
        if method in OPEN_RPCS:
            return await continuation(details)
        md = {k.lower(): v for k, v in (details.invocation_metadata or ())}
        auth = md.get("authorization", "")
        presented = auth[7:].strip() if auth[:7].lower() == "bearer " else md.get("x-api-key", "")
        if isinstance(presented, str):
            presented = presented.encode()
        if presented and hmac.compare_digest(presented, self._key):
            return await continuation(details)
        handler = await continuation(details)
        return _deny(handler)


def _deny(handler):
    msg = "missing or invalid API key: send metadata 'authorization: Bearer <key>'"

    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, msg)

    async def stream(request_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, msg)
        yield  # pragma: no cover

    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream, handler.request_deserializer, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)


class KServeGrpcFrontend:
    """The Frontend (llmserve.serve.frontend) for KServe v2 over gRPC."""

    name = "kserve-grpc"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        model_version: str | int | None = None,
        api_key: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
        metrics: ServerMetrics | None = None,
    ):
        self.host, self.port = host, port
        self.model_version = model_version
        self.metrics = metrics  # None: record nothing
        self._api_key = api_key
        self.max_message_bytes = max_message_bytes
        self.max_prompt_chars = max_prompt_chars
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"grpc://{host}:{self.port}"

    async def start(self, readiness: Any) -> None:
        interceptors = [ApiKeyInterceptor(self._api_key)] if self._api_key else []
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        resolver = ModelResolver(readiness, self.model_version)
        servicer = (
            KServeServicer(resolver, self.max_prompt_chars)
            if self.metrics is None
            else MeteredServicer(resolver, self.metrics.observe, self.max_prompt_chars)
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        cause: RuntimeError | None = None
        try:
            port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as exc:
            port, cause = 0, exc
        if not port:
            raise StartupError(
                f"cannot listen for gRPC on {self.host}:{self.port}" + (f": {cause}" if cause else ""),
                hint="Choose another --grpc-port, or stop the process that holds this one.",
            )
        self.port = port
        await server.start()
        self._server = server

    async def drain(self, timeout_s: float) -> None:
        """Refuse new RPCs, let in-flight ones finish within timeout_s, then cancel the rest."""
        if self._server is None:
            return
        await self._server.stop(grace=timeout_s)
        self._server = None
