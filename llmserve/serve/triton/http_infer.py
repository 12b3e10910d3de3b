"""KServe v2 HTTP `/infer` for a decoupled model in front of Triton (executionMode embedded).

Triton answers `/infer` only for models that are not decoupled ("HTTP end point doesn't support models with decoupled
transaction policy"); its vLLM backend is decoupled, and llmserve's embedded engine answers `/infer` on the LLM, as
tritonclient.http's `infer()` calls it. For such a model the HTTP proxy decodes the request here (JSON tensors or the
binary tensor extension), sends it as one gRPC ModelInferRequest over a one-request ModelStreamInfer
(`grpc_proxy.one_shot_over_stream`), and writes the model's one response back in KServe v2's HTTP form: JSON data,
or binary data where the request asked for it (an output's `binary_data`, the request's `binary_data_output`).

The conversion is generic over tensors (any datatype, shapes, request/tensor parameters of scalar types), so it
serves any decoupled model that answers a request with one response; every malformed part is a 400 naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from llmserve.serve.kserve.http_codec import binary_part, split_binary
from llmserve.serve.limits import JsonProblem, load_json, short

T = TypeVar("T")

if TYPE_CHECKING:
    from tritonclient.grpc import service_pb2 as pb

# tritonclient (and grpc under it) is imported where a request is converted: importing this module for its error
# type must not load them (the unit tier imports every module that defines one)

HEADER_LENGTH = "inference-header-content-length"
# HTTP-only parameters (the binary tensor extension), not forwarded
BINARY_SIZE, BINARY_OUT, BINARY_ALL = "binary_data_size", "binary_data", "binary_data_output"
DATATYPES = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
DATATYPES |= {"FP16", "FP32", "FP64", "BF16", "BYTES"}


class InferBodyError(ValueError):
    """A request /infer cannot take as it is: answered with a 400 naming the part at fault."""


def _parameters(where: str, given: Any, into: Any) -> None:
    """Scalar KServe parameters -> protobuf InferParameters."""
    if given is None:
        return
    if not isinstance(given, dict):
        raise InferBodyError(f"{where} must be a JSON object")
    for key, value in given.items():
        if isinstance(value, bool):
            into[key].bool_param = value
        elif isinstance(value, int) and -(2**63) <= value < 2**63:
            into[key].int64_param = value
        elif isinstance(value, int) and 0 <= value < 2**64:
            into[key].uint64_param = value  # Triton's sequence_id, for one, is a uint64
        elif isinstance(value, int):
            raise InferBodyError(f"{where}: '{key}' is outside the 64-bit integers")
        elif isinstance(value, float):
            into[key].double_param = value
        elif isinstance(value, str):
            into[key].string_param = value
        else:
            raise InferBodyError(f"{where}: '{key}' must be a number, a boolean or a string, got {short(value)}")


def _flat(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flat(item))
    return out


def _raw_of_json(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """A JSON tensor's data as the raw bytes gRPC carries (BYTES: 4-byte little-endian lengths before each)."""
    from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

    values = _flat(data)
    count = math.prod(shape)
    if len(values) != count:
        raise InferBodyError(f"input '{name}': shape {shape} holds {count} element(s), 'data' has {len(values)}")
    try:
        if datatype == "BYTES":
            if not all(isinstance(v, str) for v in values):
                raise InferBodyError(f"input '{name}': BYTES data must be JSON strings")
            array = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
            serialized = serialize_byte_tensor(array)
            return b"" if serialized is None or serialized.size == 0 else bytes(serialized.item())
        if datatype == "BOOL" and not all(isinstance(v, bool) for v in values):
            raise InferBodyError(f"input '{name}': BOOL data must be JSON booleans")
        number = int if datatype[0] in "UI" else (int, float)  # UINT*/INT* take integers, FP* any number
        if datatype != "BOOL" and not all(isinstance(v, number) and not isinstance(v, bool) for v in values):
            kind = "integers" if number is int else "numbers"
            raise InferBodyError(f"input '{name}': {datatype} data must be JSON {kind}")
        with np.errstate(over="raise"):
            return np.array(values, dtype=triton_to_np_dtype(datatype)).tobytes()
    except (OverflowError, ValueError, TypeError, FloatingPointError) as exc:
        if isinstance(exc, InferBodyError):
            raise
        raise InferBodyError(f"input '{name}': the data does not fit {datatype} ({exc})") from None


def decode_infer_body(
    raw: bytes, header_length: str | None, model: str, version: str
) -> tuple[pb.ModelInferRequest, dict[str, bool], bool]:
    """A KServe v2 HTTP /infer body -> (the gRPC request, outputs' binary_data by name, binary for the others)."""
    from tritonclient.grpc import service_pb2 as pb

    header, binary = _kserve(split_binary, raw, header_length)
    try:
        body = load_json(header)
    except JsonProblem as exc:
        raise InferBodyError(f"the inference request is {exc}") from None
    if not isinstance(body, dict):
        raise InferBodyError("the inference request must be a JSON object")
    if not isinstance(body.get("id", ""), str):
        raise InferBodyError("'id' must be a string")
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=body.get("id", ""))
    params, binary_all = _without("parameters", body.get("parameters"), BINARY_ALL)
    _parameters("parameters", params, request.parameters)
    _add_inputs(request, body.get("inputs"), binary)
    return request, _add_outputs(request, body.get("outputs")), bool(binary_all)


def _kserve(step: Callable[..., T], *args: Any) -> T:
    """One step of the embedded engine's /infer decoding (kserve.http_codec), its refusals as InferBodyError."""
    from llmserve.serve.kserve.errors import KServeError

    try:
        return step(*args)
    except KServeError as exc:
        raise InferBodyError(exc.message) from None


def _without(where: str, params: Any, key: str) -> tuple[Any, Any]:
    """(parameters less the HTTP-only `key`, its value): checked as a boolean, or a size for binary_data_size."""
    if not isinstance(params, dict) or key not in params:
        return params, None
    rest = {k: v for k, v in params.items() if k != key}
    value = params[key]
    if key != BINARY_SIZE and not isinstance(value, bool):
        raise InferBodyError(f"{where}.{key} must be true or false")
    return rest, value


def _add_inputs(request: pb.ModelInferRequest, inputs: Any, binary: bytes) -> None:
    if not isinstance(inputs, list) or not inputs:
        raise InferBodyError("'inputs' must be a non-empty list of tensors")
    offset = 0  # the binary data is claimed in input order
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise InferBodyError(f"inputs[{i}] must be a JSON object with name, datatype, shape and data")
        name, datatype, shape = t.get("name"), t.get("datatype"), t.get("shape")
        if not (
            isinstance(name, str) and isinstance(datatype, str) and datatype in DATATYPES and isinstance(shape, list)
        ):
            raise InferBodyError(
                f"inputs[{i}] needs 'name' (a string), 'datatype' (one of {', '.join(sorted(DATATYPES))}) and "
                "'shape' (a list of integers)"
            )
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise InferBodyError(f"input '{name}': 'shape' must be a list of non-negative integers")
        params, size = _without(f"input '{name}' parameters", t.get("parameters"), BINARY_SIZE)
        if isinstance(params, dict) and any(k.startswith("shared_memory") for k in params):
            raise InferBodyError(
                f"input '{name}': shared-memory tensors are not supported through llmserve's proxy; send the data "
                f"in the request ('data' or parameters.{BINARY_SIZE})"
            )
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        _parameters(f"input '{name}' parameters", params, tensor.parameters)
        if size is not None:
            request.raw_input_contents.append(_kserve(binary_part, name, size, t, binary, offset))
            offset += size
        elif "data" not in t:
            raise InferBodyError(f"input '{name}' has no 'data'")
        elif datatype == "BF16":
            raise InferBodyError(f"input '{name}': send BF16 data as binary ({BINARY_SIZE}), JSON has no bfloat16")
        else:
            request.raw_input_contents.append(_raw_of_json(name, datatype, shape, t["data"]))
    if offset != len(binary):
        raise InferBodyError(f"the body has {len(binary) - offset} binary byte(s) that no input claims")


def _add_outputs(request: pb.ModelInferRequest, outputs: Any) -> dict[str, bool]:
    """The requested outputs onto `request`; their binary_data by name."""
    if outputs is not None and not isinstance(outputs, list):
        raise InferBodyError("'outputs' must be a list")
    binary_by_name: dict[str, bool] = {}
    for i, o in enumerate(outputs or []):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InferBodyError(f"outputs[{i}] must be a JSON object with a 'name'")
        params, wanted = _without(f"output '{o['name']}' parameters", o.get("parameters"), BINARY_OUT)
        if wanted is not None:
            binary_by_name[o["name"]] = wanted
        _parameters(f"output '{o['name']}' parameters", params, request.outputs.add(name=o["name"]).parameters)
    return binary_by_name


def _parameter_value(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _json_data(datatype: str, raw: bytes) -> list[Any]:
    from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

    if datatype == "BYTES":
        values = deserialize_bytes_tensor(raw) if raw else np.array([], dtype=np.object_)
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]
    return [v.item() for v in np.frombuffer(raw, dtype=triton_to_np_dtype(datatype))]


def _raw_output(response: pb.ModelInferResponse, i: int) -> bytes:
    from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

    if i < len(response.raw_output_contents):
        return bytes(response.raw_output_contents[i])
    tensor = response.outputs[i]
    contents = tensor.contents
    if tensor.datatype == "BYTES":
        array = np.array(list(contents.bytes_contents), dtype=np.object_)
        serialized = serialize_byte_tensor(array)
        return b"" if serialized is None or serialized.size == 0 else bytes(serialized.item())
    field = {
        "BOOL": "bool_contents",
        "INT8": "int_contents",
        "INT16": "int_contents",
        "INT32": "int_contents",
        "INT64": "int64_contents",
        "UINT8": "uint_contents",
        "UINT16": "uint_contents",
        "UINT32": "uint_contents",
        "UINT64": "uint64_contents",
        "FP32": "fp32_contents",
        "FP64": "fp64_contents",
    }.get(tensor.datatype)
    if field is None:
        return b""
    return np.array(list(getattr(contents, field)), dtype=triton_to_np_dtype(tensor.datatype)).tobytes()


def encode_infer_response(
    response: pb.ModelInferResponse, binary_by_name: dict[str, bool], binary_all: bool
) -> tuple[bytes, dict[str, str]]:
    """The model's gRPC response -> a KServe v2 HTTP /infer body and its headers."""
    body: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = {k: _parameter_value(v) for k, v in response.parameters.items()}
    outputs, blobs = [], []
    for i, tensor in enumerate(response.outputs):
        out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        params = {k: _parameter_value(v) for k, v in tensor.parameters.items()}
        raw = _raw_output(response, i)
        if binary_by_name.get(tensor.name, binary_all) or tensor.datatype == "BF16":  # JSON has no bfloat16
            params[BINARY_SIZE] = len(raw)
            blobs.append(raw)
        else:
            out["data"] = _json_data(tensor.datatype, raw)
        if params:
            out["parameters"] = params
        outputs.append(out)
    body["outputs"] = outputs
    header = json.dumps(body).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }
