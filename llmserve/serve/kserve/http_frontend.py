"""KServe v2 over HTTP/REST (plus Triton's generate extension), as a FastAPI router.

`build_router(readiness, model_version=...)` gives an APIRouter to mount on the OpenAI app (one HTTP
port); `KServeHttpFrontend` serves the same router alone (for `llmserve serve` without --openai).

Routes ({v} optional everywhere as /versions/{v}):
    GET  /v2                          server metadata
    GET  /v2/health/live | ready      200, or 503 while starting/draining
    GET  /v2/models/{m}               model metadata (tensors from LLM_TEXT_CONTRACT)
    GET  /v2/models/{m}/ready         200 or 503 (400 for a model this server does not serve)
    GET  /v2/models/{m}/config        Triton model configuration (decoupled)
    POST /v2/models/{m}/infer         JSON tensors, or the binary tensor extension
                                      (Inference-Header-Content-Length); gzip/deflate bodies accepted
    POST /v2/models/{m}/generate      generate extension: one JSON response
    POST /v2/models/{m}/generate_stream  SSE: one `data:` event per text delta
Errors are {"error": "<message>"} with 400 (bad request), 404 (unknown model/version/route),
501 (a Triton extension this server does not implement), 503 (not ready).
Metrics: infer, generate and generate_stream call on_request(endpoint, HTTP status, seconds) with
endpoint kserve_http_infer / kserve_http_generate / kserve_http_generate_stream (seconds: to the
response, to the first event for generate_stream); health and metadata routes are not counted, as
the OpenAI app does not count /health and /v1/models.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmserve.serve.disconnect import CLIENT_CLOSED, ClientDisconnected, unless_disconnected
from llmserve.serve.http_server import UvicornFrontend
from llmserve.serve.kserve.errors import UNIMPLEMENTED, KServeError, invalid, not_found
from llmserve.serve.kserve.generation import Delta, generate_deltas, generate_text
from llmserve.serve.kserve.protocol import (
    INPUTS,
    OUTPUT_NAME,
    OUTPUT_SHAPE,
    DecodedTensor,
    ModelResolver,
    Served,
    build_generation,
    check_tensor_header,
    decode_raw,
    encode_bytes,
    model_config,
    model_metadata,
    server_metadata,
)

log = logging.getLogger("llmserve.serve.kserve")

HEADER_LENGTH = "inference-header-content-length"
UNIMPLEMENTED_PATHS = {
    "stats": "per-model statistics are exported as Prometheus metrics on /metrics instead",
    "repository": "this server serves one model from its package; there is no model repository",
    "systemsharedmemory": "shared-memory tensors are not supported; send tensors in the request",
    "cudasharedmemory": "CUDA shared-memory tensors are not supported; send tensors in the request",
    "trace": "tracing settings are not supported",
    "logging": "log settings are set at startup (LLMSERVE_DEBUG), not over the API",
}


def _error(err: KServeError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.http_status)


def _flatten(name: str, data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(name, item))
    return out


async def _body(request: Request) -> bytes:
    raw = await request.body()
    enc = (request.headers.get("content-encoding") or "identity").strip().lower()
    try:
        if enc == "gzip":
            return gzip.decompress(raw)
        if enc == "deflate":
            return zlib.decompress(raw)
    except (OSError, zlib.error, EOFError) as exc:
        raise invalid(f"the request body is not valid {enc} data: {exc}") from None
    if enc != "identity":
        raise invalid(f"Content-Encoding '{enc}' is not supported; send identity, gzip or deflate")
    return raw


def _json_object(raw: bytes, what: str) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"the {what} is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid(f"the {what} must be a JSON object")
    return body


def _scalar_params(where: str, params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid(f"'{where}' must be a JSON object of name/value pairs")
    return params


def decode_infer_body(
    request_body: bytes, header_length: str | None
) -> tuple[list[DecodedTensor], dict, bool | None, str]:
    """JSON tensors or the binary tensor extension -> (tensors, request params, binary output?, id)."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise invalid(f"Inference-Header-Content-Length '{header_length}' is not an integer") from None
        if n < 0 or n > len(request_body):
            raise invalid(f"Inference-Header-Content-Length {n} is outside the body ({len(request_body)} bytes)")
        header, binary = request_body[:n], request_body[n:]
    else:
        header, binary = request_body, b""
    body = _json_object(header, "inference request")
    unknown = sorted(set(body) - {"id", "parameters", "inputs", "outputs"})
    if unknown:
        raise invalid(
            f"unknown inference request field(s): {', '.join(unknown)}; accepted: id, parameters, inputs, outputs"
        )
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    params = dict(_scalar_params("parameters", body.get("parameters")))
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise invalid("'inputs' must be a non-empty list of tensors")
    tensors: list[DecodedTensor] = []
    offset = 0
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise invalid(f"inputs[{i}] must be a JSON object with name, datatype, shape and data")
        extra = sorted(set(t) - {"name", "datatype", "shape", "parameters", "data"})
        if extra:
            raise invalid(f"inputs[{i}]: unknown field(s) {', '.join(extra)}")
        name, datatype, shape = t.get("name"), t.get("datatype"), t.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise invalid(f"inputs[{i}] needs 'name' (string), 'datatype' (string) and 'shape' (list of integers)")
        check_tensor_header(name, datatype, shape)
        tparams = dict(_scalar_params(f"inputs[{i}].parameters", t.get("parameters")))
        size = tparams.pop("binary_data_size", None)
        if tparams:
            raise invalid(f"input '{name}': tensor parameter(s) {', '.join(sorted(tparams))} are not supported")
        if size is not None:
            if "data" in t:
                raise invalid(f"input '{name}': give either 'data' or parameters.binary_data_size, not both")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise invalid(
                    f"input '{name}': binary_data_size {size!r} does not fit the binary part of the body "
                    f"({len(binary) - offset} bytes left)"
                )
            values = decode_raw(name, datatype, binary[offset : offset + size])
            offset += size
        else:
            if "data" not in t:
                raise invalid(f"input '{name}' has no 'data'")
            values = _flatten(name, t["data"])
            want = str if datatype == "BYTES" else bool
            for v in values:
                if not isinstance(v, want):
                    raise invalid(
                        f"input '{name}': {datatype} data must be JSON "
                        f"{'strings' if want is str else 'booleans'}, got {json.dumps(v)}"
                    )
        tensors.append(DecodedTensor(name, datatype, shape, values))
    if offset != len(binary):
        raise invalid(f"the body has {len(binary) - offset} binary byte(s) that no input claims (binary_data_size)")
    binary_out: bool | None = None
    outputs = body.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise invalid("'outputs' must be a list")
        for i, o in enumerate(outputs):
            if not isinstance(o, dict) or o.get("name") != OUTPUT_NAME:
                name = o.get("name") if isinstance(o, dict) else o
                raise invalid(f"unknown output {name!r}; this model produces: {OUTPUT_NAME}")
            extra = sorted(set(o) - {"name", "parameters"})
            if extra:
                raise invalid(f"outputs[{i}]: unknown field(s) {', '.join(extra)}")
            oparams = dict(_scalar_params(f"outputs[{i}].parameters", o.get("parameters")))
            if "binary_data" in oparams:
                if not isinstance(oparams["binary_data"], bool):
                    raise invalid(f"output '{OUTPUT_NAME}': parameters.binary_data must be true or false")
                binary_out = oparams.pop("binary_data")
            if oparams:
                raise invalid(
                    f"output '{OUTPUT_NAME}': output parameter(s) {', '.join(sorted(oparams))} are not "
                    "supported (classification is not available for text)"
                )
    return tensors, params, binary_out, request_id


def infer_response(served: Served, request_id: str, text: str, binary: bool) -> Response:
    out: dict[str, Any] = {"name": OUTPUT_NAME, "datatype": "BYTES", "shape": list(OUTPUT_SHAPE)}
    body: dict[str, Any] = {"model_name": served.name, "model_version": served.version}
    if request_id:
        body["id"] = request_id
    body["outputs"] = [out]
    if not binary:
        out["data"] = [text]
        return JSONResponse(body)
    raw = encode_bytes([text])
    out["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps(body).encode()
    return Response(
        header + raw,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def decode_generate_body(raw: bytes) -> tuple[list[DecodedTensor], dict[str, Any]]:
    """Generate extension: keys naming an input are tensors, `parameters` and any other key are parameters."""
    body = _json_object(raw, "generate request")
    params = dict(_scalar_params("parameters", body.pop("parameters", None)))
    tensors: list[DecodedTensor] = []
    for key, value in body.items():
        spec = INPUTS.get(key)
        if spec is None:
            if key in params:
                raise invalid(f"'{key}' is given both at the top level and in 'parameters'; set it once")
            params[key] = value
            continue
        values = value if isinstance(value, list) else [value]
        if key == "sampling_parameters" and len(values) == 1 and isinstance(values[0], dict):
            values = [json.dumps(values[0])]
        want = str if spec.datatype == "BYTES" else bool
        if not all(isinstance(v, want) for v in values):
            raise invalid(
                f"'{key}' must be a {'string' if want is str else 'boolean'}"
                + (" (or a JSON object)" if key == "sampling_parameters" else "")
            )
        tensors.append(DecodedTensor(key, spec.datatype, [len(values)], values))
    return tensors, params


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


def build_router(
    readiness: Any,
    *,
    model_version: str | int | None = None,
    on_request: Callable[[str, int, float], None] | None = None,
) -> APIRouter:
    """KServe v2 routes on the shared engine; mount with app.include_router(...).

    on_request(endpoint, status, seconds), e.g. ServerMetrics.observe, is called once per inference request.
    """
    resolver = ModelResolver(readiness, model_version)
    router = APIRouter()

    def timed(endpoint: str, fn: Callable) -> Callable:
        if on_request is None:
            return fn

        @functools.wraps(fn)  # FastAPI reads the parameters (model, request, version) through __wrapped__
        async def run(*args, **kwargs) -> Response:
            t0, status = time.perf_counter(), 500  # an unexpected exception answers 500
            try:
                response = await fn(*args, **kwargs)
                status = response.status_code
                return response
            finally:
                on_request(endpoint, status, time.perf_counter() - t0)

        return run

    def route(method: str, suffix: str, fn: Callable, endpoint: str | None = None) -> None:
        if endpoint is not None:
            fn = timed(endpoint, fn)
        router.add_api_route(f"/v2/models/{{model}}{suffix}", fn, methods=[method], include_in_schema=False)
        router.add_api_route(
            f"/v2/models/{{model}}/versions/{{version}}{suffix}", fn, methods=[method], include_in_schema=False
        )

    @router.get("/v2", include_in_schema=False)
    async def server_meta() -> Response:
        return JSONResponse(server_metadata())

    @router.get("/v2/health/live", include_in_schema=False)
    async def live() -> Response:
        return JSONResponse({"live": True})

    @router.get("/v2/health/ready", include_in_schema=False)
    async def ready() -> Response:
        ok = resolver.server_ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def model_meta(model: str, version: str = "") -> Response:
        try:
            return JSONResponse(model_metadata(resolver.resolve(model, version, for_inference=False)))
        except KServeError as err:
            return _error(err)

    async def model_ready(model: str, version: str = "") -> Response:
        served = resolver.current()
        if served is not None and (model != served.name or version not in ("", served.version)):
            return _error(
                not_found(
                    f"unknown model '{model}'"
                    + (f" version '{version}'" if version else "")
                    + f": this server serves '{served.name}' (version {served.version})"
                )
            )
        ok = resolver.model_ready(model, version)
        return JSONResponse({"name": model, "ready": ok}, status_code=200 if ok else 503)

    async def config(model: str, version: str = "") -> Response:
        try:
            return JSONResponse(model_config(resolver.resolve(model, version, for_inference=False)))
        except KServeError as err:
            return _error(err)

    async def infer(model: str, request: Request, version: str = "") -> Response:
        try:
            served = resolver.resolve(model, version, for_inference=True)
            tensors, params, binary_out, request_id = decode_infer_body(
                await _body(request), request.headers.get(HEADER_LENGTH)
            )
            req = build_generation(tensors, params, transport="http", streaming_transport=False)
            if binary_out is None:
                binary_out = bool(req.settings.binary_data_output)
            text = await unless_disconnected(request, generate_text(served.handle, req, request_id))
            return infer_response(served, request_id, text, binary_out)
        except KServeError as err:
            return _error(err)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)

    async def _prepare_generate(model: str, version: str, request: Request, streaming: bool):
        served = resolver.resolve(model, version, for_inference=True)
        if request.headers.get(HEADER_LENGTH) is not None:
            raise invalid(
                "the generate extension takes a JSON body; the binary tensor extension "
                "(Inference-Header-Content-Length) is for /infer"
            )
        tensors, params = decode_generate_body(await _body(request))
        if streaming and not any(t.name == "stream" for t in tensors):
            # generate_stream streams unless the body says "stream": false
            tensors.append(DecodedTensor("stream", "BOOL", [1], [True]))
        req = build_generation(tensors, params, transport="generate", streaming_transport=streaming)
        if req.settings.binary_data_output is not None:
            raise invalid("parameter 'binary_data_output' belongs to /infer; generate answers JSON")
        return served, req

    async def generate(model: str, request: Request, version: str = "") -> Response:
        try:
            served, req = await _prepare_generate(model, version, request, streaming=False)
            text = await unless_disconnected(request, generate_text(served.handle, req))
        except KServeError as err:
            return _error(err)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse({"model_name": served.name, "model_version": served.version, "text_output": text})

    async def generate_stream(model: str, request: Request, version: str = "") -> Response:
        try:
            served, req = await _prepare_generate(model, version, request, streaming=True)
            deltas = generate_deltas(served.handle, req)
            first = await deltas.__anext__()  # errors before the first token still get a status code
        except KServeError as err:
            return _error(err)

        def event(d: Delta) -> bytes:
            return _sse({"model_name": served.name, "model_version": served.version, "text_output": d.text})

        async def events() -> AsyncIterator[bytes]:
            try:
                yield event(first)
                async for d in deltas:
                    yield event(d)
            except KServeError as err:
                yield _sse(err.body())
            finally:
                await deltas.aclose()

        return StreamingResponse(
            events(), media_type="text/event-stream; charset=utf-8", headers={"Cache-Control": "no-cache"}
        )

    route("GET", "", model_meta)
    route("GET", "/ready", model_ready)
    route("GET", "/config", config)
    route("POST", "/infer", infer, "kserve_http_infer")
    route("POST", "/generate", generate, "kserve_http_generate")
    route("POST", "/generate_stream", generate_stream, "kserve_http_generate_stream")

    @router.api_route("/v2/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"], include_in_schema=False)
    async def other(rest: str) -> Response:
        parts = rest.split("/")
        for part in parts:
            if part in UNIMPLEMENTED_PATHS:
                return _error(
                    KServeError(
                        UNIMPLEMENTED, f"/v2/{rest} is not implemented by llmserve: {UNIMPLEMENTED_PATHS[part]}"
                    )
                )
        return _error(not_found(f"/v2/{rest} is not a KServe v2 route of this server"))

    return router


def build_app(
    readiness: Any,
    *,
    model_version: str | int | None = None,
    on_request: Callable[[str, int, float], None] | None = None,
    metrics: Callable[[], tuple[bytes, str]] | None = None,
) -> FastAPI:
    """The standalone KServe v2 HTTP app: the router plus /health (for probes) and, given `metrics`
    (ServerMetrics.exposition), /metrics, like the OpenAI app."""
    app = FastAPI(title="llmserve KServe v2", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health", include_in_schema=False)
    async def health() -> Response:
        status, ok = readiness.status()
        return JSONResponse({"status": status}, status_code=200 if ok else 503)

    if metrics is not None:

        @app.get("/metrics", include_in_schema=False)
        async def prom() -> Response:
            body, content_type = metrics()
            return Response(body, media_type=content_type)

    app.include_router(build_router(readiness, model_version=model_version, on_request=on_request))
    return app


class KServeHttpFrontend(UvicornFrontend):
    """The Frontend (llmserve.serve.frontend) for KServe v2 over HTTP, on its own port."""

    name = "kserve-http"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        model_version: str | int | None = None,
        api_key: str | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
        metrics: Any = None,
    ):
        super().__init__(host, port)
        self.model_version = model_version
        self._api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics  # a ServerMetrics, or None to record nothing

    def build(self, readiness: Any) -> Any:
        from llmserve.serve.http_guards import Guards

        m = self.metrics
        app = build_app(
            readiness,
            model_version=self.model_version,
            on_request=m.observe if m else None,
            metrics=m.exposition if m else None,
        )
        return Guards(app, api_key=self._api_key, max_body_bytes=self.max_body_bytes)
