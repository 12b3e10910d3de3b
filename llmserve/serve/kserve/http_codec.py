"""KServe v2 over HTTP: request bodies in, response bodies out (no routing, no engine).

Bodies may be gzip/deflate encoded (bounded by their decompressed size). /infer takes JSON tensors or the binary tensor extension (a JSON
header of Inference-Header-Content-Length bytes, then the tensors' raw bytes); the generate
extension takes one JSON object whose keys naming an input are tensors and whose other keys are
parameters. Every problem is a KServeError naming the field, tensor or header at fault.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from llmserve.serve.kserve.errors import invalid, too_large
from llmserve.serve.kserve.protocol import (
    INPUTS,
    OUTPUT_NAME,
    OUTPUT_SHAPE,
    DecodedTensor,
    Served,
    check_tensor_header,
    decode_raw,
    element_count,
    encode_bytes,
)
from llmserve.serve.limits import MAX_ID_CHARS, JsonProblem, TooLarge, inflate, load_json, short

HEADER_LENGTH = "inference-header-content-length"
REQUEST_FIELDS = ("id", "parameters", "inputs", "outputs")
INPUT_FIELDS = ("name", "datatype", "shape", "parameters", "data")


async def request_body(request: Request, limit: int) -> bytes:
    """The request body, decoded from its Content-Encoding to at most `limit` bytes.

    The guards (llmserve/serve/http_guards.py) bounded the body as sent; a compressed body is bounded
    again by what it inflates to (a 1 MB gzip body can inflate to gigabytes), and inflated in slices
    so the event loop keeps serving other requests meanwhile (llmserve/serve/limits.py: inflate)."""
    raw = await request.body()
    enc = (request.headers.get("content-encoding") or "identity").strip().lower()
    if enc == "identity":
        return raw
    if enc not in ("gzip", "deflate"):
        raise invalid(f"Content-Encoding '{enc}' is not supported; send identity, gzip or deflate")
    try:
        return await inflate(raw, enc, limit)
    except TooLarge:
        raise too_large(limit) from None
    except ValueError as exc:
        raise invalid(str(exc)) from None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        body = load_json(raw)
    except JsonProblem as exc:
        raise invalid(f"the {what} is {exc}") from None
    if not isinstance(body, dict):
        raise invalid(f"the {what} must be a JSON object")
    return body


def _scalar_params(where: str, params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid(f"'{where}' must be a JSON object of name/value pairs")
    return dict(params)


def _flatten(name: str, data: Any, count: int) -> list[Any]:
    """The values of a JSON tensor (nested lists flattened), refused once there are more than
    `count`, the element count its shape declares: a shape-[1] tensor cannot make the server walk a
    million values. Iterative: the nesting is bounded by the JSON depth limit, but a walk needs no stack."""
    out: list[Any] = []
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
            continue
        out.append(item)
        if len(out) > count:
            raise invalid(f"input '{name}': its data has more elements than its shape's {count}")
    return out


# ---- /infer ------------------------------------------------------------------------------------------


def decode_infer_body(
    request_body: bytes, header_length: str | None
) -> tuple[list[DecodedTensor], dict[str, Any], bool | None, str]:
    """JSON tensors or the binary tensor extension -> (tensors, request params, binary output?, id)."""
    header, binary = split_binary(request_body, header_length)
    body = _json_object(header, "inference request")
    unknown = sorted(set(body) - set(REQUEST_FIELDS))
    if unknown:
        raise invalid(
            f"unknown inference request field(s): {', '.join(unknown)}; accepted: {', '.join(REQUEST_FIELDS)}"
        )
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    if len(request_id) > MAX_ID_CHARS:
        # echoed in the response and carried into engine request ids and log lines
        raise invalid(f"'id' is {len(request_id)} characters; at most {MAX_ID_CHARS} are accepted")
    params = _scalar_params("parameters", body.get("parameters"))
    tensors = _decode_inputs(body.get("inputs"), binary)
    return tensors, params, _binary_output(body.get("outputs")), request_id


def split_binary(request_body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary tensor data) of an /infer body (the binary tensor extension)."""
    if header_length is None:
        return request_body, b""
    try:
        n = int(header_length)
    except ValueError:
        raise invalid(f"Inference-Header-Content-Length '{header_length}' is not an integer") from None
    if n < 0 or n > len(request_body):
        raise invalid(f"Inference-Header-Content-Length {n} is outside the body ({len(request_body)} bytes)")
    return request_body[:n], request_body[n:]


def _decode_inputs(inputs: Any, binary: bytes) -> list[DecodedTensor]:
    if not isinstance(inputs, list) or not inputs:
        raise invalid("'inputs' must be a non-empty list of tensors")
    tensors: list[DecodedTensor] = []
    offset = 0  # the binary data is claimed in input order
    for i, t in enumerate(inputs):
        name, datatype, shape, size = _input_header(i, t)
        if size is None:
            values = _json_data(name, datatype, shape, t)
        else:
            values = decode_raw(name, datatype, binary_part(name, size, t, binary, offset), element_count(shape))
            offset += size
        tensors.append(DecodedTensor(name, datatype, shape, values))
    if offset != len(binary):
        raise invalid(f"the body has {len(binary) - offset} binary byte(s) that no input claims (binary_data_size)")
    return tensors


def _input_header(i: int, t: Any) -> tuple[str, str, list[int], Any]:
    """(name, datatype, shape, binary_data_size or None) of inputs[i], checked against the model."""
    if not isinstance(t, dict):
        raise invalid(f"inputs[{i}] must be a JSON object with name, datatype, shape and data")
    extra = sorted(set(t) - set(INPUT_FIELDS))
    if extra:
        raise invalid(f"inputs[{i}]: unknown field(s) {', '.join(extra)}")
    name, datatype, shape = t.get("name"), t.get("datatype"), t.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
        raise invalid(f"inputs[{i}] needs 'name' (string), 'datatype' (string) and 'shape' (list of integers)")
    check_tensor_header(name, datatype, shape)
    tparams = _scalar_params(f"inputs[{i}].parameters", t.get("parameters"))
    size = tparams.pop("binary_data_size", None)
    if tparams:
        raise invalid(f"input '{name}': tensor parameter(s) {', '.join(sorted(tparams))} are not supported")
    return name, datatype, shape, size


def binary_part(name: str, size: Any, t: dict[str, Any], binary: bytes, offset: int) -> bytes:
    """Input `name`'s bytes: `size` of them from `offset` in the body's binary part (binary_data_size)."""
    if "data" in t:
        raise invalid(f"input '{name}': give either 'data' or parameters.binary_data_size, not both")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
        raise invalid(
            f"input '{name}': binary_data_size {size!r} does not fit the binary part of the body "
            f"({len(binary) - offset} bytes left)"
        )
    return binary[offset : offset + size]


def _json_data(name: str, datatype: str, shape: list[int], t: dict[str, Any]) -> list[Any]:
    if "data" not in t:
        raise invalid(f"input '{name}' has no 'data'")
    values = _flatten(name, t["data"], element_count(shape))
    want = str if datatype == "BYTES" else bool
    for v in values:
        if not isinstance(v, want):
            raise invalid(
                f"input '{name}': {datatype} data must be JSON "
                f"{'strings' if want is str else 'booleans'}, got {short(v)}"
            )
    return values


def _binary_output(outputs: Any) -> bool | None:
    """The requested `binary_data` of the one output, or None when the request does not say."""
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise invalid("'outputs' must be a list")
    binary_out: bool | None = None
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or o.get("name") != OUTPUT_NAME:
            name = o.get("name") if isinstance(o, dict) else o
            raise invalid(f"unknown output {name!r}; this model produces: {OUTPUT_NAME}")
        extra = sorted(set(o) - {"name", "parameters"})
        if extra:
            raise invalid(f"outputs[{i}]: unknown field(s) {', '.join(extra)}")
        oparams = _scalar_params(f"outputs[{i}].parameters", o.get("parameters"))
        if "binary_data" in oparams:
            binary_out = oparams.pop("binary_data")
            if not isinstance(binary_out, bool):
                raise invalid(f"output '{OUTPUT_NAME}': parameters.binary_data must be true or false")
        if oparams:
            raise invalid(
                f"output '{OUTPUT_NAME}': output parameter(s) {', '.join(sorted(oparams))} are not "
                "supported (classification is not available for text)"
            )
    return binary_out


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


# ---- generate extension ---------------------------------------------------------------------------------


def decode_generate_body(raw: bytes) -> tuple[list[DecodedTensor], dict[str, Any], str]:
    """Generate extension: keys naming an input are tensors, `parameters` and any other key are parameters; `id`
    is the request's id, as Triton reads it ("" when none)."""
    body = _json_object(raw, "generate request")
    request_id = body.pop("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' (the request's id) must be a string")
    params = _scalar_params("parameters", body.pop("parameters", None))
    tensors: list[DecodedTensor] = []
    for key, value in body.items():
        spec = INPUTS.get(key)
        if spec is None:
            if key in params:
                raise invalid(f"'{key}' is given both at the top level and in 'parameters'; set it once")
            params[key] = value
            continue
        values = value if isinstance(value, list) else [value]
        if len(values) > element_count(list(spec.dims)):
            raise invalid(f"'{key}' has {len(values)} elements; the input takes {element_count(list(spec.dims))}")
        if key == "sampling_parameters" and len(values) == 1 and isinstance(values[0], dict):
            values = [json.dumps(values[0])]
        want = str if spec.datatype == "BYTES" else bool
        if not all(isinstance(v, want) for v in values):
            raise invalid(
                f"'{key}' must be a {'string' if want is str else 'boolean'}"
                + (" (or a JSON object)" if key == "sampling_parameters" else "")
            )
        tensors.append(DecodedTensor(key, spec.datatype, [len(values)], values))
    return tensors, params, request_id


def sse_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"
